"""A source whose change data feed was turned on after it was created: the backlog names the first version
with a feed and the way out (``starting_version``); with it, versions before are one snapshot (one arrival)
and the pipeline runs both phases, equal to the reference over that arrival order."""

from __future__ import annotations

import pytest

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import DeltaSource
from phases._internal.errors import PhaseStateError, SourceError
from phases._internal.live.runner import LiveRunner
from phases._internal.sources.feed import EVENT_SCHEMA
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, quarantine_rows, sink_rows, ts
from tests.phases.live.test_live import DELAY_S, S

BEFORE_FEED = {0: [("a", 100 * S, 1)], 1: [("b", 90 * S, 2), ("a", 50 * S, 3)]}  # a at 50 s: late if apart


def _late_feed_source(spark, path: str) -> None:
    """Versions 0 and 1 without a change feed, version 2 turns it on, version 3 has a record."""
    for v in sorted(BEFORE_FEED):
        rows = [(k, ts(t), val) for k, t, val in BEFORE_FEED[v]]
        spark.createDataFrame(rows, EVENT_SCHEMA).write.format("delta").mode("append").save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    append_version(spark, path, [("a", 200 * S, 4)])


def test_a_feed_turned_on_later_is_refused_with_its_first_version_and_the_way_out(spark, tmp_path):
    source = str(tmp_path / "source")
    _late_feed_source(spark, source)
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    with pytest.raises(SourceError) as err:
        BacklogRunner(spark, p).run()
    msg = str(err.value)
    assert "only from version 2" in msg and "starting_version=2" in msg and "one snapshot of version 1" in msg
    with pytest.raises(SourceError, match="starting_version=2"):
        LiveRunner.streaming_only(spark, p)


def test_with_starting_version_the_versions_before_are_one_arrival(spark, tmp_path):
    source = str(tmp_path / "source")
    _late_feed_source(spark, source)
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S).model_copy(
        update={"source": DeltaSource(path=source, starting_version=2)}
    )
    handoff = BacklogRunner(spark, p).run()
    assert handoff.source_version == 3 and handoff.late_rows == 0  # a at 50 s arrived with a at 100 s
    append_version(spark, source, [("b", 60 * S, 5), ("c", 210 * S, 6)])  # W = 200 s - 15 s: b is late
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    arrivals = {1: BEFORE_FEED[0] + BEFORE_FEED[1], 3: [("a", 200 * S, 4)], 4: [("b", 60 * S, 5), ("c", 210 * S, 6)]}
    expected, expected_q = reference.run(arrivals, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert quarantine_rows(spark, str(tmp_path / "run")) == sorted(expected_q, key=repr)
    assert p.fingerprint() != make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S).fingerprint()
    with pytest.raises(PhaseStateError, match="one snapshot"):
        LiveRunner.streaming_only(spark, p)


def test_starting_version_is_a_source_setting_that_keeps_earlier_fingerprints(tmp_path):
    assert DeltaSource(path="s").model_dump() == {"kind": "delta", "path": "s"}
    assert DeltaSource(path="s", starting_version=4).model_dump()["starting_version"] == 4


def test_a_vacuumed_version_the_backlog_needs_is_named_with_the_way_out(spark, tmp_path):
    """Versions whose files a compaction replaced and VACUUM then removed: the change feed of those versions
    cannot be read. The backlog says which version, that VACUUM (or a hand) removed its file, and what to do,
    instead of Spark's FILE_NOT_EXIST."""
    from phases._internal.storage import tables
    from tests.helpers import write_source

    source = str(tmp_path / "source")
    write_source(spark, source, {1: [("a", 100 * S, 1)], 2: [("b", 90 * S, 2)], 3: [("c", 95 * S, 3)]})
    spark.sql(f"OPTIMIZE delta.`{source}`")  # version 4: one file replaces versions 1..3's
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{source}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    with pytest.raises(SourceError) as refused:
        BacklogRunner(spark, p).run()
    message = str(refused.value)
    assert f"source {source}: version " in message and "of its change feed can no longer be read" in message
    assert any(f"version {v} of its change feed" in message for v in (1, 2, 3)), message
    head = tables.version(spark, source)  # OPTIMIZE, then VACUUM's start and end commits
    assert "VACUUM" in message and "starting_version=N" in message and f"N = {head + 1} works" in message


def test_a_source_without_its_change_feed_or_without_a_table_is_refused_naming_the_way_out(spark, tmp_path):
    """The source check reads the table's properties from its log (delta-rs): a table whose feed is off is refused
    with the ALTER TABLE that turns it on, a path with no table as such; the way out, taken, lets the check pass."""
    from phases._internal.sources.delta import DeltaTableSource

    missing = str(tmp_path / "nothing")
    with pytest.raises(SourceError, match="is not a Delta table"):
        DeltaTableSource(spark, DeltaSource(path=missing), missing).check()
    path = str(tmp_path / "source")
    spark.createDataFrame([("a", ts(1 * S), 1)], EVENT_SCHEMA).write.format("delta").save(path)
    source = DeltaTableSource(spark, DeltaSource(path=path), path)
    with pytest.raises(SourceError) as refused:
        source.check()
    way_out = f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    assert way_out in str(refused.value)
    spark.sql(way_out)
    source.check()
