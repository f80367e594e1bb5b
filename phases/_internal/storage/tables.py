"""Small Delta helpers shared by the runners: create-if-missing, idempotent appends and DML, versions."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import spark_internals, uris
from phases._internal.storage import fs, table_stats

log = logging.getLogger(__name__)


def exists(spark: SparkSession, path: str) -> bool:
    """True when ``path`` holds a Delta table with at least one commit.

    Looks for commit files in the log folder through Hadoop's FileSystem (any store Spark writes to: local,
    ``s3a://``, ``abfss://``, ``gs://``); it reads no log content. ``DeltaTable.isDeltaTable`` answers from the
    session's cached ``DeltaLog`` snapshot, which stays "no table" after a first miss even once another process
    (a Dagster run, a backfill) has created the table; dropping that cache on every call would make the live
    micro-batches, which ask this of their own tables, rebuild snapshots.
    """
    return fs.has_files(spark, f"{path.rstrip('/')}/_delta_log/*.json")


# A sink whose results are appended (every operator kind but a keyed aggregation, whose sink is replaced per key) keeps
# its change data feed from its first version: another pipeline reads it as its source (a PipelineSource), each
# result with the version that appended it. It costs nothing on appends (the feed of an insert is the data file). A
# keyed aggregation's upsert sink has it when declared (``sink.change_feed``): its MERGE then writes each changed row's
# old and new values as well.
FEED_SINK_PROPERTIES = {"delta.enableChangeDataFeed": "true"}


def sink_properties(change_feed: bool) -> dict[str, str]:
    """The table properties the engine creates a sink with: :data:`FEED_SINK_PROPERTIES` when other pipelines may read
    it (``change_feed``: results appended, or a keyed aggregation declaring it); else none."""
    return dict(FEED_SINK_PROPERTIES) if change_feed else {}


def ensure(spark: SparkSession, path: str, schema: T.StructType, **properties: str) -> None:
    """Creates an empty Delta table with ``schema`` at ``path`` unless one is there (:func:`create`).

    A table whose every commit was removed (a restore from a backup older than the table, a partial restore) leaves
    a ``_delta_log`` folder without a commit, which Delta's create-if-missing takes for a table: an empty one is
    removed first. Data files left without a commit make Delta refuse to create a table there at all; the table is
    then made by an empty write (a Spark job), as a write of rows would be, and the files it does not reference stay
    until a ``VACUUM`` (the engine never deletes data files)."""
    if exists(spark, path):
        return
    folder = f"{path.rstrip('/')}/_delta_log"
    in_log = fs.file_count(spark, folder)
    left = fs.file_count(spark, path) - in_log
    if left > 0:
        log.warning("%s holds %d data file(s) but no Delta commit: creating the table beside them", path, left)
        writer = spark_internals.empty_frame(spark, schema).write.format("delta").mode("append")
        for key, value in properties.items():
            writer = writer.option(key, value)
        writer.save(path)
        return
    if in_log == 0 and fs.exists(spark, folder):
        log.warning("removing %s: a table log folder without a commit file", folder)
        fs.delete(spark, folder)
    create(spark, path, schema, if_missing=True, **properties)


def create(
    spark: SparkSession, path: str, schema: T.StructType, *, if_missing: bool = False, **properties: str
) -> None:
    """Creates an empty Delta table at ``path``: one ``CREATE TABLE`` commit (protocol, metadata and the table
    ``properties``), no data file and no Spark job to write one. Its columns are nullable at every depth, as a
    DataFrame write makes them. Raises when a table is there, unless ``if_missing``."""
    builder = DeltaTable.createIfNotExists(spark) if if_missing else DeltaTable.create(spark)
    builder = builder.location(path).addColumns(_nullable(schema))  # pyright: ignore[reportArgumentType]
    for key, value in properties.items():
        builder = builder.property(key, value)
    builder.execute()


def _nullable(t: T.DataType) -> T.DataType:
    if isinstance(t, T.StructType):
        return T.StructType([T.StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in t.fields])
    if isinstance(t, T.ArrayType):
        return T.ArrayType(_nullable(t.elementType), True)
    if isinstance(t, T.MapType):
        return T.MapType(_nullable(t.keyType), _nullable(t.valueType), True)
    return t


def version(spark: SparkSession, path: str) -> int:
    """The table's latest committed version: from its log with delta-rs (no Spark job), through Spark's history
    when delta-rs cannot read the log (store settings given to Spark only)."""
    found = table_stats.from_log(table_stats.head_version, path)
    if found is not None:
        return found
    return int(DeltaTable.forPath(spark, path).history(1).collect()[0]["version"])


# The most rows a write collects to the driver to commit through delta-rs (a local table): a quarantine's replace of a
# backlog's rows, a live micro-batch's quarantine append. Delta-Spark's commit of those few rows costs Spark jobs
# around the write: the table's snapshot, the files a replace rewrites, and for an append with Delta's transaction id
# a state reconstruction to check it (a quarantine append took 46 Spark jobs for ten, 3.9-8.3 s); delta-rs reads all of
# it from the log it loads. More rows, no table yet (an append), or a table delta-rs does not write: Spark.
DELTA_RS_MAX_ROWS = 50_000


def append_once(df: DataFrame, path: str, app_id: str, txn_version: int, *, merge_schema: bool = False) -> None:
    """Appends ``df`` unless a commit with (app_id, txn_version) or a later one is already in the table.

    Delta records the pair in the commit, so re-running a micro-batch after a crash never duplicates.
    ``merge_schema`` lets the table take up columns ``df`` adds.
    """
    if uris.is_local(path) and _append_once_through_delta_rs(df, path, app_id, txn_version, merge_schema):
        return
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", txn_version)
        .option("mergeSchema", str(merge_schema).lower())
        .save(path)
    )


def _append_once_through_delta_rs(df: DataFrame, path: str, app_id: str, txn_version: int, merge_schema: bool) -> bool:
    """:func:`append_once` through delta-rs, with the same transaction id in the commit (Delta-Spark reads it back);
    False when it committed nothing and Spark should write: no table yet, more than
    :data:`DELTA_RS_MAX_ROWS` rows, or a table delta-rs refuses (a writer feature it lacks, a schema it
    does not take)."""
    import deltalake
    from deltalake import CommitProperties, Transaction, write_deltalake
    from deltalake.exceptions import DeltaError, TableNotFoundError

    local = uris.local_path(path)
    try:
        table = deltalake.DeltaTable(local)
    except TableNotFoundError:
        return False
    except DeltaError as exc:
        log.info("%s: appended through Spark, delta-rs cannot read it: %s", path, str(exc).splitlines()[0])
        return False
    if _applied(table, app_id, txn_version):
        return True  # already committed: Delta-Spark would skip it too
    rows = df.limit(DELTA_RS_MAX_ROWS + 1).toArrow()
    if rows.num_rows > DELTA_RS_MAX_ROWS:
        return False
    try:
        write_deltalake(
            table,
            arrow_for_delta(rows),
            mode="append",
            schema_mode="merge" if merge_schema else None,
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, txn_version)]),
        )
    except DeltaError as exc:
        if _applied(deltalake.DeltaTable(local), app_id, txn_version):
            return True  # committed, and a step after the commit failed
        log.info("%s: appended through Spark, delta-rs does not write it: %s", path, str(exc).splitlines()[0])
        return False
    return True


def _applied(table, app_id: str, txn_version: int) -> bool:
    """Whether delta-rs' ``table`` holds a commit of (``app_id``, ``txn_version``) or a later one of the app."""
    applied = table.transaction_version(app_id)
    return applied is not None and applied >= txn_version


