"""What a Delta table's log says about it, read with delta-rs (no Spark, no JVM): its version, row count, schema,
the maximum of a column and commit times; local paths and object-store URIs alike.

Sensors and catalog metadata need these in milliseconds, from a process that has no SparkSession. Row counts and
maxima come from the per-file statistics Delta writes into its log (``numRecords``, ``maxValues``), so nothing is
scanned; a file written without statistics makes the figure unknown (None), never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from phases._internal import spark_internals, uris
from phases._internal.errors import SourceError

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
        rows = int(pc.sum(counts).as_py() or 0) if counts.null_count == 0 else None  # pyright: ignore[reportAttributeAccessIssue]
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
            maxima[name] = pc.max(actions.column(column)).as_py()  # pyright: ignore[reportAttributeAccessIssue]
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


_Read = TypeVar("_Read")


def from_log(read: Callable[[str], _Read | None], path: str) -> _Read | None:
    """``read(path)``, or None when delta-rs cannot read the table's log (store settings given to Spark only): the
    caller then asks Spark. For the engine's own small reads on a hot path (a live start, a handoff)."""
    try:
        return read(path)
    except SourceError:
        return None


def table_id(path: str) -> str | None:
    """The table's id (``metaData.id``), or None when ``path`` holds no Delta table."""
    table = _table(path)
    return None if table is None else str(table.metadata().id)


def properties(path: str) -> dict[str, str] | None:
    """The table's properties (``metaData.configuration``), or None when ``path`` holds no Delta table."""
    table = _table(path)
    return None if table is None else dict(table.metadata().configuration)


def data_files(path: str) -> tuple[int, dict[str, str]] | None:
    """The number of data files of the table's current version and its properties, or None when ``path`` holds no
    Delta table."""
    table = _table(path)
    return None if table is None else (len(table.file_uris()), dict(table.metadata().configuration))


def rows(path: str, *, where: tuple[str, str] | None = None) -> list[dict] | None:
    """Every row of a small table as dicts (``where``: only those whose string column ``where[0]`` equals
    ``where[1]``), read from its files; None when ``path`` holds no Delta table. For the engine's own log tables
    (one row a run), which a live start reads before any Spark query of them would have warmed up."""
    import pyarrow.dataset as ds

    table = _table(path)
    if table is None:
        return None
    data = table.to_pyarrow_dataset().to_table(filter=None if where is None else ds.field(where[0]) == where[1])
    return data.to_pylist()


def counted_rows(path: str) -> tuple[int, int | None] | None:
    """The table's head version and its row count from the log's file statistics at that version (no scan); None
    when there is no table. The count is None when a file has no ``numRecords`` statistic or the table may have
    deletion vectors (a file's statistic still counts its deleted rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = _table(path)
    if table is None:
        return None
    if "deletionVectors" in (table.protocol().reader_features or []):
        return table.version(), None
    actions = pa.table(table.get_add_actions(flatten=True))
    if "num_records" not in actions.column_names or actions.column("num_records").null_count:
        return table.version(), None
    return table.version(), int(pc.sum(actions.column("num_records")).as_py() or 0)  # pyright: ignore[reportAttributeAccessIssue]


def column_types(path: str, version: int | None = None) -> dict[str, str]:
    """The table's columns and their Delta type names at ``version`` (None: now); empty when there is no table."""
    table = _table(path, version)
    return {} if table is None else {f.name: _type_name(f.type) for f in table.schema().fields}


