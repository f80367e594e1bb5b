"""The quarantine table: every record the pipeline does not aggregate lands here with its reason."""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import uris
from phases._internal.definition import RIGHT_LABEL
from phases._internal.lateness import VERSION, WATERMARK_US
from phases._internal.records import FUTURE
from phases._internal.storage import tables

log = logging.getLogger(__name__)

SCHEMA = T.StructType(
    [
        T.StructField("pipeline", T.StringType(), False),
        T.StructField("phase", T.StringType(), False),
        T.StructField("batch_id", T.LongType(), True),
        T.StructField("source_version", T.LongType(), True),
        T.StructField("reason", T.StringType(), False),
        T.StructField("event_time", T.TimestampType(), True),
        T.StructField("watermark", T.TimestampType(), True),
        T.StructField("record", T.StringType(), False),
        # Where a Kafka source's record came from (null for Delta sources): what to look up on the broker.
        T.StructField("kafka_topic", T.StringType(), True),
        T.StructField("kafka_partition", T.IntegerType(), True),
        T.StructField("kafka_offset", T.LongType(), True),
    ]
)
_KAFKA_COLUMNS = {"kafka_topic": "_kafka_topic", "kafka_partition": "_kafka_partition", "kafka_offset": "_kafka_offset"}
_RAW = "_raw"  # an undecodable value's text (Kafka): the record it is kept as

LATE_REASON = "late: event time <= watermark"
RIGHT_INPUT_REASON = f"{RIGHT_LABEL} input: "  # prefixes the reason of a two-input operator's right-source records


def of_input(rows: DataFrame, label: str) -> DataFrame:
    """Quarantine rows of a pipeline's second input (``label``): their reason names the input."""
    return rows.withColumn("reason", F.concat(F.lit(f"{label} input: "), F.col("reason")))


def rows(
    df: DataFrame, *, pipeline: str, phase: str, event_time: str, reason: str | None, batch_id: int | None
) -> DataFrame:
    """Quarantine rows for ``df`` (change-feed rows). ``reason`` None takes the ``_reason`` column."""
    user_cols = [c for c in df.columns if not c.startswith("_")]
    wm = F.timestamp_micros(F.col(WATERMARK_US)) if WATERMARK_US in df.columns else F.lit(None)
    # Null fields stay in the record (a null key is the reason it is here); an undecodable value stays as it came.
    record = F.to_json(F.struct(*[F.col(c) for c in user_cols]), {"ignoreNullFields": "false"})
    if _RAW in df.columns:
        record = F.coalesce(F.col(_RAW), record)
    kafka = [
        (F.col(source) if source in df.columns else F.lit(None)).cast(SCHEMA[name].dataType).alias(name)
        for name, source in _KAFKA_COLUMNS.items()
    ]
    return df.select(
        F.lit(pipeline).alias("pipeline"),
        F.lit(phase).alias("phase"),
        F.lit(batch_id).cast("long").alias("batch_id"),
        F.col(VERSION).cast("long").alias("source_version"),
        (F.lit(reason) if reason is not None else F.col("_reason")).alias("reason"),
        F.col(event_time).cast("timestamp").alias("event_time"),
        wm.cast("timestamp").alias("watermark"),
        record.alias("record"),
        *kafka,
    )


def invalid_and_late(
    invalid: DataFrame, late: DataFrame, *, pipeline: str, phase: str, event_time: str, batch_id: int | None
) -> DataFrame:
    """Quarantine rows for the invalid records (their own reasons) and the late ones."""
    common = dict(pipeline=pipeline, phase=phase, event_time=event_time, batch_id=batch_id)
    return rows(invalid, reason=None, **common).unionByName(rows(late, reason=LATE_REASON, **common))  # pyright: ignore[reportArgumentType]


def ensure(spark: SparkSession, path: str) -> None:
    """Creates the quarantine table if it is missing."""
    tables.ensure(spark, path, SCHEMA)


def replace_backlog(
    spark: SparkSession,
    path: str,
    pipeline: str,
    quarantined: DataFrame,
    versions: tuple[int, int] | None = None,
    *,
    empty: bool = False,
    right_input: bool | None = None,
    rows: int | None = None,
) -> None:
    """Replaces this pipeline's backlog rows (of source ``versions`` lo..hi, or all) in one commit, so a
    re-run backlog, increment or slice never duplicates them. ``empty``: ``quarantined`` is known to hold no
    row; when there is no quarantine table yet either, nothing is written (the first quarantined row, or the
    live phase, creates it). ``right_input``: a two-input operator's rows of one input only (True: the right
    input's, whose versions are its own; False: the source's). ``rows``: how many rows ``quarantined`` holds, when
    the caller counted them (a local table then takes up to ``tables.DELTA_RS_MAX_ROWS`` of them through
    delta-rs: one commit, no Spark job for the table's snapshot, the files to rewrite and the write)."""
    known = 0 if empty else rows
    if known is not None and known <= tables.DELTA_RS_MAX_ROWS and uris.is_local(path):
        where = _backlog_rows(pipeline, versions, right_input, starts_with="starts_with")
        if _replace_through_delta_rs(path, where, None if known == 0 else quarantined):
            return
    if not tables.exists(spark, path):
        if empty:
            return
        if _as_written(quarantined.schema) == _as_written(SCHEMA):
            # No table, so no earlier row to replace: one append makes it with these rows (a create and then a
            # replaceWhere, which deletes nothing from the new table, took six Spark jobs and 3-4x the time).
            quarantined.write.format("delta").mode("append").save(path)
            return
    ensure(spark, path)
    where = _backlog_rows(pipeline, versions, right_input, starts_with="startswith")
    quarantined.write.format("delta").mode("overwrite").option("replaceWhere", where).save(path)


