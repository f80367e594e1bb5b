"""The backlog asset, its blocking checks and the switch sensor, scenario by scenario (real instance,
real Delta tables; the sensor evaluated with build_sensor_context)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from phases._internal.handoff import manifest
from phases._internal.sources.lag import InputLag
from phases_dagster.checks import CHECK_NAMES, NO_FAR_FUTURE
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import CheckPolicy, Names, Orchestration, SwitchPolicy
from phases_dagster.switch import Handoff, decide
from tests import reference
from tests.helpers import append_version, assert_results_equal, sink_rows, write_source
from tests.phases.backlog.test_backlog import DELAY_S, VERSIONS, S
from tests.phases_dagster.conftest import definitions, relative_pipeline

LENIENT = Orchestration(checks=CheckPolicy(max_quarantine_fraction=0.5))


@pytest.fixture
def root(spark, tmp_path) -> str:
    write_source(spark, str(tmp_path / "src"), VERSIONS)
    return str(tmp_path)


def _tick(defs: dg.Definitions, instance, root: str, name: str, cursor: str | None = None):
    sensor = defs.resolve_sensor_def(name)
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"storage": StorageResource(root=root)})
    return sensor.evaluate_tick(ctx)


def _materialize(defs, instance, names: Names, run_config: dict | None = None, ok: bool = True):
    result = defs.resolve_job_def(names.backlog_job).execute_in_process(
        instance=instance, run_config=run_config or {}, raise_on_error=False
    )
    assert result.success is ok
    return result


def test_backlog_asset_reports_the_handoff_and_its_checks_pass(spark, instance, root):
    p = relative_pipeline(delay_s=DELAY_S)
    names, defs = Names(p), definitions(spark, root, p, LENIENT)
    every = {"ops": {names.backlog_op: {"config": {"progress_interval_seconds": 0.1}}}}
    result = _materialize(defs, instance, names, run_config=every)
    # While it ran, the backlog logged its progress: the step, the Spark stage and its tasks.
    lines = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message.startswith("progress: ")]
    assert any(f"{p.name} backlog: " in line and "tasks " in line for line in lines), lines
    meta = result.asset_materializations_for_node(names.backlog_op)[0].metadata
    assert {k: meta[k].value for k in ("source_version", "input_rows", "keys", "late_rows", "invalid_rows")} == {
        "source_version": "3",  # an id: text, not plotted
        "input_rows": 10,
        "keys": 4,
        "late_rows": 2,
        "invalid_rows": 1,
    }
    assert meta["quarantined_rows"].value == 3 and meta["rows_per_s"].value > 0 and meta["duration_s"].value > 0
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {*CHECK_NAMES, NO_FAR_FUTURE}
    assert all(e.passed for e in evaluations.values()), {n: e.metadata for n, e in evaluations.items()}
    assert meta["future_rows"].value == 0
    handoff = manifest.latest(spark, f"{root}/engine/manifests", p.name)
    assert meta["manifest_id"].value == handoff.manifest_id
    assert meta["handoff"].value["final_watermark_us"] == handoff.final_watermark_us  # exact, in the JSON entry
    assert meta["final_watermark"].value == handoff.final_watermark_us / 1e6  # a timestamp for people
    # Catalog metadata of the tables the backlog made: name, schema (the Columns tab), row count.
    sink = result.asset_materializations_for_node(names.backlog_op)
    by_key = {m.asset_key.to_user_string(): m.metadata for m in sink}
    assert set(by_key) == {names.backlog, names.state, names.sink, names.quarantine}
    sink_meta = by_key[names.sink]
    assert sink_meta["dagster/table_name"].value == f"{p.name}.sink"
    assert sink_meta["dagster/row_count"].value == 4
    assert [c.name for c in sink_meta["dagster/column_schema"].value.columns][:1] == ["key"]
    assert by_key[names.quarantine]["dagster/row_count"].value == 3
    assert by_key[names.state]["dagster/row_count"].value == 4


def test_sensor_skips_when_nothing_is_materialized(spark, instance, root):
    p = relative_pipeline(delay_s=DELAY_S)
    data = _tick(definitions(spark, root, p, LENIENT), instance, root, Names(p).switch)
    assert not data.run_requests and "no backlog materialization" in data.skip_message


def test_sensor_launches_live_once_when_caught_up(spark, instance, root):
    p = relative_pipeline(delay_s=DELAY_S)
    names, defs = Names(p), definitions(spark, root, p, LENIENT)
    _materialize(defs, instance, names)
    mid = manifest.latest(spark, f"{root}/engine/manifests", p.name).manifest_id
    data = _tick(defs, instance, root, names.switch)
    [req] = data.run_requests
    assert (req.job_name, req.run_key) == (names.live_job, f"live:{mid}")
    assert req.run_config["ops"][names.live_asset]["config"]["manifest_id"] == mid
    assert json.loads(data.cursor)["launched"] == mid
    again = _tick(defs, instance, root, names.switch, cursor=data.cursor)  # already launched
    assert not again.run_requests and "already launched" in again.skip_message


def test_sensor_requests_a_catch_up_increment_then_switches(spark, instance, root):
    p = relative_pipeline(delay_s=DELAY_S)
    names, defs = Names(p), definitions(spark, root, p, LENIENT)
    _materialize(defs, instance, names)
    first = manifest.latest(spark, f"{root}/engine/manifests", p.name)
    extra = [("a", 70 * S, 10), ("e", 50 * S, 11), ("b", 3 * S, 12)]  # ("b", 3 s) is late
    append_version(spark, f"{root}/src", extra)
    data = _tick(defs, instance, root, names.switch)  # event times of 2026-01-01: far behind now
    [req] = data.run_requests
    assert (req.job_name, req.run_key) == (names.backlog_job, f"catch-up:{first.manifest_id}")
    _materialize(defs, instance, names, req.run_config)
    second = manifest.latest(spark, f"{root}/engine/manifests", p.name)
    assert (second.kind, second.base_manifest_id, second.source_version) == ("increment", first.manifest_id, 4)
    expected, _ = reference.run({**VERSIONS, 4: extra}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, f"{root}/engine/sink"), expected)
    [live] = _tick(defs, instance, root, names.switch).run_requests
    assert live.run_key == f"live:{second.manifest_id}"


def test_sensor_refuses_a_manifest_whose_blocking_checks_failed(spark, instance, root):
    p = relative_pipeline(delay_s=DELAY_S)  # 3 of 10 rows quarantined > the default bound of 1 %
    names, defs = Names(p), definitions(spark, root, p)
    result = _materialize(defs, instance, names, ok=False)
    failed = {e.check_name for e in result.get_asset_check_evaluations() if not e.passed}
    assert failed == {"quarantine_within_bound"}
    data = _tick(defs, instance, root, names.switch)
    assert not data.run_requests
    assert "invalid" in data.skip_message and "quarantine_within_bound" in data.skip_message


def test_sensor_refuses_a_manifest_made_by_another_definition(spark, instance, root):
    p = relative_pipeline(delay_s=DELAY_S)
    names = Names(p)
    _materialize(definitions(spark, root, p, LENIENT), instance, names)
    changed = relative_pipeline(delay_s=DELAY_S + 1)
    data = _tick(definitions(spark, root, changed, LENIENT), instance, root, names.switch)
    assert not data.run_requests and "fingerprint" in data.skip_message


def test_switch_rule_uses_the_watermark_lag_when_the_source_moved_on():
    now = datetime(2026, 5, 1, 12, tzinfo=UTC)
    wm = int((now - timedelta(minutes=3)).timestamp() * 1e6)
    handoff = Handoff("m1", "f", 10, wm, "run")

    def source(behind, unit="versions", watermark=wm):
        return InputLag("source", "s", behind, unit, watermark, None if behind is not None else "no Delta log")

    common = dict(handoff=handoff, fingerprint="f", failed_checks=[], lags=[source(2)], now=now, launched_manifest=None)
    assert decide(lag_threshold=timedelta(minutes=5), **common).action == "live"
    behind = decide(lag_threshold=timedelta(minutes=1), **common)
    assert behind.action == "catch_up" and "versions 11..12" in behind.reason
    assert decide(lag_threshold=timedelta(0), **{**common, "lags": [source(0)]}).action == "live"
    assert decide(lag_threshold=timedelta(0), **{**common, "lags": [source(None)]}).action == "skip"
    assert SwitchPolicy().lag_threshold == timedelta(minutes=10)


def test_switch_rule_waits_while_any_input_is_in_backlog():
    """FLIP-309: a two-input pipeline is in backlog while either input is; a Kafka input may be a few records
    behind (max_records_behind)."""
    now = datetime(2026, 5, 1, 12, tzinfo=UTC)
    fresh = int((now - timedelta(minutes=1)).timestamp() * 1e6)
    stale = int((now - timedelta(hours=5)).timestamp() * 1e6)
    handoff = Handoff("m1", "f", 10, fresh, "run")
    left = InputLag("source", "events", 3, "records", fresh)
    right = InputLag("right source", "r", 4, "versions", stale)
    common = dict(handoff=handoff, fingerprint="f", failed_checks=[], now=now, launched_manifest=None)
    rule = dict(lag_threshold=timedelta(minutes=5))
    assert decide(lags=[left], **common, **rule).action == "live"
    waiting = decide(lags=[left, right], **common, **rule)
    assert waiting.action == "catch_up" and "right source: 4 versions behind" in waiting.reason
    assert decide(lags=[left, InputLag("right source", "r", 0, "versions", stale)], **common, **rule).action == "live"
    stale_left = InputLag("source", "events", 3, "records", stale)
    because = "its source is a topic"
    direct = decide(lags=[stale_left], **common, **rule, no_increments_because=because, max_records_behind=2)
    assert direct.reason.startswith("switching although not caught up") and because in direct.reason
    assert decide(lags=[stale_left], **common, **rule, max_records_behind=3).action == "live"


def test_far_future_records_warn_in_a_check_without_blocking_the_switch(spark, instance, root):
    p = relative_pipeline(delay_s=DELAY_S)
    names, defs = Names(p), definitions(spark, root, p, LENIENT)
    append_version(spark, f"{root}/src", [("a", reference.FAR_FUTURE_US, 1)])  # dated 2099
    result = _materialize(defs, instance, names)
    meta = result.asset_materializations_for_node(names.backlog_op)[0].metadata
    assert meta["future_rows"].value == 1
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    warning = evaluations[NO_FAR_FUTURE]
    assert not warning.passed and warning.severity == dg.AssetCheckSeverity.WARN
    assert warning.metadata["future_rows"].value == 1
    assert all(evaluations[n].passed for n in CHECK_NAMES)
    [req] = _tick(defs, instance, root, names.switch).run_requests
    assert req.job_name == names.live_job


def test_kafka_pipeline_through_dagster_the_sensor_reads_the_topics_lag_from_the_broker(
    spark, instance, kafka, tmp_path
):
    """The factory takes a Kafka pipeline like a Delta one: the backlog asset records the end offsets, and the
    sensor measures the records after them on the broker (no Spark)."""
    import uuid

    from phases._internal.definition import KafkaSource
    from tests.conftest import make_pipeline
    from tests.helpers import produce

    topic = f"dagster-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    produce(kafka.bootstrap_servers, topic, [(i % 2, (f"k{i}", (10 + i) * S, i)) for i in range(6)])
    source = KafkaSource(
        topic=topic, bootstrap_servers=kafka.bootstrap_servers, value_schema="key string, ts timestamp, value bigint"
    )
    p = make_pipeline(source, "engine", delay_s=DELAY_S)
    names, defs = Names(p), definitions(spark, str(tmp_path), p, LENIENT)
    meta = _materialize(defs, instance, names).asset_materializations_for_node(names.backlog_op)[0].metadata
    assert json.loads(meta["source_position"].value)["end"] == {"0": 3, "1": 3}
    assert meta["input_rows"].value == 6

    produce(kafka.bootstrap_servers, topic, [(0, ("late", 20 * S, 1)), (1, ("x", 30 * S, 2)), (1, ("y", 31 * S, 3))])
    [request] = _tick(defs, instance, str(tmp_path), names.switch).run_requests
    reason = request.tags["phases/switch_reason"]
    # Event times of early 2026: the watermark lags by months; the topic's new records go into a catch-up increment.
    assert request.run_key.startswith("catch-up:") and "3 records behind" in reason, reason
    assert reason.startswith("catch-up increment by merging the range's aggregate into the handoff's state, of the "
                             "source's 3 records after the handoff's end offsets"), reason  # fmt: skip

    # The health sensor's probes, without Spark: the topic's head (end offsets, newest event time of each partition)
    # and the sink's freshness from Kafka record timestamps. Nothing is applied yet: 3 records wait.
    from datetime import UTC, datetime, timedelta

    from phases._internal.sources.head import source_heads
    from phases_dagster.handoff_events import read_handoff
    from phases_dagster.health import sink_freshness
    from tests.helpers import ts

    resolved = StorageResource(root=str(tmp_path)).placement(p)
    [head] = source_heads(resolved)
    assert head.end_offsets == {0: 4, 1: 5} and head.position == "0:4,1:5" and head.rows == 9
    assert head.max_event_time == ts(31 * S)  # the newest record of partition 1 ("y", 31 s)
    handoff = read_handoff(instance, dg.AssetKey(names.backlog))
    now = datetime.now(UTC)
    stale = sink_freshness(resolved, handoff, timedelta(0), "not started", now + timedelta(seconds=1))
    assert not stale.passed and stale.metadata["behind"] == 3 and stale.metadata["lag_s"] > 0, stale
    assert sink_freshness(resolved, handoff, timedelta(hours=1), "not started", now).passed


def test_switch_rule_words_checks_not_run_yet_and_a_changed_definition_without_misleading():
    """During a backlog run the sensor called its manifest "invalid: checks not passed (planned)" before the checks
    ran; after a deploy of changed code it advised materializing the backlog again, where a running pipeline takes the
    change with its redeploy job."""
    now = datetime(2026, 5, 1, 12, tzinfo=UTC)
    handoff = Handoff("m1", "f", 10, None, "run")
    common = dict(handoff=handoff, lags=[], now=now, launched_manifest=None, lag_threshold=timedelta(minutes=5))
    planned = decide(fingerprint="f", failed_checks=["state_keys_unique (planned)"], **common)
    assert planned.action == "skip" and "invalid" not in planned.reason and "waiting" in planned.reason
    failed = decide(fingerprint="f", failed_checks=["state_keys_unique (failed)"], **common)
    assert "invalid" in failed.reason
    changed = decide(fingerprint="g", failed_checks=[], **common)
    assert "invalid" not in changed.reason and "redeploy job" in changed.reason