def value_counts(path: str, column: str, *, where: tuple[str, str] | None = None) -> dict[str, int] | None:
    """How many rows of the table hold each value of the string column ``column`` (``where``: only the rows whose
    column ``where[0]`` equals ``where[1]``), read from that column alone; None when ``path`` holds no Delta table.
    For small tables a person reads by category, such as a quarantine by reason."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    table = _table(path)
    if table is None:
        return None
    columns = [column] if where is None or where[0] == column else [column, where[0]]
    data = table.to_pyarrow_dataset().to_table(
        columns=columns, filter=None if where is None else ds.field(where[0]) == where[1]
    )
    counts = pc.value_counts(data.column(column))  # pyright: ignore[reportAttributeAccessIssue]
    return {str(c["values"]): int(c["counts"]) for c in counts.to_pylist()}


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
        if any(name.rsplit("/", 1)[-1] == file_name for name in step.added.column("path").to_pylist()):  # pyright: ignore[reportAttributeAccessIssue]
            return step.version
    return None


def transaction_versions(path: str, app_ids: list[str]) -> dict[str, int]:
    """The newest idempotent-write version Delta recorded for each of ``app_ids`` (``txnAppId`` / ``txnVersion``)
    in the table at ``path``; app ids the table never saw (or no table) are left out."""
    table = _table(path)
    return {} if table is None else _versions(table, app_ids)


def _versions(table, app_ids: list[str]) -> dict[str, int]:
    found = {app: table.transaction_version(app) for app in app_ids}
    return {app: int(v) for app, v in found.items() if v is not None}


def applied_transactions(spark: SparkSession, path: str, app_ids: list[str]) -> dict[str, int]:
    """:func:`transaction_versions` and :func:`newest_marked_write`, read with delta-rs; a log delta-rs cannot read
    (store settings given to Spark only) is read through Spark's."""
    try:
        table = _table(path)  # one read of the log for both
    except SourceError:
        found = transaction_versions_through_spark(spark, path, app_ids)
        commits = _history_pages_through_spark(spark, path)
    else:
        if table is None:
            return {}
        found, commits = _versions(table, app_ids), _pages(lambda n: table.history(n))
    marked = newest_marked_write(commits, app_ids)
    if marked is not None and marked[1] > found.get(marked[0], -1):
        found[marked[0]] = marked[1]
    return found


# --- writes marked in their commit ---------------------------------------------------------------------------
# A write that carries its (app id, batch) in the commit's ``userMetadata`` instead of Delta's ``txnAppId`` /
# ``txnVersion``: Delta 4.4's check of those reads the snapshot's transactions, a state reconstruction (three Spark
# jobs, about 0.45 s a commit on a live sink). A table written this way must have one writer, which checks
# whether its write is already there only when it may be (:mod:`phases._internal.live.batch_writes`).
WRITE_MARK = "phases_write"
# Commits that change no row: looking for the newest write, the log is read back past these.
_NO_ROWS = {
    "OPTIMIZE",
    "VACUUM START",
    "VACUUM END",
    "SET TBLPROPERTIES",
    "UNSET TBLPROPERTIES",
    "ADD CONSTRAINT",
    "DROP CONSTRAINT",
    "UPGRADE PROTOCOL",
    "COMPUTE STATS",
    # a schema change of a live phase (phases._internal.schema_changes): the columns change, no row does
    "CHANGE COLUMN",
    "ADD COLUMNS",
}


def changes_rows(commit: dict) -> bool:
    """Whether a commit (its commit info) may have changed the table's rows (anything but compaction, vacuum and
    property or schema changes)."""
    return commit.get("operation") not in _NO_ROWS


# Commit metrics that count what a commit removed (a WRITE's overwrite, a MERGE, a DELETE, an UPDATE, a RESTORE).
_REMOVED_METRICS = ("numRemovedFiles", "numTargetFilesRemoved", "numDeletedRows", "numTargetRowsDeleted")


def removes_rows(commit: dict) -> bool:
    """Whether a commit (its commit info) removed or replaced rows, rather than only appending: an overwrite that
    replaced files, a MERGE, a DELETE, an UPDATE, a RESTORE. An overwrite by a condition that matched no file (its
    removed-file count 0) appends; compaction (:func:`changes_rows` false) changes no row."""
    if not changes_rows(commit):
        return False
    metrics = commit.get("operationMetrics") or {}
    counted = [metrics[k] for k in _REMOVED_METRICS if metrics.get(k) is not None]
    if counted:
        return any(int(n) > 0 for n in counted)
    parameters = commit.get("operationParameters") or {}
    mode = parameters.get("mode") or parameters.get("outputMode")
    return commit.get("operation") not in ("WRITE", "STREAMING UPDATE") or mode != "Append"


def rewrites(spark: SparkSession | None, path: str, first: int, last: int) -> list[tuple[int, str]]:
    """(version, operation) of the commits of versions first..last that removed or replaced rows
    (:func:`removes_rows`), oldest first: read with delta-rs (no Spark job), else through Spark's history when
    ``spark`` is given."""
    if last < first:
        return []
    found = []
    for commit in commits_newest_first(spark, path) or ():
        version = int(commit.get("version", -1))
        if version < first:
            break
        if version <= last and removes_rows(commit):
            found.append((version, str(commit.get("operation"))))
    return sorted(found)


def commit_ms(commit: dict) -> int | None:
    """A commit's time as its commit info says (in-commit timestamp, else the writer's), in ms: with its version,
    what tells that commit from another one at the same version (a table removed and written again)."""
    ms = commit.get("inCommitTimestamp") or commit.get("timestamp")
    return None if ms is None else int(ms)


