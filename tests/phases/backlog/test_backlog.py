"""The backlog phase: a blocking batch job with no streaming checkpoint, grouped by key, crash-safe."""

from __future__ import annotations

import os

import pytest
from pyspark.sql import functions as F

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Aggregation, KeyedAggregate
from phases._internal.errors import DefinitionError, ManifestError, PhaseStateError, SourceError
from phases._internal.handoff import manifest
from phases._internal.live.runner import LiveRunner
from phases._internal.runtime.session import ADAPTIVE_EXECUTION, adaptive_execution_off
from phases._internal.sources import synthetic
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import (
    assert_results_equal,
    create_source,
    quarantine_rows,
    sink_rows,
    write_source,
)

S = 1_000_000
VERSIONS = {
    1: [("a", 10 * S, 1), ("b", 12 * S, 2), ("a", 11 * S, 3), (None, 12 * S, 4)],
    2: [("c", 40 * S, 5), ("a", 2 * S, 6), ("b", 39 * S, None)],  # ("a", 2s) is late: W = 12 - 5 = 7 s
    3: [("a", 60 * S, 7), ("d", 45 * S, 8), ("c", 30 * S, 9)],  # ("c", 30s) is late: W = 40 - 5 = 35 s
}
DELAY_S = 5


@pytest.fixture
def source(spark, tmp_path):
    path = str(tmp_path / "source")
    write_source(spark, path, VERSIONS)
    return path


