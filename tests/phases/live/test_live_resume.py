"""What a resume reads back: the idempotent-write ids of a live run's tables, with delta-rs and, for logs delta-rs
cannot read, through Delta's JVM classes (an internal API, pinned here); and every write a live micro-batch
makes is one a resume looks for."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from phases._internal.storage import live_writes, table_stats, tables

PHASES = Path(__file__).resolve().parents[3] / "phases" / "_internal"


def test_every_live_write_name_is_one_a_resume_reads_back():
    """A write under a name missing from LIVE_WRITES would be invisible to the resume's check: a lost checkpoint
    could then be resumed over writes no record describes."""
    writes = {"append_once", "append_owned", "sink_upsert", "app"}  # BatchWrites' methods; the name comes last
    used = set()
    for path in [*PHASES.glob("operators/*.py"), *PHASES.glob("live/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in writes and node.args:
                arg = node.args[-1]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    used.add(arg.value)
                elif isinstance(arg, ast.Call) and getattr(arg.func, "attr", None) == "suffix":
                    base = arg.args[0].value
                    used |= {base, f"{base}_right"}
    assert {"sink", "upsert", "pending", "quarantine"} <= used, f"the scan no longer matches the code: {used}"
    assert used <= set(live_writes.LIVE_WRITES), sorted(used - set(live_writes.LIVE_WRITES))


def test_transaction_ids_read_with_delta_rs_and_through_spark_agree(spark, tmp_path):
    """Pins Delta's internal ``DeltaLog.forTable(SparkSession, String)``, ``SnapshotManagement.update(boolean,
    Option, Option)`` and ``Snapshot.transactions()``: a Delta upgrade that changes them fails here, by name."""
    path = str(tmp_path / "table")
    app = live_writes.app_id("events", "run1", "sink")
    for version in (0, 3):
        (
            spark.range(2)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", app)
            .option("txnVersion", version)
            .save(path)
        )
    other = live_writes.app_id("events", "run1", "state")
    assert table_stats.transaction_versions(path, [app, other]) == {app: 3}
    try:
        through_spark = table_stats.transaction_versions_through_spark(spark, path, [app, other])
    except Exception as exc:  # noqa: BLE001 - name what broke
        raise AssertionError(
            f"Delta's internal DeltaLog.forTable / SnapshotManagement.update / Snapshot.transactions changed: {exc}"
        ) from exc
    assert through_spark == {app: 3}
    assert live_writes.live_writes(spark, path, "events", "run1") == 3
    assert live_writes.live_writes(spark, str(tmp_path / "missing"), "events", "run1") is None


def test_a_marked_sink_write_is_read_back_past_maintenance_commits_and_not_past_other_writes(spark, tmp_path):
    """The sink's writes carry (app id, batch) in the commit's userMetadata, not Delta's txnAppId: the newest
    commit that changed rows names the run's newest write; OPTIMIZE and property changes after it are read past;
    a write without the mark (the handoff's) means the run wrote nothing since; another run's mark is not this
    run's. Read with delta-rs and through Spark alike."""
    path = str(tmp_path / "sink")
    spark.range(3).write.format("delta").save(path)  # the handoff's rows
    assert live_writes.live_writes(spark, path, "events", "run1") is None
    for batch in (4, 5):
        tables.append_marked(spark.range(2), path, live_writes.app_id("events", "run1", "sink"), batch)
    spark.sql(f"OPTIMIZE delta.`{path}`")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.autoOptimize.autoCompact' = 'true')")
    assert live_writes.live_writes(spark, path, "events", "run1") == 5
    commits = table_stats._history_pages_through_spark(spark, path)
    app_ids = [live_writes.app_id("events", "run1", w) for w in live_writes.LIVE_WRITES]
    assert table_stats.newest_marked_write(commits, app_ids) == (live_writes.app_id("events", "run1", "sink"), 5)
    assert live_writes.live_writes(spark, path, "events", "run2") is None
    spark.range(1).write.format("delta").mode("append").save(path)  # a write without the mark
    assert live_writes.live_writes(spark, path, "events", "run1") is None


def test_only_a_query_s_first_micro_batch_reads_the_sink_before_writing(spark, tmp_path, monkeypatch):
    """A replayed first micro-batch finds its write and skips it; a later micro-batch never reads the log."""
    path = str(tmp_path / "sink")
    spark.range(3).write.format("delta").save(path)
    first = live_writes.BatchWrites(spark, "events", "run1", 7, first=True)
    first.append_owned(spark.range(2), path, "sink")
    first.append_owned(spark.range(2), path, "sink")  # the replay: skipped
    assert spark.read.format("delta").load(path).count() == 5
    monkeypatch.setattr(live_writes, "live_writes", lambda *a: pytest.fail("a later micro-batch read the log"))
    live_writes.BatchWrites(spark, "events", "run1", 8, first=False).append_owned(spark.range(2), path, "sink")
    assert spark.read.format("delta").load(path).count() == 7