def arrow_for_delta(rows):
    """Spark's Arrow ``rows`` as Delta writes them: zoned timestamps in UTC (Spark gives them the session's time zone)
    and every column nullable, as Delta-Spark makes a new table's."""
    import pyarrow as pa

    fields = [
        pa.field(f.name, pa.timestamp("us", tz="UTC") if pa.types.is_timestamp(f.type) and f.type.tz else f.type)
        for f in rows.schema
    ]
    return rows.cast(pa.schema(fields))


def append_marked(df: DataFrame, path: str, app_id: str, batch: int, *, merge_schema: bool = False) -> None:
    """Appends ``df`` with (``app_id``, ``batch``) in the commit's ``userMetadata``, without Delta's idempotence
    check (:func:`phases._internal.storage.table_stats.write_marker`): for a table with one writer that checks first
    whenever the write may already be there. ``merge_schema`` as in :func:`append_once`."""
    marker = table_stats.write_marker(app_id, batch)
    (
        df.write.format("delta")
        .mode("append")
        .option("userMetadata", marker)
        .option("mergeSchema", str(merge_schema).lower())
        .save(path)
    )


def upsert_marked(
    spark: SparkSession,
    path: str,
    rows: DataFrame,
    keys: list[str],
    app_id: str,
    batch: int,
    *,
    write: str = "merge",
    changed: int | None = None,
) -> None:
    """``rows`` upserted with (``app_id``, ``batch``) in the commit's ``userMetadata`` (as :func:`append_marked`):
    by :func:`replace_rows` (``write="merge"``), :func:`rewrite_rows` (``"rewrite"``, ``changed`` the row count
    of ``rows`` when known), or appended (``"append"``: only when none of ``rows``' keys is in the table, as the
    caller knows from its state). A row with :data:`GONE` true deletes its key's row instead."""
    if write not in UPSERT_WAYS:
        raise ValueError(f"write {write!r}: valid values are {list(UPSERT_WAYS)}")
    key = "spark.databricks.delta.commitInfo.userMetadata"
    spark.conf.set(key, table_stats.write_marker(app_id, batch))
    try:
        if write == "rewrite":
            rewrite_rows(spark, path, rows, keys, rows_count=changed)
        elif write == "append":
            kept = rows.filter(~F.col(GONE)).drop(GONE) if GONE in rows.columns else rows
            append_marked(kept, path, app_id, batch)
        else:
            replace_rows(spark, path, rows, keys)
    finally:
        spark.conf.unset(key)