def _backlog_rows(
    pipeline: str, versions: tuple[int, int] | None, right_input: bool | None, *, starts_with: str
) -> str:
    """The SQL condition of the backlog rows a replace removes; ``starts_with``: the dialect's prefix function
    (Spark's ``startswith``, DataFusion's ``starts_with`` for delta-rs)."""
    where = f"pipeline = '{pipeline}' AND phase = 'backlog'"
    if versions is not None:
        where += f" AND source_version >= {versions[0]} AND source_version <= {versions[1]}"
    if right_input is not None:
        where += f" AND {'' if right_input else 'NOT '}{starts_with}(reason, '{RIGHT_INPUT_REASON}')"
    return where


def _replace_through_delta_rs(path: str, where: str, quarantined: DataFrame | None) -> bool:
    """:func:`replace_backlog` of a local table through delta-rs: ``quarantined`` (None: no row) replaces the rows of
    ``where`` in one commit (a delete when there is no row; the first rows create the table). False when delta-rs
    committed nothing and Spark should write instead: a table it does not write (a writer feature it lacks, another
    schema), or rows that are not the quarantine's columns."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import DeltaError, TableNotFoundError

    local = uris.local_path(path)
    table: pa.Table | None = None
    if quarantined is not None:
        if _as_written(quarantined.schema) != _as_written(SCHEMA):
            return False
        table = tables.arrow_for_delta(quarantined.toArrow())
    try:
        try:
            existing = DeltaTable(local)
        except TableNotFoundError:
            existing = None
        if existing is None:
            if table is not None:
                write_deltalake(local, table, mode="append")
            return True
        if table is None:
            existing.delete(where)
        else:
            write_deltalake(existing, table, mode="overwrite", predicate=where)
    except DeltaError as exc:
        log.info("%s: quarantine rows replaced through Spark, delta-rs does not: %s", path, str(exc).splitlines()[0])
        return False
    return True


def _as_written(schema: T.StructType) -> list[tuple[str, str]]:
    """The columns as a Delta write makes a new table of them (names and types; every column nullable)."""
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def _count_columns() -> list:
    return [
        F.count(F.lit(1)).alias("all"),
        F.count(F.when(F.col("reason").endswith(LATE_REASON), 1)).alias("late"),
        F.count(F.when(F.col("reason").rlike(f"^({RIGHT_INPUT_REASON})?{FUTURE}: "), 1)).alias("future"),
    ]


def _counts(row: dict) -> tuple[int, int, int]:
    return int(row["late"]), int(row["all"]) - int(row["late"]), int(row["future"])


def replace_all_backlog(spark: SparkSession, path: str, pipeline: str, quarantined: DataFrame, *, empty: bool) -> tuple:
    """:func:`replace_backlog` of every version (a full backlog run), returning :func:`backlog_counts` of what it
    wrote: the table holds exactly those backlog rows of ``pipeline`` afterwards, so the manifest's counts need no
    second read of the table. A replace is a Delta ``replaceWhere`` (it deletes the matching rows: seconds even on
    a small table), so when there is nothing to quarantine and no earlier backlog row to remove, nothing is
    written."""
    rows = None
    if not empty:
        # The candidates' rows, computed once (one pass over the tagged records): usually few, often none.
        rows = quarantined.persist()
        counts = _counts(rows.agg(*_count_columns()).collect()[0].asDict())
    try:
        if rows is None or sum(counts[:2]) == 0:
            if uris.is_local(path):
                replace_backlog(spark, path, pipeline, quarantined.limit(0), empty=True)
            elif _holds_backlog_rows(spark, path, pipeline):
                replace_backlog(spark, path, pipeline, quarantined.limit(0))
            return 0, 0, 0
        replace_backlog(spark, path, pipeline, rows, rows=sum(counts[:2]))
        return counts
    finally:
        if rows is not None:
            rows.unpersist()


def _holds_backlog_rows(spark: SparkSession, path: str, pipeline: str) -> bool:
    if not tables.exists(spark, path):
        return False
    found = (
        spark.read.format("delta").load(path).filter((F.col("pipeline") == pipeline) & (F.col("phase") == "backlog"))
    )
    return bool(found.limit(1).collect())


def backlog_counts(spark: SparkSession, path: str, pipeline: str, up_to_version: int | None) -> tuple[int, int, int]:
    """(late, invalid, of those invalid: future) backlog rows of ``pipeline`` for source versions <=
    ``up_to_version`` (None: all)."""
    if not tables.exists(spark, path):
        return 0, 0, 0
    rows = spark.read.format("delta").load(path).filter((F.col("pipeline") == pipeline) & (F.col("phase") == "backlog"))
    if up_to_version is not None:
        # A two-input operator's right-source rows carry the right source's versions (one full backlog run).
        rows = rows.filter((F.col("source_version") <= up_to_version) | F.col("reason").startswith(RIGHT_INPUT_REASON))
    return _counts(rows.agg(*_count_columns()).collect()[0].asDict())


def count(spark: SparkSession, path: str, pipeline: str, phase: str | None = None) -> int:
    if not tables.exists(spark, path):
        return 0
    df = spark.read.format("delta").load(path).filter(F.col("pipeline") == pipeline)
    if phase is not None:
        df = df.filter(F.col("phase") == phase)
    return df.count()
