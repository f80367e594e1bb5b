"""The live phase: refuses bad manifests, checkpoints at the switch, restarts without double counting,
quarantines late and invalid records."""

from __future__ import annotations

import os

import pytest
from pyspark.sql import functions as F

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Aggregation, KeyedAggregate
from phases._internal.errors import ManifestError
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, create_source, sink_rows, us_of

S = 1_000_000
DELAY_S = 15
BACKLOG = {1: [("a", 100 * S, 1), ("b", 90 * S, 2)], 2: [("a", 110 * S, 3)]}
LIVE = {3: [("a", 80 * S, 4), ("b", 96 * S, 5), ("c", 120 * S, 6)], 4: [("b", 200 * S, 7), (None, 130 * S, 8)]}


@pytest.fixture
def started(spark, tmp_path):
    source = str(tmp_path / "source")
    create_source(spark, source)
    for v in sorted(BACKLOG):
        append_version(spark, source, BACKLOG[v])
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    BacklogRunner(spark, p).run()
    return p


def test_live_refuses_to_start_without_a_manifest(spark, tmp_path):
    source = str(tmp_path / "source")
    create_source(spark, source)
    with pytest.raises(ManifestError, match="no handoff manifest for pipeline 'events'.*run the backlog"):
        LiveRunner.from_manifest(spark, make_pipeline(source, str(tmp_path / "run")))


def test_live_refuses_a_manifest_of_a_different_definition_and_says_what_differs(spark, started):
    changed = started.model_copy(
        update={"operator": KeyedAggregate(aggregations=[Aggregation(name="n", kind="max", column="value")])}
    )
    with pytest.raises(ManifestError) as err:
        LiveRunner.from_manifest(spark, changed)
    msg = str(err.value)
    assert "operator.aggregations.length: manifest 7, pipeline 1" in msg
    assert "operator.aggregations.0.kind: manifest 'count', pipeline 'max'" in msg
    delayed = started.model_copy(update={"watermark_delay": started.watermark_delay * 2})
    with pytest.raises(ManifestError, match="watermark_delay_us: manifest 15000000, pipeline 30000000"):
        LiveRunner.from_manifest(spark, delayed)


def test_live_refuses_a_state_table_that_does_not_match_the_manifest(spark, started):
    live = LiveRunner.from_manifest(spark, started)
    extra = spark.read.format("delta").load(live.state_path).limit(1).collect()
    spark.createDataFrame(extra, live.logic.buffer_schema).write.format("delta").mode("append").save(live.state_path)
    with pytest.raises(ManifestError, match="manifest says version 0 with 2 rows, the table has version 1 with 3"):
        LiveRunner.from_manifest(spark, started)


def test_switch_commits_a_checkpoint_before_any_live_data_and_restarts_never_double_count(spark, started):
    source = started.source.path
    live = LiveRunner.from_manifest(spark, started)
    first = live.start()
    assert os.path.exists(f"{live.checkpoints}/increment/commits/0"), "no immediate checkpoint at the switch"
    assert first.start_seconds > 0
    assert live.status()["live"]["watermark"] is not None
    live.stop()

    # Crash right after the switch, before new data: the restart must not apply the state again.
    live = LiveRunner.from_manifest(spark, started)
    live.start()
    live.process_available()
    expected, _ = reference.run(BACKLOG, DELAY_S * S)
    assert_results_equal(sink_rows(spark, started.sink.path), expected)

    append_version(spark, source, LIVE[3])
    live.process_available()
    live.stop()
    append_version(spark, source, LIVE[4])
    live = LiveRunner.from_manifest(spark, started)  # restart after new data
    live.start()
    live.process_available()
    live.stop()
    expected, _ = reference.run({**BACKLOG, **LIVE}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, started.sink.path), expected)


def test_late_and_invalid_live_records_are_quarantined_with_reason_and_watermark(spark, started):
    for v in sorted(LIVE):
        append_version(spark, started.source.path, LIVE[v])
    LiveRunner.from_manifest(spark, started).start(available_now=True)
    rows = spark.read.format("delta").load(started.locations.quarantine).filter(F.col("phase") == "live").collect()
    by_reason = {r["reason"]: r for r in rows}
    assert set(by_reason) == {"late: event time <= watermark", "null key column 'key'"}
    late = by_reason["late: event time <= watermark"]
    # W(3) = max event time of versions 1..2 (110 s) - 15 s = 95 s; the record at 80 s is late, 96 s is not.
    assert us_of(late["watermark"]) == 95 * S and us_of(late["event_time"]) == 80 * S
    assert late["source_version"] == 3 and late["batch_id"] is not None
    assert '"key":"a"' in late["record"]
    # An invalid record keeps its null fields and gets the watermark in force for its version:
    # W(4) = max event time of versions 1..3 (120 s) - 15 s.
    invalid = by_reason["null key column 'key'"]
    assert '"key":null' in invalid["record"] and us_of(invalid["watermark"]) == 105 * S


def test_a_stopped_live_phase_unloads_its_state_store_from_the_executors(spark, started):
    live = LiveRunner.from_manifest(spark, started)
    live.start()
    append_version(spark, started.source.path, LIVE[3])
    live.process_available()
    store = live.incremental.step.store(spark).store  # the opening the micro-batches used
    live.stop()
    # Stopping unloaded it (its newest snapshot uploaded first): nothing of it is loaded any more.
    assert store.unload() == 0
    # A restart opens the store again and goes on from where the stopped run was.
    append_version(spark, started.source.path, LIVE[4])
    live = LiveRunner.from_manifest(spark, started)
    live.start()
    live.process_available()
    live.stop()
    expected, _ = reference.run({**BACKLOG, **LIVE}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, started.sink.path), expected)


def test_a_start_returns_once_what_waits_is_applied_without_an_idle_trigger(spark, started):
    """The start's drain ends when every version there at the start is applied and Spark's checkpoint committed it,
    not at a later trigger that finds nothing new: with a trigger interval of an hour, that trigger comes an hour
    on. (The start runs in a thread, and the test fails when it has not returned long before that.)"""
    import threading
    from datetime import timedelta

    hourly = started.model_copy(update={"checkpoint_interval": timedelta(hours=1)})
    append_version(spark, hourly.source.path, LIVE[3])
    live = LiveRunner.from_manifest(spark, hourly)
    done = threading.Event()
    failure: list[BaseException] = []

    def start() -> None:
        try:
            live.start()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=start, daemon=True).start()
    try:
        assert done.wait(120), "the start waited for the next trigger (an hour on) after applying what waited"
        assert not failure, failure
        assert os.path.exists(f"{live.checkpoints}/increment/commits/0")
        assert live.status()["live"]["source_version"] == 3
        expected, _ = reference.run({**BACKLOG, 3: LIVE[3]}, DELAY_S * S)
        assert_results_equal(sink_rows(spark, hourly.sink.path), expected)
    finally:
        live.stop()
