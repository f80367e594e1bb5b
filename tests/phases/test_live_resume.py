"""What a resume reads back: the idempotent-write ids of a live run's tables, with delta-rs and, for logs delta-rs
cannot read, through Delta's JVM classes (an internal API, pinned here); and every write a live micro-batch
makes is one a resume looks for."""

from __future__ import annotations

import ast
from pathlib import Path

from phases.live import resume as live_resume
from phases.storage import table_stats

PHASES = Path(__file__).resolve().parents[2] / "phases"


def test_every_live_write_name_is_one_a_resume_reads_back():
    """A write under a name missing from LIVE_WRITES would be invisible to the resume's check: a lost checkpoint
    could then be resumed over writes no record describes."""
    used = set()
    for path in [*PHASES.glob("operators/*.py"), *PHASES.glob("live/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "app":
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    used.add(arg.value)
                elif isinstance(arg, ast.Call) and getattr(arg.func, "attr", None) == "suffix":
                    base = arg.args[0].value
                    used |= {base, f"{base}_right"}
    used.discard("batch")  # a commit tag (userMetadata), not a transaction
    assert used, "no app(...) call found: the scan no longer matches the code"
    assert used <= set(live_resume.LIVE_WRITES), sorted(used - set(live_resume.LIVE_WRITES))


def test_transaction_ids_read_with_delta_rs_and_through_spark_agree(spark, tmp_path):
    """Pins Delta's internal ``DeltaLog.forTable(SparkSession, String)``, ``SnapshotManagement.update(boolean,
    Option, Option)`` and ``Snapshot.transactions()``: a Delta upgrade that changes them fails here, by name."""
    path = str(tmp_path / "table")
    app = live_resume.app_id("events", "run1", "sink")
    for version in (0, 3):
        (
            spark.range(2)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", app)
            .option("txnVersion", version)
            .save(path)
        )
    other = live_resume.app_id("events", "run1", "state")
    assert table_stats.transaction_versions(path, [app, other]) == {app: 3}
    try:
        through_spark = table_stats.transaction_versions_through_spark(spark, path, [app, other])
    except Exception as exc:  # noqa: BLE001 - name what broke
        raise AssertionError(
            f"Delta's internal DeltaLog.forTable / SnapshotManagement.update / Snapshot.transactions changed: {exc}"
        ) from exc
    assert through_spark == {app: 3}
    assert live_resume.live_writes(spark, path, "events", "run1") == 3
    assert live_resume.live_writes(spark, str(tmp_path / "missing"), "events", "run1") is None