def test_backlog_results_match_the_reference_and_take_no_streaming_checkpoint(spark, tmp_path, source):
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    handoff = BacklogRunner(spark, p).run()
    expected, expected_q = reference.run(VERSIONS, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert quarantine_rows(spark, p.locations.root) == sorted(expected_q, key=repr)
    assert not os.path.exists(p.locations.checkpoints)
    assert (handoff.source_version, handoff.state_rows, handoff.late_rows, handoff.invalid_rows) == (3, 4, 2, 1)
    assert handoff.backlog_max_event_time_us is not None
    assert handoff.final_watermark_us == handoff.backlog_max_event_time_us - DELAY_S * S


def test_backlog_state_holds_one_row_per_key(spark, tmp_path):
    path = str(tmp_path / "source")
    create_source(spark, path)
    synthetic.append(spark, path, synthetic.event_batch(spark, rows=3000, keys=97, batch_index=0))
    p = make_pipeline(path, str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    state = spark.read.format("delta").load(manifest.latest(spark, p.locations.manifests, p.name).state_path)
    assert state.count() == state.select("key").distinct().count() == 97


def test_the_backlog_leaves_the_sessions_adaptive_execution_as_it_found_it(spark, tmp_path, source):
    """The keyed handoff plans and writes its cached state without adaptive execution: the session's own setting
    is back after the backlog, and after a write that failed."""
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    BacklogRunner(spark, p).run()
    assert spark.conf.get(ADAPTIVE_EXECUTION) == "true"
    spark.conf.set(ADAPTIVE_EXECUTION, "false")
    try:
        with pytest.raises(RuntimeError), adaptive_execution_off(spark):
            assert spark.conf.get(ADAPTIVE_EXECUTION) == "false"
            raise RuntimeError("a write failed")
        assert spark.conf.get(ADAPTIVE_EXECUTION) == "false"
    finally:
        spark.conf.set(ADAPTIVE_EXECUTION, "true")
    with pytest.raises(RuntimeError), adaptive_execution_off(spark):
        raise RuntimeError("a write failed")
    assert spark.conf.get(ADAPTIVE_EXECUTION) == "true"


def test_crash_before_the_manifest_leaves_none_and_a_rerun_does_not_duplicate(spark, tmp_path, source, monkeypatch):
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)

    def crash(*args, **kwargs):
        raise RuntimeError("crash before the manifest")

    monkeypatch.setattr(manifest, "write", crash)
    with pytest.raises(RuntimeError, match="crash before the manifest"):
        BacklogRunner(spark, p).run()
    monkeypatch.undo()
    with pytest.raises(ManifestError, match="run the backlog"):
        LiveRunner.from_manifest(spark, p)
    BacklogRunner(spark, p).run()
    expected, expected_q = reference.run(VERSIONS, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert spark.read.format("delta").load(p.sink.path).count() == len(expected)
    assert quarantine_rows(spark, p.locations.root) == sorted(expected_q, key=repr)


def test_backlog_refuses_to_run_again_after_the_switch_unless_reset(spark, tmp_path, source):
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    BacklogRunner(spark, p).run()
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    with pytest.raises(PhaseStateError, match="has switched to live .* with reset=True"):
        BacklogRunner(spark, p).run()
    BacklogRunner(spark, p).run(reset=True)
    expected, _ = reference.run(VERSIONS, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)


def test_backlog_cut_off_at_an_earlier_version(spark, tmp_path, source):
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    handoff = BacklogRunner(spark, p).run(end_version=2)
    expected, _ = reference.run({v: r for v, r in VERSIONS.items() if v <= 2}, DELAY_S * S)
    assert handoff.source_version == 2
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    with pytest.raises(SourceError, match="outside the source's versions 0..3"):
        BacklogRunner(spark, p).run(end_version=9)


def test_configuration_errors_name_the_column_and_the_rule(spark, tmp_path, source):
    root = str(tmp_path / "run")
    bad_col = KeyedAggregate(aggregations=[Aggregation(name="s", kind="sum", column="amount")])
    with pytest.raises(DefinitionError, match="column 'amount' is not in the source"):
        BacklogRunner(spark, make_pipeline(source, root, operator=bad_col)).run()
    bad_type = KeyedAggregate(aggregations=[Aggregation(name="s", kind="sum", column="key")])
    with pytest.raises(DefinitionError, match="column 'key' is string; sum needs one of"):
        BacklogRunner(spark, make_pipeline(source, root, operator=bad_type)).run()
    with pytest.raises(DefinitionError, match="event_time column 'value' must be a timestamp"):
        BacklogRunner(spark, make_pipeline(source, root, event_time="value")).run()
    plain = str(tmp_path / "no_cdf")
    spark.range(3).withColumn("ts", F.current_timestamp()).write.format("delta").save(plain)
    with pytest.raises(SourceError, match="change data feed"):
        BacklogRunner(spark, make_pipeline(plain, root)).run()


# Versions in event-time order (each later than the earlier ones' max minus the delay), with microseconds
# inside the logged milliseconds: the log proves every record on time.
ORDERED = {
    1: [("a", 10 * S + 1, 1), ("b", 12 * S + 999, 2)],
    2: [("a", 13 * S, 3), ("c", 20 * S + 500, 4)],
    3: [("b", 30 * S + 123, 5), ("d", 30 * S + 777, 6)],
}


def test_backlog_of_versions_the_log_proves_on_time_skips_the_scan_and_hands_off_the_exact_maximum(
    spark, tmp_path, monkeypatch
):
    from phases._internal.sources import version_bounds
    from phases._internal.sources.delta import DeltaTableSource

    path = str(tmp_path / "source")
    write_source(spark, path, ORDERED)
    proved = BacklogRunner(spark, make_pipeline(path, str(tmp_path / "log"), delay_s=DELAY_S))
    snapshots = []
    read_appended = DeltaTableSource.read_appended
    monkeypatch.setattr(
        DeltaTableSource, "read_appended", lambda self, end: snapshots.append(end) or read_appended(self, end)
    )
    handoff = proved.run()
    assert proved.timings.get("statistics_from_log") == 1.0
    assert snapshots == [3]  # versions 0..3 appended only: read as the snapshot at 3, not through the change feed
    expected, expected_q = reference.run(ORDERED, DELAY_S * S)
    assert expected_q == []
    assert_results_equal(sink_rows(spark, proved.placement.sink_path), expected)
    assert handoff.backlog_max_event_time_us % 1000 == 777  # exact, below the millisecond the log keeps

    same = ("backlog_max_event_time_us", "final_watermark_us", "state_rows", "aggregated_rows", "late_rows")
    # The top millisecond read through Spark, as where delta-rs cannot read the files (column mapping, a store's
    # settings given to Spark only).
    monkeypatch.setattr(version_bounds, "exact_max_us", lambda *args: None)
    through_spark = BacklogRunner(spark, make_pipeline(path, str(tmp_path / "spark"), delay_s=DELAY_S))
    assert {f: getattr(through_spark.run(), f) for f in same} == {f: getattr(handoff, f) for f in same}
    assert through_spark.timings.get("statistics_from_log") == 1.0

    monkeypatch.setattr(DeltaTableSource, "log_bounds", lambda self, *args: None)  # the scan, as before
    scanned = BacklogRunner(spark, make_pipeline(path, str(tmp_path / "scan"), delay_s=DELAY_S))
    reference_handoff = scanned.run()
    assert "statistics_from_log" not in scanned.timings
    assert_results_equal(sink_rows(spark, scanned.placement.sink_path), expected)
    assert {f: getattr(handoff, f) for f in same} == {f: getattr(reference_handoff, f) for f in same}


def test_a_first_backlogs_quarantine_rows_make_the_table_in_one_write_with_its_schema(spark, tmp_path, source):
    # A create, then a replaceWhere that had nothing to delete from the new table: six Spark jobs and two commits. With
    # no table, there is no earlier row to replace: one append makes it, with the schema the create gives it.
    from phases._internal.storage import quarantine
    from tests.phases.storage.test_tables import _metadata, _operations

    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    BacklogRunner(spark, p).run()
    made = tmp_path / "run" / "quarantine"
    assert _operations(made) == ["WRITE"]
    quarantine.ensure(spark, str(tmp_path / "created"))
    assert _metadata(made)["schemaString"] == _metadata(tmp_path / "created")["schemaString"]
    _, expected_q = reference.run(VERSIONS, DELAY_S * S)
    assert quarantine_rows(spark, p.locations.root) == sorted(expected_q, key=repr)


def test_backlog_with_a_late_record_is_not_proved_by_the_log(spark, tmp_path, source):
    runner = BacklogRunner(spark, make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S))
    runner.run()
    assert "statistics_from_log" not in runner.timings


def test_a_key_made_by_a_record_step_is_refused_at_definition_naming_the_rule(tmp_path):
    from phases._internal.definition import Derive

    with pytest.raises(DefinitionError, match=r"key_columns \['user'\] are made by a record step \(Derive\)"):
        make_pipeline("src", str(tmp_path), key_columns=["user"], steps=[Derive(name="user", expression="upper(key)")])
    with pytest.raises(DefinitionError, match=r"event_time \['at'\] are made by a record step"):
        make_pipeline("src", str(tmp_path), event_time="at", steps=[Derive(name="at", expression="ts")])


@pytest.mark.parametrize(
    ("fields", "column"),
    [
        ({"key_columns": ["user_id"]}, "user_id"),
        ({"event_time": "at"}, "at"),
        ({"operator": KeyedAggregate(aggregations=[Aggregation(name="s", kind="sum", column="nope")])}, "nope"),
    ],
)
def test_a_column_missing_from_the_source_at_run_time_is_an_engine_error_naming_it(
    spark, tmp_path, source, fields, column
):
    from phases._internal.errors import PhasesError

    p = make_pipeline(source, str(tmp_path / "run"), **fields)
    with pytest.raises(PhasesError, match=f"'{column}'") as refused:
        BacklogRunner(spark, p).run()
    assert "AnalysisException" not in str(refused.value) and "columns" in str(refused.value)
