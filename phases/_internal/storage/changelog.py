"""A keyed aggregation's changelog sink (``DeltaSink.mode == "changelog"``): what a micro-batch appends, how the
compacted current table follows it, and how a reader gets the latest row per key exactly.

- **The changelog** (``sink.path``) is append-only between handoffs: the handoff writes every key's row
  (``_batch_id`` -1, overwriting the table), each live micro-batch appends its changed keys' rows once
  (``txnAppId``/``txnVersion``). Within one handoff's rows a key's latest row is the one with the highest
  ``_batch_id``. Its change data feed is on, so the compaction reads only the commits after its position.
- **The current table** (``sink.current``) holds the latest row per key of the changelog up to a changelog
  version, recorded in its own log as the transaction ``(COMPACTED, version)``. :func:`compact_changelog` brings
  it up to the changelog's head: a MERGE of the latest rows of the newer commits (their change feed), or a
  rebuild when the changelog was rewritten since (a new handoff) or its change files are gone.
- **Reading** (:func:`read_current`): the current table at its position plus the changelog's rows after it,
  latest per key: exact whether or not a compaction ran lately. The same result in SQL, over the changelog
  alone (no helper, slower on a long changelog)::

    SELECT * EXCEPT (_rank) FROM (
      SELECT *, row_number() OVER (PARTITION BY <keys> ORDER BY _batch_id DESC) AS _rank
      FROM delta.`<sink path>`
    ) WHERE _rank = 1
"""

from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.definition import Pipeline
from phases._internal.placement import Placement
from phases._internal.storage import fs, table_stats, tables

BATCH_ID = "_batch_id"  # the live micro-batch (progress-log batch id) that wrote the row; -1: the handoff
SOURCE_VERSION = "_source_version"  # the newest source version whose records changed the key (None: the handoff's)
OP = "_op"  # what the row does to the key: "upsert" (an aggregation never deletes a key)
HANDOFF_BATCH = -1
UPSERT = "upsert"
COMPACTED = "phases:compacted-through"  # the current table's transaction: the changelog version it holds
# Changelog commits that only add rows (or none): anything else since the current table's position rebuilds it.
_APPENDS = {
    "WRITE": "Append",
    "STREAMING UPDATE": None,
    "OPTIMIZE": None,  # auto compaction: rewrites files, changes no row (no change-feed rows)
    "VACUUM START": None,
    "VACUUM END": None,
    "SET TBLPROPERTIES": None,
}


def schema(output: T.StructType) -> T.StructType:
    """The changelog's columns: the sink's, then the change columns."""
    return T.StructType(
        [
            *output.fields,
            T.StructField(BATCH_ID, T.LongType(), False),
            T.StructField(SOURCE_VERSION, T.LongType(), True),
            T.StructField(OP, T.StringType(), False),
        ]
    )


def sink_schema(pipeline: Pipeline, output: T.StructType) -> T.StructType:
    """The sink table's columns for the operator's ``output``: with the change columns in changelog mode."""
    return schema(output) if pipeline.sink.mode == "changelog" else output


def ensure_sink(spark: SparkSession, where: Placement, output: T.StructType) -> None:
    """Creates the placed pipeline's sink for the operator's ``output`` unless it exists."""
    if where.definition.sink.mode == "changelog":
        ensure(spark, where.sink_path, output)
    else:
        pipeline = where.definition
        feed = not pipeline.operator.upserts or pipeline.sink.change_feed
        tables.ensure(spark, where.sink_path, output, **tables.sink_properties(feed))


# The changelog's table properties. The change data feed: the compaction reads it. Its Delta log checkpoint and its
# small files are the background compaction's work (:func:`tidy`), not a micro-batch's: a checkpoint of a 1M-row
# sink took ≈1.6 s of the micro-batch that wrote every tenth commit, and auto compaction would OPTIMIZE inside one.
# A log checkpoint still comes every CHECKPOINT_INTERVAL commits when no compaction runs.
CHECKPOINT_INTERVAL = 100
PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
    "delta.autoOptimize.autoCompact": "false",
}