UPSERT_WAYS = ("merge", "rewrite", "append")
GONE = "_gone"  # an upserted row's column (when present): true deletes the key's row instead of writing it
# Table properties under which "auto" never rewrites an upsert sink (see upsert_write).
MERGE_PROPERTIES = ("delta.enableChangeDataFeed", "delta.enableDeletionVectors")
REWRITE_UPDATES_PER_FILE = 5  # updated keys a data file from which an upsert rewrites the whole table
BROADCAST_KEYS = 1_000_000  # changed keys up to which a rewrite broadcasts them (beyond: Spark plans the join)


def upsert_write(path: str, setting: str, changed: int, new: int | None) -> str:
    """How an upsert of ``changed`` keys (``new`` of them not in the table; None: not known) is written to the table at
    ``path``: ``setting`` unless it is ``"auto"``, which picks

    - ``"append"`` when every changed key is new (none is in the table: nothing to replace, one plain append);
    - ``"rewrite"`` when a MERGE would rewrite nearly every file anyway: the table is one data file (any updated key
      is in it), or the updated keys (``changed - new``) number at least :data:`REWRITE_UPDATES_PER_FILE` per data
      file;
    - else ``"merge"``.

    A MERGE first searches the files holding the keys (a join of the keys with the whole table's key column), then
    rewrites those files (a join that shuffles their rows). Keys spread over the files, as the engine writes the sink,
    reach a file each with probability 1/files: at five updated keys a file, a MERGE leaves fewer than 1 % of the files
    alone (e^-5), so it rewrites the table either way, and the rewrite does it without the search and the shuffle. New
    keys touch no file (a MERGE appends them). ``"merge"`` too when the keys or the table are not known well enough:
    the new keys not counted, the table's log unreadable here (delta-rs), or, for a rewrite, its change data feed on
    (a rewrite would record every row as deleted and inserted again; an append records the new rows only) or its
    deletion vectors on (a MERGE then marks the replaced rows deleted instead of rewriting their files)."""
    if setting != "auto":
        return setting
    if new is None:
        return "merge"
    updated = changed - new
    if updated == 0 and changed > 0:
        return "append"
    shape = table_stats.from_log(table_stats.data_files, path)
    if shape is None:
        return "merge"
    files, properties = shape
    if any(properties.get(p, "false").lower() == "true" for p in MERGE_PROPERTIES):
        return "merge"
    return "rewrite" if files <= 1 or updated >= REWRITE_UPDATES_PER_FILE * files else "merge"


