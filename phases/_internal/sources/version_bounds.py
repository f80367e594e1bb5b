"""What a Delta source's log says about the records each version added, without reading them: per version,
the row count, bounds on the event time and whether any key or event time is null.

The bounds are *bounds*: Delta-Spark writes timestamp statistics at millisecond precision (truncated), so a
version's true maximum lies in ``[max_floor_us, max_floor_us + 999]`` and its true minimum is at least
``min_floor_us``. They cannot give the exact maxima the version watermarks need (the scan does), but they can
prove that a range holds no late and no invalid record (:func:`proves_all_on_time`), and then an operator
that needs no per-record watermark can skip the statistics scan.

Read with delta-rs (no JVM) by stepping the snapshot one version at a time and diffing its files, which is
linear in versions × files: ranges beyond :data:`MAX_DIFFED_FILES` return None (the caller scans). A version
that removed a file (a delete, update, merge, overwrite or compaction), a table that supports deletion vectors
(a delete then keeps the file's path), a file without statistics or without a null count of a needed column
also return None: nothing is guessed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from phases._internal.errors import SourceError

MAX_DIFFED_FILES = 2_000_000  # versions × files diffed before giving up on the log
_MS = 1000


@dataclass(frozen=True)
class VersionBounds:
    version: int
    rows: int
    min_floor_us: int | None  # None: the version added no row
    max_floor_us: int | None
    nulls: int  # rows with a null key or event time (an upper bound; 0 proves there are none)
    # The files that can hold the version's maximum (path, that file's max floor): those whose max floor is within a
    # millisecond of the version's (usually one). What :func:`exact_max_us` reads.
    near_top: tuple[tuple[str, int], ...] = ()

    @property
    def max_ceil_us(self) -> int | None:
        return None if self.max_floor_us is None else self.max_floor_us + _MS - 1


def _micros(column):
    """A statistics column as int64 microseconds since the epoch, whatever the time zone of the machine (a
    naive ``datetime`` would be read in local time)."""
    import pyarrow as pa

    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64())
    return column


def read(path: str, first: int, last: int, event_time: str, keys: list[str]) -> list[VersionBounds] | None:
    """Bounds of versions first..last of the Delta table at ``path`` from its log, or None when the log cannot
    tell (see the module docstring)."""
    try:
        return _read(path, first, last, event_time, keys)
    except SourceError as exc:
        # delta-rs cannot read the log where Spark can (an object store whose settings are only in Spark's
        # Hadoop configuration, not in the SDK's environment variables): the scan tells the same, slower.
        warnings.warn(f"{exc}; the per-version event-time bounds come from a scan instead", stacklevel=2)
        return None


def _read(path: str, first: int, last: int, event_time: str, keys: list[str]) -> list[VersionBounds] | None:
    from phases._internal.storage.table_stats import _table, version_adds

    head = _table(path, last)
    if head is None or _has_deletion_vectors(head):
        return None  # a delete by deletion vector keeps the file's path: a diff of paths would miss it
    steps = version_adds(path, first, last)
    if steps is None:
        return None
    out: list[VersionBounds] = []
    diffed = 0
    for step in steps:
        diffed += step.files
        if diffed > MAX_DIFFED_FILES:
            return None
        if step.removed:
            return None  # a file was removed: not an append
        bounds = _bounds(step.version, step.added, event_time, keys)
        if bounds is None:
            return None
        out.append(bounds)
    return out


def _has_deletion_vectors(table) -> bool:
    protocol = table.protocol()
    features = {*(protocol.reader_features or ()), *(protocol.writer_features or ())}
    return "deletionVectors" in features


def _bounds(version: int, adds, event_time: str, keys: list[str]) -> VersionBounds | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    needed = ["num_records", f"min.{event_time}", f"max.{event_time}", f"null_count.{event_time}"]
    needed += [f"null_count.{k}" for k in keys]
    if adds.num_rows == 0:
        return VersionBounds(version, 0, None, None, 0)
    if any(c not in adds.column_names or adds.column(c).null_count for c in needed[:1] + needed[3:]):
        return None
    rows = int(pc.sum(adds.column("num_records")).as_py())  # pyright: ignore[reportAttributeAccessIssue]
    nulls = sum(int(pc.sum(adds.column(c)).as_py()) for c in needed[3:])  # pyright: ignore[reportAttributeAccessIssue]
    lo, hi = _micros(adds.column(needed[1])), _micros(adds.column(needed[2]))
    if not (pa.types.is_integer(lo.type) and pa.types.is_integer(hi.type)):
        return None  # an event-time column the statistics do not keep as a timestamp
    if rows - int(pc.sum(adds.column(needed[3])).as_py()) > 0 and (lo.null_count or hi.null_count):  # pyright: ignore[reportAttributeAccessIssue]
        return None  # a file with event times but no min/max statistic
    min_floor, max_floor = pc.min(lo).as_py(), pc.max(hi).as_py()  # pyright: ignore[reportAttributeAccessIssue]
    if min_floor is not None and min_floor < 0:
        return None  # before 1970 a truncation toward zero would round up, and the floor would not be one
    near: tuple[tuple[str, int], ...] = ()
    if max_floor is not None:
        maxima = hi.to_pylist()
        near = tuple(
            (path, m)
            for path, m in zip(adds.column("path").to_pylist(), maxima, strict=True)
            if m is not None and m >= max_floor - _MS + 1
        )
    return VersionBounds(version, rows, min_floor, max_floor, nulls, near)


def exact_max_us(path: str, version: int, candidates: list[VersionBounds], top_us: int, event_time: str) -> int | None:
    """The exact greatest event time of the versions ``candidates`` (those whose bounds reach ``top_us``, the highest
    max floor of the range), read with delta-rs and pyarrow from the event-time column of just the files that can hold
    it, at or above ``top_us``; ``version``: the range's last. None when this read cannot answer exactly (a table
    with column mapping, an event time that is a partition column, nested or not a zoned timestamp, no row found):
    the caller reads the rows through Spark."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from phases._internal.storage.table_stats import _table

    if "." in event_time or "`" in event_time:
        return None
    wanted = {p for b in candidates for p, m in b.near_top if m + _MS - 1 >= top_us}
    if not wanted:
        return None
    try:
        table = _table(path, version)
    except SourceError:
        return None
    if table is None:
        return None
    metadata = table.metadata()
    if (metadata.configuration or {}).get("delta.columnMapping.mode", "none") != "none":
        return None  # the files' column names are physical ones
    if event_time in (metadata.partition_columns or []):
        return None
    try:
        dataset = table.to_pyarrow_dataset()
    except Exception:  # noqa: BLE001 - a table feature delta-rs does not read: Spark reads it
        return None
    field = dataset.schema.field(event_time) if event_time in dataset.schema.names else None
    if field is None or not pa.types.is_timestamp(field.type) or field.type.tz is None:
        return None  # Spark's unix_micros of a timestamp without a time zone depends on the session's
    fragments = [f for f in dataset.get_fragments() if f.path in wanted]
    if len(fragments) != len(wanted):
        return None  # a path the dataset names otherwise (an encoded partition folder): not guessed
    try:
        found = ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem).to_table(
            columns=[event_time], filter=ds.field(event_time) >= pa.scalar(top_us, pa.timestamp("us", field.type.tz))
        )
    except (OSError, pa.ArrowException):  # files this reader cannot open where Spark can (a store's settings)
        return None
    top = pc.max(found.column(0).cast(pa.timestamp("us", field.type.tz)).cast(pa.int64())).as_py()  # pyright: ignore[reportAttributeAccessIssue]
    return None if top is None else int(top)


def proves_all_on_time(bounds: list[VersionBounds], prior_max_us: int | None, delay_us: int) -> bool:
    """True when no record of these versions can be late or invalid for a null: every version's earliest
    event time is above the highest watermark the earlier versions can have set, and no key or event time
    is null. (Non-insert changes are excluded by :func:`read`; the event-time guards are checked by the
    caller.)"""
    running_ceil = prior_max_us
    for b in bounds:
        if b.nulls:
            return False
        if b.min_floor_us is None:
            continue
        if running_ceil is not None and b.min_floor_us <= running_ceil - delay_us:
            return False
        ceil = b.max_ceil_us
        running_ceil = ceil if running_ceil is None else max(running_ceil, ceil)  # pyright: ignore[reportArgumentType]
    return True
