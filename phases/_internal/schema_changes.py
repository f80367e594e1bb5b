"""Source schema changes during the live phase: take them up, or stop with an error that says what to do.

An added nullable column needs nothing for the aggregations: the change feed carries it, the quarantine
keeps it in the record, the operator ignores columns it does not use. Operators that keep whole input rows
(interval join, co-group) take it up: the live phase adds it to the rows in their state table and, for a
join, to the sink's columns (the rows held from before the change have it null).

A Delta type widening (``int`` → ``bigint``, ``float`` →
``double``, an integer type → ``double``, ``date`` → ``timestamp_ntz``) changes the operator's buffer and
output types: the live phase widens the same columns of its own state table and of the sink (Delta type
widening, the ``typeWidening`` table feature; readers of the sink need a Delta reader that knows it). A
change the operator cannot take (its expressions no longer resolve, or a column would have to narrow or
change kind) raises :class:`SchemaChangeError`, naming the columns, the change and the way out. Type
changes Delta itself refuses never reach the live phase: they stay Delta's error on the writer's side.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from phases._internal.errors import SchemaChangeError
from phases._internal.storage import tables

# (from, to) type names that Delta's type widening allows and that the live phase applies to its tables.
WIDENINGS = {
    ("byte", "short"),
    ("byte", "integer"),
    ("byte", "long"),
    ("short", "integer"),
    ("short", "long"),
    ("integer", "long"),
    ("float", "double"),
    ("byte", "double"),
    ("short", "double"),
    ("integer", "double"),
    ("date", "timestamp_ntz"),
}

# Markers of Delta's streaming source stopping on a schema change (the documented remedy is a restart).
# A Kafka source's Avro values of a schema version registered while the query ran stop it the same way
# (phases._internal.sources.avro_values.NEW_VERSION_MARKER).
SCHEMA_CHANGE_MARKERS = (
    "DELTA_SCHEMA_CHANGED",
    "DELTA_STREAMING_METADATA_EVOLUTION",
    "Detected schema change",
    "PHASES_NEW_SCHEMA_VERSION",
)


def is_schema_change_stop(exc: BaseException | None) -> bool:
    """True when a streaming query stopped because Delta's source saw a schema change."""
    return exc is not None and any(m in str(exc) for m in SCHEMA_CHANGE_MARKERS)


def way_out(pipeline: str) -> str:
    return (
        f"To proceed: change the source back to a type the pipeline takes, or adapt pipeline {pipeline!r} (its "
        "aggregations) and run the backlog again with BacklogRunner(...).run(reset=True); the live phase "
        "resumes from its checkpoint once it can take the change"
    )


def changes(spark: SparkSession, path: str, wanted: T.StructType, sources: dict[str, str]) -> list[str] | None:
    """What differs between the table at ``path`` and ``wanted``, naming the source column behind each; None when
    there is no table at ``path``."""
    if not tables.exists(spark, path):
        return None
    current = {f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
    out = []
    for field in wanted.fields:
        have = current.get(field.name)
        if have is not None and not _same_type(have, field.dataType):
            origin = f"source column {sources[field.name]!r}" if field.name in sources else f"column {field.name!r}"
            out.append(f"{origin}: {have.simpleString()} -> {field.dataType.simpleString()}")
    return out


def take_up(
    spark: SparkSession,
    path: str,
    wanted: T.StructType,
    what: str,
    pipeline: str,
    sources: dict[str, str] | None = None,
) -> list[str]:
    """Brings the Delta table at ``path`` to the ``wanted`` schema (the operator's state or outputs for the
    sources' current schemas): widens columns, and adds the columns and nested struct fields (e.g. a new
    source column inside the rows a two-input operator holds) the table lacks. Returns the changes made,
    e.g. ``"hi: int -> bigint"``. ``sources`` maps a table column to the source column it derives from (for
    the error message)."""
    current = spark.read.format("delta").load(path).schema
    widen, add, refused = [], [], []
    for field in wanted.fields:
        have = current[field.name].dataType if field.name in current.fieldNames() else None
        if have is None:
            add.append((f"`{field.name}`", field.dataType))
            continue
        nested = _nested_changes(have, field.dataType, f"`{field.name}`")
        if nested is not None:
            add.extend(nested[0])
            widen.extend(nested[1])
            continue
        origin = (sources or {}).get(field.name)
        change = f"{field.name}: {have.simpleString()} -> {field.dataType.simpleString()}"
        refused.append(change + (f" (from source column {origin!r})" if origin else ""))
    if refused:
        raise SchemaChangeError(
            f"pipeline {pipeline!r}: the source's schema changed and the {what} {path} cannot follow: "
            f"{'; '.join(refused)} is not a widening its columns can take. {way_out(pipeline)}"
        )
    if widen:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        for column, dtype in widen:
            spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN {column} TYPE {dtype.simpleString()}")
    if add:
        columns = ", ".join(f"{column} {dtype.simpleString()}" for column, dtype in add)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
    return [f"{column.replace('`', '')}: widened to {dtype.simpleString()}" for column, dtype in widen] + [
        f"{column.replace('`', '')}: added" for column, _ in add
    ]


def _nested_changes(have: T.DataType, want: T.DataType, path: str) -> tuple[list, list] | None:
    """What ``want`` changes in ``have`` inside structs and array elements: (struct fields added, leaf types
    widened), each as (column path, type); None when anything else differs (a field removed, renamed or
    moved, or a type change that is no widening)."""
    if isinstance(have, T.ArrayType) and isinstance(want, T.ArrayType):
        return _nested_changes(have.elementType, want.elementType, f"{path}.element")
    if not (isinstance(have, T.StructType) and isinstance(want, T.StructType)):
        if _same_type(have, want):
            return [], []
        if (have.typeName(), want.typeName()) in WIDENINGS:
            return [], [(path, want)]
        return None
    names = have.fieldNames()
    if names != want.fieldNames()[: len(names)]:
        return None
    added: list = []
    widened: list = []
    for field in want.fields:
        child = f"{path}.`{field.name}`"
        if field.name not in names:
            added.append((child, field.dataType))
            continue
        more = _nested_changes(have[field.name].dataType, field.dataType, child)
        if more is None:
            return None
        added.extend(more[0])
        widened.extend(more[1])
    return added, widened


def _same_type(a: T.DataType, b: T.DataType) -> bool:
    """Equal types, nullability of nested elements aside (Delta keeps what the first write had)."""
    return a.simpleString() == b.simpleString()
