"""Nothing grows without bound: orphaned state tables are removed, the engine's tables are compacted and
their old files vacuumed, under the pipeline's :class:`~phases._internal.definition.Maintenance` settings.

- **Orphans**: a backlog that crashed before its manifest leaves ``state/<id>`` (and ``live/<id>/state-store``)
  that nothing references.
  Every full backlog run removes the state tables no manifest names, while it holds the backlog lease and
  only when no other pipeline's backlog is running under the same root.
- **Compaction**: an upserted sink, which the live phase rewrites every micro-batch, gets Delta's auto
  compaction (``delta.autoOptimize.autoCompact``): it runs in the writer's own commits, so it never conflicts
  with them. A changelog sink is bin-packed by its background compaction instead, off the micro-batch path
  (:func:`phases._internal.storage.changelog.tidy`). :func:`maintain_tables` compacts the append-only tables
  (quarantine, manifests, live progress) with ``OPTIMIZE``.
- **Retention**: :func:`maintain_tables` vacuums every engine table and the sink with ``Maintenance.retain``. Delta
  refuses a retention below its safety interval (7 days) unless told otherwise, so files a reader or a
  streaming checkpoint may still need stay. A manifest never needs an old table version: once its live
  phase started, the state table belongs to the live phase.

:func:`phases._internal.deployment.maintain` (``phases.maintain``) runs both for a definition, and removes the
generations a redeploy retired longer than the retention ago.
"""

from __future__ import annotations

import re

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from phases._internal.placement import Placement
from phases._internal.storage import fs, table_stats, tables

_MANIFEST_ID = re.compile(r"^[0-9a-f]{32}$")


def remove_orphan_state(spark: SparkSession, where: Placement) -> list[str]:
    """Deletes the state tables under ``state_root`` that no manifest names; returns their paths. Call it
    only while holding the pipeline's backlog lease."""
    root = where.engine_root.rstrip("/")
    others = [n for n in fs.list_names(spark, f"{root}/leases") if n.endswith(".backlog.json")]
    if any(n != f"{where.name}.backlog.json" for n in others):
        return []  # another pipeline's backlog under this root may be writing its state table right now
    live_root = where.live_root.rstrip("/")
    names = [n for n in fs.list_names(spark, where.state_root) if _MANIFEST_ID.match(n)]
    runs = [n for n in fs.list_names(spark, live_root) if _MANIFEST_ID.match(n)]
    if not names and not runs:
        return []
    referenced = _manifest_ids(spark, where.manifests)
    removed = []
    # A crashed backlog's state table, and the live run folder it started (its state store's version 1).
    for folder, found in ((where.state_root.rstrip("/"), names), (live_root, runs)):
        for name in found:
            if name not in referenced:
                path = f"{folder}/{name}"
                fs.delete(spark, path)
                removed.append(path)
    return removed


def _manifest_ids(spark: SparkSession, manifests: str) -> set[str]:
    """Every manifest id the manifests table holds (any pipeline's). Read with delta-rs, from that column alone: a
    Spark read of the table was four jobs and 0.25-0.45 s of every full backlog. A log delta-rs cannot read (store
    settings given to Spark only) is read through Spark."""
    if not tables.exists(spark, manifests):
        return set()
    counted = table_stats.from_log(lambda p: table_stats.value_counts(p, "manifest_id"), manifests)
    if counted is not None:
        return set(counted)
    return {r["manifest_id"] for r in spark.read.format("delta").load(manifests).select("manifest_id").collect()}


def enable_auto_compaction(spark: SparkSession, *paths: str) -> None:
    """Turns on Delta's auto compaction for tables rewritten by every live micro-batch. A table that has it already
    gets no commit (a property change is one, and every live start asks)."""
    for path in paths:
        if not tables.exists(spark, path):
            continue
        current = table_stats.from_log(table_stats.properties, path) or {}  # unreadable by delta-rs: set it again
        if current.get(_AUTO_COMPACT) == "true":
            continue
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{_AUTO_COMPACT}' = 'true')")


_AUTO_COMPACT = "delta.autoOptimize.autoCompact"


def _live_tables(spark: SparkSession, where: Placement) -> list[str]:
    live = where.live_root.rstrip("/")
    return [
        f"{live}/{run}/{what}"
        for run in fs.list_names(spark, live)
        for what in ("progress", "pending", "pending_right")
        if tables.exists(spark, f"{live}/{run}/{what}")
    ]


def maintain_tables(spark: SparkSession, where: Placement) -> dict[str, dict]:
    """Compacts the append-only engine tables and vacuums every engine table and the sink of the placed pipeline
    with its retention. Returns, per table, the files ``OPTIMIZE`` removed and whether it was vacuumed."""
    append_only = [where.quarantine, where.manifests, *_live_tables(spark, where)]
    state_tables = [f"{where.state_root.rstrip('/')}/{n}" for n in fs.list_names(spark, where.state_root)]
    hours = where.definition.maintenance.retain.total_seconds() / 3600
    report: dict[str, dict] = {}
    for path in [*append_only, *state_tables, where.sink_path]:
        if not tables.exists(spark, path):
            continue
        entry: dict = {}
        if path in append_only:
            metrics = spark.sql(f"OPTIMIZE delta.`{path}`").select("metrics.numFilesRemoved").collect()
            entry["compacted_files"] = int(metrics[0][0] or 0) if metrics else 0
        spark.sql(f"VACUUM delta.`{path}` RETAIN {hours:g} HOURS")
        entry["vacuumed"] = True
        entry["files"] = int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").select(F.col("numFiles")).collect()[0][0])
        report[path] = entry
    return report