def head_commit(spark: SparkSession | None, path: str) -> dict | None:
    """The table's newest commit info (None: no table)."""
    return next(iter(commits_newest_first(spark, path) or ()), None)


def write_mark(commit: dict) -> tuple[str, int] | None:
    """(app id, batch) of a marked write (:func:`write_marker`), else None."""
    return _marker(commit)


def commits_newest_first(spark: SparkSession | None, path: str) -> Iterator[dict] | None:
    """The table's commit infos (``version``, ``operation``, ``userMetadata``), newest first, read page by page as
    the caller goes on (delta-rs, else Spark's history when a ``spark`` session is given); None when ``path``
    holds no table."""
    try:
        table = _table(path)
    except SourceError:
        if spark is None:
            raise
        pages = _history_pages_through_spark(spark, path)
    else:
        if table is None:
            return None
        pages = _pages(lambda n: table.history(n))
    return (commit for page in pages for commit in page)


def write_marker(app_id: str, batch: int) -> str:
    """The ``userMetadata`` of a marked write."""
    return json.dumps({WRITE_MARK: {"app": app_id, "batch": batch}}, separators=(",", ":"))


def _marker(commit: dict) -> tuple[str, int] | None:
    text = commit.get("userMetadata")
    if not text:
        return None
    try:
        mark = json.loads(text).get(WRITE_MARK)
        return str(mark["app"]), int(mark["batch"])
    except (ValueError, AttributeError, TypeError, KeyError):
        return None


def newest_marked_write(commits: Iterator[list[dict]], app_ids: list[str]) -> tuple[str, int] | None:
    """(app id, batch) of the newest commit that changed rows, when it is a marked write of one of ``app_ids``;
    None otherwise. ``commits``: pages of commit infos, newest first (commits that change no row are read past)."""
    for page in commits:
        for commit in page:
            if commit.get("operation") in _NO_ROWS:
                continue
            mark = _marker(commit)
            return mark if mark is not None and mark[0] in app_ids else None
    return None


def newest_row_commit(spark: SparkSession, path: str, *, at_or_before: int | None = None) -> dict | None:
    """The commit info (``version``, ``operation``, ``userMetadata``) of the table's newest commit that changed
    rows (of those up to version ``at_or_before``, when given); None when there is no table or no such commit. Read
    with delta-rs, else through Spark."""
    try:
        table = _table(path)
    except SourceError:
        commits = _history_pages_through_spark(spark, path)
    else:
        if table is None:
            return None
        commits = _pages(lambda n: table.history(n))
    for page in commits:
        for commit in page:
            if at_or_before is not None and int(commit["version"]) > at_or_before:
                continue
            if commit.get("operation") not in _NO_ROWS:
                return commit
    return None


def commit_metadata(commit: dict | None) -> dict:
    """A commit's ``userMetadata`` as a dict ({} when it has none or it is not a JSON object)."""
    text = (commit or {}).get("userMetadata")
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def has_marked_write(path: str, app_id: str, batch: int, *, newest: int = 8) -> bool:
    """Whether one of the table's ``newest`` commits is the marked write (``app_id``, ``batch``): asked right after
    that write, to tell a commit from a write Delta skipped because it had no row to add."""
    table = _table(path)
    if table is None:
        return False
    return any(_marker(commit) == (app_id, batch) for commit in table.history(newest))


def _history_pages_through_spark(spark: SparkSession, path: str) -> Iterator[list[dict]]:
    from delta.tables import DeltaTable

    def read(n: int) -> list[dict]:
        rows = (
            DeltaTable.forPath(spark, path)
            .history(n)
            .select("version", "operation", "operationParameters", "operationMetrics", "userMetadata", "timestamp")
            .collect()
        )
        return [{**r.asDict(), "timestamp": int(r["timestamp"].timestamp() * 1000)} for r in rows]

    return _pages(read)


def _pages(read) -> Iterator[list[dict]]:
    seen, limit = 0, 16
    while True:
        commits = read(limit)
        yield commits[seen:]
        if len(commits) < limit:
            return
        seen, limit = len(commits), limit * 8


def transaction_versions_through_spark(spark: SparkSession, path: str, app_ids: list[str]) -> dict[str, int]:
    """:func:`transaction_versions` through Delta's JVM classes
    (:func:`phases._internal.spark_internals.delta_transactions`)."""
    return spark_internals.delta_transactions(spark, path, app_ids)
