"""What a Delta table's log says about it, read with delta-rs (no Spark, no JVM): its version, row count, schema,
the maximum of a column and commit times; local paths and object-store URIs alike.

Sensors and catalog metadata need these in milliseconds, from a process that has no SparkSession. Row counts and
maxima come from the per-file statistics Delta writes into its log (``numRecords``, ``maxValues``), so nothing is
scanned; a file written without statistics makes the figure unknown (None), never a guess.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from phases.errors import SourceError
from phases.storage import uris

if TYPE_CHECKING:  # the sensors import this module without Spark
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # Delta's type name: string, long, timestamp, struct<...>, ...
    nullable: bool


@dataclass(frozen=True)
class TableStats:
    path: str
    version: int
    rows: int | None  # None: a data file has no numRecords statistic
    files: int
    columns: tuple[Column, ...]
    commit_time: datetime | None  # the version's commit (in-commit timestamp, else the log's timestamp)
    max_values: dict[str, datetime | int | float | str | None]  # the requested columns' maxima (from file stats)


def _uri(path: str) -> str:
    """What delta-rs opens: a local path for local locations (``file:/x`` is not a URI it reads), else the URI
    itself (``s3a://`` is its ``s3://``; the store's settings come from the SDK's environment variables)."""
    return uris.local_path(path) if uris.is_local(path) else path


def _table(path: str, version: int | None = None):
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(_uri(path), version=version)
    except TableNotFoundError:
        return None
    except Exception as exc:  # delta-rs raises several kinds for unreadable logs; name the table
        said = (str(exc).splitlines() or [""])[0]  # delta-rs appends a native backtrace after the first line
        raise SourceError(f"cannot read the Delta log of {path}: {type(exc).__name__}: {said}") from exc


def _type_name(dtype) -> str:
    kind = type(dtype).__name__
    if kind == "PrimitiveType":
        return dtype.type
    if kind == "ArrayType":
        return f"array<{_type_name(dtype.element_type)}>"
    if kind == "MapType":
        return f"map<{_type_name(dtype.key_type)},{_type_name(dtype.value_type)}>"
    if kind == "StructType":
        return "struct<" + ",".join(f"{f.name}:{_type_name(f.type)}" for f in dtype.fields) + ">"
    return str(dtype)


def _commit_time(commit: dict) -> datetime | None:
    ms = commit.get("inCommitTimestamp") or commit.get("timestamp")
    return None if ms is None else datetime.fromtimestamp(int(ms) / 1000, tz=UTC)


def head_version(path: str) -> int | None:
    """The table's latest commit version, or None when ``path`` holds no Delta table. Reads the log from its
    last checkpoint on. deltalake 1.6 loads the active files' metadata with it (its ``without_files`` is
    deprecated and ignored): a checkpoint's Parquet plus the JSON commits after it."""
    table = _table(path)
    return None if table is None else table.version()


def stats(path: str, *, max_of: tuple[str, ...] = ()) -> TableStats | None:
    """The table's current version and what its log records of it; None when ``path`` holds no Delta table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = _table(path)
    if table is None:
        return None
    actions = pa.table(table.get_add_actions(flatten=True))
    rows = None
    if "num_records" in actions.column_names:
        counts = actions.column("num_records")
        rows = int(pc.sum(counts).as_py() or 0) if counts.null_count == 0 else None
    maxima: dict = {}
    for name in max_of:
        column = f"max.{name}"
        if (
            actions.num_rows == 0
            or column not in actions.column_names
            or actions.column(column).null_count == actions.num_rows
        ):
            maxima[name] = None
        else:
            maxima[name] = pc.max(actions.column(column)).as_py()
    history = table.history(1)
    columns = tuple(Column(f.name, _type_name(f.type), f.nullable) for f in table.schema().fields)
    return TableStats(
        path=path,
        version=table.version(),
        rows=rows,
        files=actions.num_rows,
        columns=columns,
        commit_time=_commit_time(history[0]) if history else None,
        max_values=maxima,
    )


def commit_times(path: str, first_version: int) -> dict[int, datetime]:
    """Commit time of each version from ``first_version`` to the head (empty when there is none)."""
    table = _table(path)
    if table is None or table.version() < first_version:
        return {}
    commits = table.history(table.version() - first_version + 1)
    return {
        int(c["version"]): t for c in commits if (t := _commit_time(c)) is not None and c["version"] >= first_version
    }


@dataclass(frozen=True)
class VersionAdds:
    """What one version did to the table's files, from two consecutive snapshots of its log."""

    version: int
    added: object  # pyarrow.Table: the flattened add actions of the files this version added
    files: int  # files in the version's snapshot
    removed: bool  # a file of the previous snapshot is gone (not an append)


def version_adds(path: str, first: int, last: int) -> Iterator[VersionAdds] | None:
    """Versions first..last one by one, or None when ``path`` holds no Delta table. One table object is stepped
    forward (``load_as_version`` applies the commits since its version), not a log replay from the last
    checkpoint per version. Raises SourceError when the log cannot be read."""
    import pyarrow as pa

    table = _table(path, max(first - 1, 0))
    if table is None:
        return None

    def steps() -> Iterator[VersionAdds]:
        before: set[str] = set()
        if first > 0:
            before = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
        for version in range(first, last + 1):
            if table.version() != version:
                try:
                    table.load_as_version(version)
                except Exception as exc:  # noqa: BLE001 - a version the log no longer holds, or cannot parse
                    said = (str(exc).splitlines() or [""])[0]
                    raise SourceError(f"cannot read version {version} of the Delta log of {path}: {said}") from exc
            actions = pa.table(table.get_add_actions(flatten=True))
            paths = actions.column("path").to_pylist()
            new = [i for i, name in enumerate(paths) if name not in before]
            added = actions.take(pa.array(new, type=pa.int64()))
            yield VersionAdds(version, added, actions.num_rows, not before.issubset(paths))
            before = set(paths)

    return steps()


def version_adding(path: str, file_name: str, first: int, last: int) -> int | None:
    """The version in first..last whose commit added the data file named ``file_name`` (its last path part);
    None when no version in the range added it. A diagnostic for a file that is gone: the log still names it."""
    steps = version_adds(path, first, last)
    for step in steps or ():
        if any(name.rsplit("/", 1)[-1] == file_name for name in step.added.column("path").to_pylist()):
            return step.version
    return None


def transaction_versions(path: str, app_ids: list[str]) -> dict[str, int]:
    """The newest idempotent-write version Delta recorded for each of ``app_ids`` (``txnAppId`` / ``txnVersion``)
    in the table at ``path``; app ids the table never saw (or no table) are left out."""
    table = _table(path)
    if table is None:
        return {}
    found = {app: table.transaction_version(app) for app in app_ids}
    return {app: int(v) for app, v in found.items() if v is not None}


def applied_transactions(spark: SparkSession, path: str, app_ids: list[str]) -> dict[str, int]:
    """:func:`transaction_versions`, read with delta-rs; a log delta-rs cannot read (store settings given to Spark
    only) is read through Spark's."""
    try:
        return transaction_versions(path, app_ids)
    except SourceError:
        return transaction_versions_through_spark(spark, path, app_ids)


def transaction_versions_through_spark(spark: SparkSession, path: str, app_ids: list[str]) -> dict[str, int]:
    """:func:`transaction_versions` through Delta's JVM classes (``DeltaLog``, ``Snapshot``:
    internal API, pinned by ``tests/phases/test_live_resume.py``)."""
    jvm = spark.sparkContext._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    none = getattr(getattr(jvm.scala, "None$"), "MODULE$")
    transactions = log.update(False, none, none).transactions()
    out = {}
    for app in app_ids:
        version = transactions.get(app)
        if version.isDefined():
            out[app] = int(version.get())
    return out