def ensure(spark: SparkSession, path: str, output: T.StructType) -> None:
    """Creates the changelog (:data:`PROPERTIES`) unless it exists, and gives an existing one those properties (one
    created by an earlier version had Delta's checkpoint every 10 commits and auto compaction)."""
    if not tables.exists(spark, path):
        tables.ensure(spark, path, schema(output), **PROPERTIES)
        return
    have = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
    differ = {k: v for k, v in PROPERTIES.items() if have.get(k) != v}
    if differ:
        settings = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(differ.items()))
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({settings})")


def tidy(spark: SparkSession, where: Placement) -> None:
    """The changelog's upkeep beside the live phase (its background compaction, :mod:`phases._internal.live.compactor`):
    its small files bin-packed (``OPTIMIZE``, when ``maintenance.auto_compact``; it changes no row and does not conflict
    with the micro-batches' appends) and a checkpoint of its Delta log written (through Delta's ``DeltaLog``:
    internal API, pinned by ``tests/phases/live/test_changelog_sink.py``)."""
    path = where.sink_path
    if where.definition.maintenance.auto_compact:
        spark.sql(f"OPTIMIZE delta.`{path}`")
    spark_internals.checkpoint_delta_log(spark, path)


def rows(out: DataFrame, batch_id: int) -> DataFrame:
    """Changelog rows of the sink rows ``out`` (with a ``_source_version`` column, or none: unknown)."""
    source_version = F.col(SOURCE_VERSION) if SOURCE_VERSION in out.columns else F.lit(None)
    return out.select(
        *[F.col(f"`{c}`") for c in out.columns if c != SOURCE_VERSION],
        F.lit(batch_id).cast("long").alias(BATCH_ID),
        source_version.cast("long").alias(SOURCE_VERSION),
        F.lit(UPSERT).alias(OP),
    )


def latest_per_key(df: DataFrame, keys: list[str]) -> DataFrame:
    """Each key's row with the highest ``_batch_id``."""
    rank = "_phases_rank"
    order = Window.partitionBy(*[F.col(f"`{k}`") for k in keys]).orderBy(F.col(BATCH_ID).desc())
    return df.withColumn(rank, F.row_number().over(order)).filter(F.col(rank) == 1).drop(rank)


def _position(spark: SparkSession, current: str) -> int | None:
    """The changelog version the current table holds (None: no current table yet)."""
    if not tables.exists(spark, current):
        return None
    return table_stats.applied_transactions(spark, current, [COMPACTED]).get(COMPACTED)


def _only_appends_since(spark: SparkSession, path: str, position: int, head: int) -> bool:
    """True when every changelog commit after ``position`` up to ``head`` only added rows."""
    if head <= position:
        return True
    history = DeltaTable.forPath(spark, path).history(head - position + 10).collect()
    for commit in history:
        if position < commit["version"] <= head:
            mode = _APPENDS.get(commit["operation"], "-")
            parameters = commit["operationParameters"] or {}
            if mode == "-" or (mode is not None and parameters.get("mode") != mode):
                return False
    return True


def _added_since(spark: SparkSession, path: str, position: int, head: int) -> DataFrame:
    """The rows the changelog's commits after ``position`` up to ``head`` added (its change data feed)."""
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", position + 1)
        .option("endingVersion", head)
        .load(path)
    )
    return feed.filter(F.col("_change_type") == "insert").drop("_change_type", "_commit_version", "_commit_timestamp")


@dataclass(frozen=True)
class Compaction:
    through_version: int  # the changelog version the current table holds now
    rows: int  # rows merged or written
    rebuilt: bool  # written from the whole changelog (first compaction, a new handoff, change files gone)