def rewrite_rows(
    spark: SparkSession, path: str, rows: DataFrame, keys: list[str], *, rows_count: int | None = None
) -> None:
    """The table's rows of other keys than ``rows``' plus ``rows`` (one per key), in one overwrite commit: what
    :func:`replace_rows` leaves in the table, without a MERGE's search for the touched files and its shuffle of their
    rows (the table's rows are read once, filtered by the keys broadcast when they are few enough, and written again).
    The overwrite keeps the table's schema and properties; a reader sees the old rows or the new ones."""
    current = spark.read.format("delta").load(path)
    changed_keys = rows.select(*keys)
    if rows_count is not None and rows_count <= BROADCAST_KEYS:
        changed_keys = F.broadcast(changed_keys)
    kept = current.join(changed_keys, on=keys, how="left_anti")
    if GONE in rows.columns:
        rows = rows.filter(~F.col(GONE)).drop(GONE)
    kept.unionByName(rows, allowMissingColumns=True).write.format("delta").mode("overwrite").save(path)


def append_row(spark: SparkSession, path: str, schema: T.StructType, values: dict) -> None:
    """Appends one row (``values`` by column name) to the table at ``path``, creating it with ``schema``.

    The log tables (manifests, slice log, end-of-stream step log, redeploy log) are written this way: one atomic
    commit per record, so a crash leaves the whole row or none. A local table is written by delta-rs (no Spark job: a
    manifest's append took 0.3-0.4 s of a small backlog through Spark); a table elsewhere, or one whose protocol
    delta-rs does not write, through Spark.
    """
    fs.sweep_orphan_checksums(path)
    if not (uris.is_local(path) and _append_row_through_delta_rs(path, schema, values)):
        _append_row_through_spark(spark, path, schema, values)


def _append_row_through_spark(spark: SparkSession, path: str, schema: T.StructType, values: dict) -> None:
    # One partition of one row made of literals: a plan with no Python rows to ship (``createDataFrame`` of a list
    # parallelizes it into the default parallelism's tasks, each deserialized by a Python worker: ~0.5 s against
    # ~0.16 s here, warm). The literals go over as one list of SQL expressions, one call into the JVM (a column and a
    # cast each took three calls a column: ~0.14 s for the manifest's 32 columns).
    row = spark.range(0, 1, 1, numPartitions=1).selectExpr(*(_literal(values[f.name], f) for f in schema.fields))
    # The first append creates the table with ``schema`` (one commit, not an empty one before it).
    row.write.format("delta").mode("append").option("mergeSchema", "true").save(path)


# The Spark types of the log tables' columns and the Arrow types delta-rs writes them as (Delta's long, double, string,
# boolean).
_ARROW_TYPES = {"long": "int64", "double": "float64", "string": "string", "boolean": "bool"}


def _append_row_through_delta_rs(path: str, schema: T.StructType, values: dict) -> bool:
    """:func:`append_row` through delta-rs; False when it cannot and committed nothing: a column type it is not
    written for, or a table it refuses (a writer feature it lacks, such as row tracking or in-commit timestamps, or
    column mapping). Columns are nullable, as Spark's Delta writer makes a new table's; a column the table lacks is
    added (Spark's ``mergeSchema``). The commit carries a token of its own: after an error, a commit that holds it
    means the row is written (a post-commit step failed), and the row is not written again."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import DeltaError

    types = [_ARROW_TYPES.get(f.dataType.typeName()) for f in schema.fields]
    if None in types:
        return False
    arrow = pa.schema([pa.field(f.name, t, nullable=True) for f, t in zip(schema.fields, types, strict=True)])
    row = pa.Table.from_pylist([{f.name: values[f.name] for f in schema.fields}], schema=arrow)
    local, token = uris.local_path(path), uuid.uuid4().hex
    before = _commit_files(local)
    try:
        write_deltalake(
            local,
            row,
            mode="append",
            schema_mode="merge",
            commit_properties=CommitProperties(custom_metadata={ROW_TOKEN: token}),
        )
    except DeltaError as exc:
        log_dir = Path(local, "_delta_log")
        if any(token in (log_dir / n).read_text(encoding="utf-8") for n in _commit_files(local) - before):
            return True
        log.info("%s: appended through Spark, delta-rs does not write it: %s", path, str(exc).splitlines()[0])
        return False
    return True


ROW_TOKEN = "phases.row"  # a one-row append's own token in its commit (commitInfo), written through delta-rs


def _commit_files(local: str) -> set[str]:
    """The names of the commit files in the local table's log (empty: no log)."""
    try:
        return {n for n in os.listdir(os.path.join(local, "_delta_log")) if n.endswith(".json")}
    except FileNotFoundError:
        return set()


def _literal(value: object, field: T.StructField) -> str:
    """``value`` as a SQL expression of ``field``'s type named by the field: strings travel as their UTF-8 bytes in
    hex (no quoting or escaping to get wrong), numbers as their Python text, a missing value as NULL."""
    if value is None:
        text = "NULL"
    elif isinstance(value, bool):
        text = "TRUE" if value else "FALSE"
    elif isinstance(value, str):
        text = f"CAST(unhex('{value.encode().hex()}') AS STRING)"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = f"'{value!r}'"  # 'nan', 'inf' and '-inf' cast as Spark reads them
    else:
        raise TypeError(f"column {field.name!r}: no SQL literal for a {type(value).__name__} ({value!r})")
    return f"CAST({text} AS {field.dataType.simpleString()}) AS `{field.name}`"


@contextmanager
def idempotent_dml(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """Delta skips a DML statement (MERGE, DELETE) whose (app id, version) it has already committed on that
    table (the pair is recorded per table: statements on different tables may share it)."""
    spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(version))
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


def replace_rows(spark: SparkSession, path: str, rows: DataFrame, keys: list[str]) -> None:
    """One MERGE: the table's rows of ``rows``' keys replaced by them, new keys inserted (a row with :data:`GONE`
    true: its key's row deleted, nothing inserted)."""
    merge = DeltaTable.forPath(spark, path).alias("t").merge(rows.alias("s"), key_match("t", "s", keys))
    if GONE not in rows.columns:
        merge.whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
        return
    written: dict[str, str | Column] = {c: f"s.`{c}`" for c in rows.columns if c != GONE}
    (
        merge.whenMatchedDelete(f"s.`{GONE}`")
        .whenMatchedUpdate(set=written)
        .whenNotMatchedInsert(f"NOT s.`{GONE}`", values=written)
        .execute()
    )


def key_match(t: str, s: str, columns: list[str]) -> str:
    """A MERGE condition: equal ``columns`` in the target alias ``t`` and the source alias ``s``."""
    return " AND ".join(f"{t}.`{c}` = {s}.`{c}`" for c in columns)