def _snapshot(spark: SparkSession, path: str, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def _newer_rows(spark: SparkSession, sink: str, position: int | None, head: int) -> DataFrame | None:
    """The changelog's rows after ``position`` (None: it must be read whole)."""
    if position is None or not _only_appends_since(spark, sink, position, head):
        return None
    if head == position:
        return _snapshot(spark, sink, head).limit(0)
    try:
        added = _added_since(spark, sink, position, head)
        added.schema  # noqa: B018 - resolves the feed: a range whose change files are gone fails here
        return added
    except Exception:  # noqa: BLE001 - vacuumed change files: read the changelog whole instead
        return None


def compact_changelog(spark: SparkSession, pipeline: Pipeline) -> Compaction:
    """Brings the current table up to the changelog's head (module docstring). Idempotent, and safe beside the
    live phase's appends (it reads a changelog version; later appends wait for the next compaction). The sink as
    declared: the table consumers read, whichever generation serves it."""
    return compact(spark, Placement(pipeline))


def _keys(where: Placement) -> list[str]:
    """The key columns the changelog is folded by: the definition's, which must be those of the definition that
    serves the table consumers read (the redeploy log's, read with delta-rs). A definition whose keys a redeploy
    changed would fold the serving definition's rows by other keys: PhaseStateError."""
    import json

    from phases._internal.errors import PhaseStateError, SourceError
    from phases._internal.placement import Generations, LogRow

    keys = list(where.definition.key_columns)
    if not where.serving:
        return keys  # a generation's own sink, written by this definition
    try:
        found = table_stats.rows(where.redeploy_log, where=("pipeline", where.name))
    except SourceError:  # a store delta-rs cannot read: the live start and the redeploy check the log
        return keys
    gens = Generations.of([LogRow.of(row) for row in found or ()])
    spec = gens.specs.get(gens.serving)
    serving = None if spec is None else json.loads(spec).get("key_columns")
    if serving is not None and list(serving) != keys:
        raise PhaseStateError(
            f"pipeline {where.name!r}: generation {gens.serving} serves its changelog sink {where.sink_path} with key "
            f"columns {list(serving)}, and this definition has key columns {keys}: folded by them, the latest row "
            "per key would not be the serving definition's. Nothing was read or written. Call it with the "
            "definition that serves (or roll back to this one first: Redeploy(spark, pipeline).run())"
        )
    return keys


def compact(spark: SparkSession, where: Placement) -> Compaction:
    """:func:`compact_changelog` of the sink the placement writes."""
    sink, current, keys = where.sink_path, where.sink_current, _keys(where)
    fs.sweep_orphan_checksums(sink, current)
    position = _position(spark, current)
    head = tables.version(spark, sink)  # read after the position: the position is at most the head
    newer = _newer_rows(spark, sink, position, head)
    if newer is None:
        latest = latest_per_key(_snapshot(spark, sink, head), keys).persist()
        try:
            (
                latest.write.format("delta")
                .mode("overwrite")
                .option("overwriteSchema", "true")
                .option("txnAppId", COMPACTED)
                .option("txnVersion", head)
                .save(current)
            )
            return Compaction(head, latest.count(), rebuilt=True)
        finally:
            latest.unpersist()
    if head == position:
        return Compaction(head, 0, rebuilt=False)
    latest = latest_per_key(newer, keys).persist()
    try:
        with tables.idempotent_dml(spark, COMPACTED, head):
            (
                DeltaTable.forPath(spark, current)
                .alias("t")
                .merge(latest.alias("s"), tables.key_match("t", "s", keys))
                .whenMatchedUpdateAll(condition=f"s.{BATCH_ID} >= t.{BATCH_ID}")
                .whenNotMatchedInsertAll()
                .execute()
            )
        return Compaction(head, latest.count(), rebuilt=False)
    finally:
        latest.unpersist()


def read_current(spark: SparkSession, pipeline: Pipeline, *, with_change_columns: bool = False) -> DataFrame:
    """The latest row per key of a changelog sink, exactly: the current table plus the changelog's rows after
    the current table's position (a row in both is the same row; a compaction that ran meanwhile only makes the
    result newer). ``with_change_columns`` keeps ``_batch_id``, ``_source_version`` and ``_op``. The sink as
    declared: the table consumers read."""
    return read_current_at(spark, Placement(pipeline), with_change_columns=with_change_columns)


def read_current_at(spark: SparkSession, where: Placement, *, with_change_columns: bool = False) -> DataFrame:
    """:func:`read_current` of the sink the placement writes."""
    sink, current, keys = where.sink_path, where.sink_current, _keys(where)
    position = _position(spark, current)
    head = tables.version(spark, sink)  # read after the position: the position is at most the head
    newer = _newer_rows(spark, sink, position, head)
    if newer is None:
        latest = latest_per_key(_snapshot(spark, sink, head), keys)
    else:
        compacted = spark.read.format("delta").load(current)
        latest = latest_per_key(compacted.unionByName(newer), keys)
    return latest if with_change_columns else latest.drop(BATCH_ID, SOURCE_VERSION, OP)
