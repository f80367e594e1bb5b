"""The pipeline definition: one declaration that both phases run.

Validated at construction; messages name the field and the valid values. Only the parts that shape the
per-key state go into the fingerprint (see :meth:`Pipeline.state_spec`), so moving a sink or changing a
trigger interval does not invalidate a handoff manifest, while changing a key or an aggregation does.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_serializer, model_validator

from phases.definition.model import SettingsModel
from phases.storage import uris

# Bumped whenever the layout of the state table or the meaning of its columns changes.
STATE_SCHEMA_VERSION = 1
# Bumped whenever the keyed-aggregation logic changes in a way that changes results.
OPERATOR_VERSION = 1

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TEAM = re.compile(r"^team:[A-Za-z0-9_.\- ]+$")
_TAG_VALUE = re.compile(r"^[A-Za-z0-9_.\-]{0,63}$")
_TAG_KEY = re.compile(r"^([A-Za-z0-9_.\-]{1,63}/)?[A-Za-z0-9_.\-]{1,63}$")
# Column names the engine adds to its own tables; a user column may not start with this.
RESERVED_PREFIX = "_"


class _Model(SettingsModel):
    """A part of a pipeline definition (invalid values raise DefinitionError)."""


class OperatorModel(_Model):
    """The stream operator of a pipeline, one model per kind (``kind`` names it). Each declares the shape the
    pipeline's validation needs; what the kind does with it lives in :mod:`phases.operators`."""

    kind: str
    two_inputs: ClassVar[bool] = False  # joins the pipeline's source with a second Delta source (``right``)
    windowed: ClassVar[bool] = False  # state and sink rows are identified by the window bounds too
    needs_ms_delay: ClassVar[bool] = False  # uses Spark's millisecond-resolution watermark arithmetic
    takes_increments: ClassVar[bool] = False  # a mergeable state: catch-up increments, daily slices
    no_increments_because: ClassVar[str] = ""  # why not, for the error


class AggKind(StrEnum):
    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    REDUCE = "reduce"


class Aggregation(_Model):
    """One output column of a keyed aggregation.

    ``reduce`` takes a Spark SQL expression over ``acc`` and ``x`` that must be associative and
    commutative (like any distributed reduce): the engine folds values in no fixed order, and in the
    live phase it folds the backlog's partial result together with the live values.
    """

    name: str
    kind: AggKind
    column: str | None = Field(None, description="Input column; optional for count (counts rows).")
    reduce: str | None = Field(None, description="For kind=reduce: SQL over `acc` and `x`, e.g. 'acc * x'.")

    @field_validator("name", "column")
    @classmethod
    def _identifier(cls, v: str | None) -> str | None:
        if v is not None and not _IDENTIFIER.match(v):
            raise ValueError(f"{v!r} is not a column identifier (letters, digits, '_'; not a digit first)")
        if v is not None and v.startswith(RESERVED_PREFIX):
            raise ValueError(f"{v!r} starts with {RESERVED_PREFIX!r}, which is reserved for engine columns")
        return v

    @model_validator(mode="after")
    def _kind_fields(self) -> Aggregation:
        if self.kind is not AggKind.COUNT and self.column is None:
            raise ValueError(f"aggregation {self.name!r}: kind {self.kind.value!r} needs a 'column'")
        if self.kind is AggKind.REDUCE:
            if not self.reduce or not ({"acc", "x"} <= set(re.findall(r"[A-Za-z_]+", self.reduce))):
                raise ValueError(
                    f"aggregation {self.name!r}: kind 'reduce' needs 'reduce', a SQL expression that uses "
                    "both `acc` and `x` (e.g. 'acc * x', 'greatest(acc, x)')"
                )
            problem = sql_expression_problem(self.reduce)
            if problem is not None:
                raise ValueError(
                    f"aggregation {self.name!r}: reduce {self.reduce!r} is not a Spark SQL expression: {problem}"
                )
        elif self.reduce is not None:
            raise ValueError(f"aggregation {self.name!r}: 'reduce' is only valid with kind 'reduce'")
        return self


def sql_expression_problem(text: str) -> str | None:
    """What Spark's SQL parser says is wrong with the expression ``text`` (None: it parses). Needs an active
    SparkSession (parsing runs no job); without one, None: the operator's logic parses it again before any work."""
    from pyspark.errors import ParseException
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return None
    try:  # in parentheses, as the engine embeds it: 'acc +* x' alone would parse as 'acc + *' aliased 'x'
        spark._jsparkSession.sessionState().sqlParser().parseExpression(f"({text})")
    except ParseException as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return " ".join(lines[:2])
    return None


def _unique_names(aggregations: list[Aggregation]) -> list[Aggregation]:
    names = [a.name for a in aggregations]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"aggregation names must be unique; repeated: {dupes}")
    return aggregations


class KeyedAggregate(OperatorModel):
    """Keyed aggregation: one output row per key, updated as records arrive."""

    kind: Literal["keyed_aggregate"] = "keyed_aggregate"
    takes_increments: ClassVar[bool] = True
    aggregations: list[Aggregation] = Field(min_length=1)

    @field_validator("aggregations")
    @classmethod
    def _names(cls, v: list[Aggregation]) -> list[Aggregation]:
        return _unique_names(v)


WINDOW_START = "window_start"
WINDOW_END = "window_end"


class Window(_Model):
    """An event-time window: tumbling (``slide`` None) or sliding (``slide`` < ``size``).

    Windows are aligned to the Unix epoch like Spark's ``window()``: ``[k*slide, k*slide + size)``. A record
    belongs to every window that contains its event time (``size / slide`` of them when sliding).
    """

    size: timedelta
    slide: timedelta | None = None

    @field_validator("size")
    @classmethod
    def _size(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError(f"window size must be > 0; got {v}")
        if v % timedelta(milliseconds=1):
            raise ValueError(f"window size must be a whole number of milliseconds; got {v}")
        return v

    @model_validator(mode="after")
    def _slide(self) -> Window:
        if self.slide is not None:
            if self.slide <= timedelta(0) or self.slide > self.size:
                raise ValueError(f"window slide must be > 0 and <= size ({self.size}); got {self.slide}")
            if self.size % self.slide:
                raise ValueError(
                    f"window size ({self.size}) must be a whole multiple of slide ({self.slide}), so that every "
                    "record falls into the same number of windows"
                )
        return self

    @property
    def effective_slide(self) -> timedelta:
        return self.slide or self.size

    def spark_duration(self, value: timedelta) -> str:
        return f"{int(value / timedelta(milliseconds=1))} milliseconds"


class WindowedAggregate(OperatorModel):
    """Aggregations per key and event-time window; a window's row is emitted once, when the watermark
    passes its end (append semantics, like Structured Streaming's append mode).

    During the backlog no watermark advances per record; at the end of the backlog the windows whose end
    is <= the final backlog watermark are emitted (FLIP-327: event-time timers fire up to the last backlog
    watermark) and the open windows are handed over as state; they close in the live phase.
    """

    kind: Literal["window_aggregate"] = "window_aggregate"
    windowed: ClassVar[bool] = True
    takes_increments: ClassVar[bool] = True
    window: Window
    aggregations: list[Aggregation] = Field(min_length=1)

    @field_validator("aggregations")
    @classmethod
    def _names(cls, v: list[Aggregation]) -> list[Aggregation]:
        clash = sorted({a.name for a in _unique_names(v)} & {WINDOW_START, WINDOW_END})
        if clash:
            raise ValueError(f"aggregation names {clash} are reserved for the window's bounds")
        return v


class SessionAggregate(OperatorModel):
    """Aggregations per key and event-time *session*: a record opens ``[ts, ts + gap)`` and sessions that
    touch or overlap merge (Spark's ``session_window``). A session's row is emitted once, when the watermark
    passes its end (append semantics).

    The backlog emits the sessions the final backlog watermark closed and hands over the open ones (bounds +
    aggregation buffers); live, each open session re-enters Spark's session aggregation as one row whose
    own gap spans the whole session, so it merges with the live records exactly as its records would have.
    """

    kind: Literal["session_aggregate"] = "session_aggregate"
    windowed: ClassVar[bool] = True
    needs_ms_delay: ClassVar[bool] = True
    takes_increments: ClassVar[bool] = True
    gap: timedelta
    aggregations: list[Aggregation] = Field(min_length=1)

    @field_validator("gap")
    @classmethod
    def _gap(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError(f"session gap must be > 0; got {v}")
        if v % timedelta(microseconds=1):
            raise ValueError(f"session gap must be a whole number of microseconds; got {v}")
        return v

    @field_validator("aggregations")
    @classmethod
    def _names(cls, v: list[Aggregation]) -> list[Aggregation]:
        clash = sorted({a.name for a in _unique_names(v)} & {WINDOW_START, WINDOW_END})
        if clash:
            raise ValueError(f"aggregation names {clash} are reserved for the session's bounds")
        return v


class ProcessOperator(OperatorModel):
    """A keyed process function: user code with value/list/map state and event-time timers
    (:class:`phases.operators.process_function.KeyedProcessFunction`). Its output rows are appended to the sink.

    The backlog runs it over partitions sorted by key, version and event time, one key at a time, firing a
    key's timers up to the final backlog watermark at the end of the key (FLIP-140 / FLIP-327); the live
    phase runs the same function inside ``transformWithState``, seeded with the handed-over state and timers.
    """

    kind: Literal["process"] = "process"
    needs_ms_delay: ClassVar[bool] = True
    no_increments_because: ClassVar[str] = "keeps arbitrary per-key state that is not a mergeable aggregate"
    function: str = Field(description="Import path 'package.module:Class' of a KeyedProcessFunction subclass.")

    @field_validator("function")
    @classmethod
    def _import_path(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", v):
            raise ValueError(f"function {v!r} is not an import path like 'package.module:Class'")
        return v


def _whole_ms(v: timedelta, what: str) -> timedelta:
    if v % timedelta(milliseconds=1):
        raise ValueError(f"{what} must be a whole number of milliseconds; got {v}")
    return v


MAX_BUCKETS_PER_ROW = 1000  # interval join: buckets one left row may be repeated in


class IntervalJoin(OperatorModel):
    """Inner interval join of the pipeline's source (left) with a second Delta source (``right``, with the
    same key and event-time columns) on the keys: every pair with
    ``left.ts + lower <= right.ts <= left.ts + upper`` is emitted once. Output: the keys, the left columns and
    the right columns prefixed ``right_``. Each input's lateness follows its own versions (its own W(v)).

    The backlog joins the on-time rows of both inputs and hands over the rows that can still match a future
    row (left rows with ``ts + upper`` beyond the right's final watermark, and vice versa); each live
    micro-batch joins its new rows with each other and with the rows held in that state. Both phases match
    rows on the keys and on event-time buckets (``bucket``), so a key with many rows costs about what its
    matching pairs cost.
    """

    kind: Literal["interval_join"] = "interval_join"
    two_inputs: ClassVar[bool] = True
    needs_ms_delay: ClassVar[bool] = True
    no_increments_because: ClassVar[str] = "reads two sources whose versions are not cut together"
    right: DeltaSource
    lower: timedelta = Field(description="right.ts >= left.ts + lower (may be negative).")
    upper: timedelta = Field(description="right.ts <= left.ts + upper.")
    bucket: timedelta | None = Field(
        None,
        description="Width of the event-time buckets the join matches on besides the keys: each left row meets "
        "the right rows of the buckets its interval touches, so a key with many rows is not compared pair by "
        "pair. None: upper - lower (at least 1 ms), which puts a left row in at most two buckets. Changes no "
        "result; not part of the fingerprint.",
    )

    @field_validator("lower", "upper")
    @classmethod
    def _ms(cls, v: timedelta) -> timedelta:
        return _whole_ms(v, "interval bounds")

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: timedelta | None) -> timedelta | None:
        if v is not None and v <= timedelta(0):
            raise ValueError(f"interval_join: bucket must be > 0 (or None for upper - lower); got {v}")
        return None if v is None else _whole_ms(v, "bucket")

    @property
    def bucket_width(self) -> timedelta:
        """The bucket in use: ``bucket``, or ``upper - lower`` but at least 1 ms."""
        return self.bucket or max(self.upper - self.lower, timedelta(milliseconds=1))

    @model_validator(mode="after")
    def _order(self) -> IntervalJoin:
        if self.lower > self.upper:
            raise ValueError(f"interval_join: lower ({self.lower}) must be <= upper ({self.upper})")
        per_row = (self.upper - self.lower) // self.bucket_width + 1
        if per_row > MAX_BUCKETS_PER_ROW:
            raise ValueError(
                f"interval_join: bucket {self.bucket} puts a left row in up to {per_row} buckets "
                f"(upper - lower = {self.upper - self.lower}); at most {MAX_BUCKETS_PER_ROW} are allowed: "
                "choose a wider bucket, or None for upper - lower"
            )
        return self


class CoGroup(OperatorModel):
    """Co-group of the pipeline's source (left) and a second Delta source (``right``) per key and tumbling
    event-time window: once both inputs' watermarks passed a window's end, ``function(key, window_start,
    window_end, left_rows, right_rows)`` is called once with all of the window's on-time rows of each input
    (ordered by event time) and its rows (``output_schema``) are appended with the keys and window bounds.

    The backlog calls it for the windows both final backlog watermarks closed and hands the open windows'
    rows over; the live phase collects rows per window in Spark's state store (append mode) and calls the
    same function when Spark closes the window.
    """

    kind: Literal["co_group"] = "co_group"
    windowed: ClassVar[bool] = True
    two_inputs: ClassVar[bool] = True
    needs_ms_delay: ClassVar[bool] = True
    no_increments_because: ClassVar[str] = "reads two sources whose versions are not cut together"
    right: DeltaSource
    window: Window
    function: str = Field(description="Import path 'package.module:function'.")
    output_schema: str = Field(description="Spark DDL of the function's output columns.")

    @field_validator("window")
    @classmethod
    def _tumbling(cls, v: Window) -> Window:
        if v.slide is not None and v.slide != v.size:
            raise ValueError("co_group windows are tumbling: leave 'slide' unset")
        return v

    @field_validator("function")
    @classmethod
    def _import_path(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", v):
            raise ValueError(f"function {v!r} is not an import path like 'package.module:function'")
        return v


# --- steps before the stream operator, and end-of-stream (backlog-only) steps -------------------------


class Filter(_Model):
    """Keeps the records for which a Spark SQL condition holds (runs in both phases)."""

    kind: Literal["filter"] = "filter"
    condition: str = Field(min_length=1)


class Derive(_Model):
    """Adds (or replaces) a column computed by a Spark SQL expression over the record (both phases)."""

    kind: Literal["derive"] = "derive"
    name: str
    expression: str = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _IDENTIFIER.match(v) or v.startswith(RESERVED_PREFIX):
            raise ValueError(f"derived column {v!r} is not a column identifier without a leading '_'")
        return v


class MapPartition(_Model):
    """FLIP-380 ``mapPartition``: a function over all records of a partition at once (a pandas DataFrame in,
    a DataFrame with ``output_schema`` out), called once per partition after its input ended."""

    kind: Literal["map_partition"] = "map_partition"
    function: str = Field(description="Import path 'package.module:function'.")
    output_schema: str = Field(description="Spark DDL of the output, e.g. 'key string, n long'.")

    @field_validator("function")
    @classmethod
    def _import_path(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", v):
            raise ValueError(f"function {v!r} is not an import path like 'package.module:function'")
        return v


class SortPartition(_Model):
    """FLIP-380 ``sortPartition``: sorts each partition by columns or by a key function (one of the two)."""

    kind: Literal["sort_partition"] = "sort_partition"
    by: list[str] | None = None
    key: str | None = Field(None, description="Import path of a function row(dict) -> sort key.")
    descending: bool = False

    @model_validator(mode="after")
    def _one_of(self) -> SortPartition:
        if (self.by is None) == (self.key is None):
            raise ValueError("sort_partition needs exactly one of 'by' (columns) and 'key' (a key function)")
        if self.by is not None and not self.by:
            raise ValueError("sort_partition 'by' needs at least one column")
        return self


class AggregatePartition(_Model):
    """FLIP-380 ``aggregate``: the aggregations over each whole partition: one row per partition."""

    kind: Literal["aggregate_partition"] = "aggregate_partition"
    aggregations: list[Aggregation] = Field(min_length=1)

    @field_validator("aggregations")
    @classmethod
    def _names(cls, v: list[Aggregation]) -> list[Aggregation]:
        return _unique_names(v)


class ReducePartition(_Model):
    """FLIP-380 ``reduce``: folds one column of each partition with an associative, commutative expression."""

    kind: Literal["reduce_partition"] = "reduce_partition"
    name: str
    column: str
    reduce: str

    def as_aggregation(self) -> Aggregation:
        return Aggregation(name=self.name, kind=AggKind.REDUCE, column=self.column, reduce=self.reduce)


OPERATOR_MODELS = (KeyedAggregate, WindowedAggregate, SessionAggregate, ProcessOperator, IntervalJoin, CoGroup)
Operator = KeyedAggregate | WindowedAggregate | SessionAggregate | ProcessOperator | IntervalJoin | CoGroup

PartitionOperator = MapPartition | SortPartition | AggregatePartition | ReducePartition
FULL_PARTITION_KINDS = ("map_partition", "sort_partition", "aggregate_partition", "reduce_partition")


class EndOfStreamStep(_Model):
    """An end-of-stream ("full dam", FLIP-331) step: emits only after its input ended, so it runs as a
    blocking batch step over the backlog (versions 0..V) and writes a Delta table. Its operators run over
    each of ``partitions`` partitions of the valid backlog records (hash of ``partition_by``, default all
    columns), in order (FLIP-380 full-partition processing)."""

    name: str
    operators: list[PartitionOperator] = Field(min_length=1)
    partitions: int = Field(1, ge=1, le=10_000)
    partition_by: list[str] | None = None
    output: DeltaSink

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _IDENTIFIER.match(v):
            raise ValueError(f"{v!r} is not a valid step name (letters, digits, '_'; not a digit first)")
        return v

    @field_validator("operators")
    @classmethod
    def _aggregate_last(cls, v: list) -> list:
        for i, op in enumerate(v[:-1]):
            if op.kind in ("aggregate_partition", "reduce_partition"):
                raise ValueError(
                    f"operator {i} ({op.kind}) reduces each partition to one row; it must be the step's last operator"
                )
        return v


class Enrichment(_Model):
    """Joins every record the stream operator sees (backlog and live) with an end-of-stream step's output
    on ``on`` (left join), adding ``columns``. The live phase starts only after that step finished at the
    handoff's source version."""

    step: str
    on: list[str] = Field(min_length=1)
    columns: list[str] = Field(min_length=1)


class DeltaSource(_Model):
    """A Delta table read as backlog (snapshot at version V) then live (versions V+1, V+2, ...).

    The table must be append-only and have the change data feed enabled (``delta.enableChangeDataFeed =
    true``) from its first version, or from ``starting_version``: the change feed gives each record its
    commit version, which defines arrival order and therefore lateness (see :mod:`phases.lateness`).
    """

    kind: Literal["delta"] = "delta"
    path: str = Field(min_length=1)
    starting_version: int = Field(
        0,
        ge=0,
        description="For a table whose change data feed was turned on after it was created: versions "
        "0..starting_version-1 are read as one snapshot of version starting_version-1 (one arrival, with that "
        "version's commit time), later versions through the change feed. 0: the feed from the first version.",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        # The default leaves the dump (and so every existing pipeline's fingerprint) as it was.
        data = handler(self)
        if isinstance(data, dict) and data.get("starting_version") == 0:
            data.pop("starting_version")
        return data

    @property
    def location(self) -> str:
        return self.path

    def state_spec(self) -> dict:
        return self.model_dump(mode="json")


class ValueFormat(StrEnum):
    JSON = "json"


# A DDL field list as Spark writes it: "key string, ts timestamp, value bigint" (types are checked by Spark).
_DDL_FIELD = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s+\S.*$")


def ddl_field_names(ddl: str) -> list[str]:
    """The top-level field names of a DDL field list (commas inside ``<...>``/``(...)`` do not split)."""
    names, depth, start = [], 0, 0
    parts = []
    for i, ch in enumerate(ddl):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(ddl[start:i])
            start = i + 1
    parts.append(ddl[start:])
    for part in parts:
        match = _DDL_FIELD.match(part)
        if match is None:
            raise ValueError(f"{part.strip()!r} is not a field of a DDL schema ('name type', e.g. 'ts timestamp')")
        names.append(match.group(1))
    return names


_OWNED_KAFKA_OPTIONS = frozenset(
    {
        "subscribe",
        "assign",
        "subscribePattern",
        "startingOffsets",
        "endingOffsets",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "failOnDataLoss",
        "maxOffsetsPerTrigger",
        "kafka.bootstrap.servers",
    }
)


class KafkaSource(_Model):
    """A Kafka topic read as backlog (every partition from its earliest offset to the end offsets captured when
    the backlog starts, a Spark batch job) then live (from exactly those offsets; partitions added later from
    their start).

    Kafka has no commit versions, so the framework defines arrival order by **arrival chunks** that play their
    role (:mod:`phases.sources.kafka`): the backlog is cut into fixed-size slices of ``backlog_chunk_records``
    offsets per partition, and each live micro-batch is one chunk; both are recorded (manifest, progress log).
    The record's Kafka timestamp stands for its version's commit time (the ``max_future`` guard).
    """

    kind: Literal["kafka"] = "kafka"
    topic: str = Field(min_length=1)
    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port...]; not part of the fingerprint")
    value_format: ValueFormat = ValueFormat.JSON
    value_schema: str = Field(
        min_length=1,
        description="The record's fields as a Spark DDL list, e.g. 'key string, ts timestamp, value bigint'. A value "
        "that is not JSON of this shape is quarantined (reason 'undecodable'), with its topic, partition and offset.",
    )
    backlog_chunk_records: int = Field(
        100_000, gt=0, description="Arrival chunks of the backlog: this many offsets of each partition per chunk."
    )
    options: dict[str, str] = Field(
        default_factory=dict,
        description="Options of Spark's Kafka source, as Spark names them: Kafka consumer settings with a 'kafka.' "
        "prefix ('kafka.security.protocol', 'kafka.default.api.timeout.ms') and the source's own "
        "('kafkaConsumer.pollTimeoutMs', 'fetchOffset.numRetries'). Not part of the fingerprint.",
    )
    client_options: dict[str, str] = Field(
        default_factory=dict,
        description="Settings of the confluent-kafka (librdkafka) client that reads end offsets for the backlog's "
        "chunk plan and the switch sensor's lag, e.g. {'security.protocol': 'SSL'}. Not part of the fingerprint.",
    )

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, str]) -> dict[str, str]:
        owned = sorted(k for k in v if k in _OWNED_KAFKA_OPTIONS)
        if owned:
            raise ValueError(
                f"options {owned} are set by the framework (the backlog's end offsets, the live phase's start, "
                f"failing on lost offsets); the options it owns: {sorted(_OWNED_KAFKA_OPTIONS)}"
            )
        return v

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", v):
            raise ValueError(f"{v!r} is not a Kafka topic name (letters, digits, '.', '_', '-'; at most 249)")
        return v

    @field_validator("value_schema")
    @classmethod
    def _schema(cls, v: str) -> str:
        names = ddl_field_names(v)
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"value_schema repeats fields {dupes}")
        reserved = [n for n in names if n.startswith(RESERVED_PREFIX)]
        if reserved:
            raise ValueError(f"value_schema fields {reserved} start with {RESERVED_PREFIX!r}, reserved for the engine")
        return v

    @property
    def location(self) -> str:
        return f"kafka topic {self.topic!r} at {self.bootstrap_servers}"

    @property
    def field_names(self) -> list[str]:
        return ddl_field_names(self.value_schema)

    def state_spec(self) -> dict:
        return self.model_dump(mode="json", exclude={"bootstrap_servers", "options", "client_options"})


class KafkaHandoff(_Model):
    """Where a hybrid source hands over from its archive to its topic: explicit end offsets per partition, or a
    timestamp resolved to offsets when the backlog starts (the first offset of each partition whose Kafka
    timestamp is >= it; Kafka's ``offsetsForTimes``). Either way the resolved offsets are recorded in the handoff
    manifest, and the live phase starts at exactly them."""

    offsets: dict[int, int] | None = Field(
        None, description="partition -> the first offset the live phase reads (a partition left out: from 0)."
    )
    timestamp: datetime | None = Field(None, description="Resolved to offsets per partition; naive is UTC.")

    @field_validator("timestamp")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            from datetime import UTC

            return v.replace(tzinfo=UTC)
        return v

    @model_validator(mode="after")
    def _one(self) -> KafkaHandoff:
        if (self.offsets is None) == (self.timestamp is None):
            raise ValueError("handoff: give exactly one of 'offsets' (partition -> offset) or 'timestamp'")
        if self.offsets is not None and any(p < 0 or o < 0 for p, o in self.offsets.items()):
            raise ValueError(f"handoff.offsets: partitions and offsets must be >= 0; got {self.offsets}")
        return self


class FileFormat(StrEnum):
    PARQUET = "parquet"
    JSON = "json"


class FileArchive(_Model):
    """A folder of Parquet or JSON (JSON Lines) files as a hybrid source's backlog. Arrival order: the files by
    name, one file one version (0, 1, ...); a file's modification time stands for its commit time. Names
    starting with '_' or '.' are skipped (Spark's convention for metadata files). The records are read with the
    live topic's declared value schema (plus the archive's Kafka position columns)."""

    kind: Literal["files"] = "files"
    path: str = Field(min_length=1)
    format: FileFormat = FileFormat.PARQUET

    @property
    def location(self) -> str:
        return f"{self.format.value} files in {self.path}"


def _archive_kind(value) -> str:
    """A hybrid source's archive kind; a Delta table when not given."""
    if isinstance(value, dict):
        return value.get("kind", "delta")
    return getattr(value, "kind", "delta")


class HybridSource(_Model):
    """FLIP-327's first example (Flink's ``HybridSource``): an archive (a Delta table, or a folder of Parquet or
    JSON files) as the backlog, then a Kafka topic as the live input, handed over at an explicit, recorded
    position.

    No record is in both phases and none in neither, even when the archive and the topic overlap: the archive
    keeps the Kafka position of each record it holds (``archive_partition_column`` / ``archive_offset_column``,
    as Kafka Connect's sinks write them) and the backlog takes only records before the handoff offsets, the live
    phase everything from them. Without those columns the archive is taken whole and the handoff offsets must be
    exactly where it ends. Arrival order: the archive's versions, then one arrival chunk per live micro-batch.
    """

    kind: Literal["hybrid"] = "hybrid"
    backlog: Annotated[
        Annotated[DeltaSource, Tag("delta")] | Annotated[FileArchive, Tag("files")],
        Discriminator(_archive_kind),
    ] = Field(description="The archive: a Delta table ({'path': ...}) or files ({'kind': 'files', 'path': ...}).")
    live: KafkaSource
    handoff: KafkaHandoff
    archive_partition_column: str | None = None
    archive_offset_column: str | None = None

    @model_validator(mode="after")
    def _columns(self) -> HybridSource:
        pair = (self.archive_partition_column, self.archive_offset_column)
        if (pair[0] is None) != (pair[1] is None):
            raise ValueError("archive_partition_column and archive_offset_column go together: give both or neither")
        if self.handoff.timestamp is not None and pair[0] is None:
            raise ValueError(
                "a handoff by timestamp resolves to offsets per partition, and the archive can be cut there only by "
                "its records' Kafka positions: set archive_partition_column and archive_offset_column, or hand off "
                "at explicit offsets where the archive ends"
            )
        return self

    @property
    def location(self) -> str:
        return f"{self.backlog.location}, then {self.live.location}"

    def state_spec(self) -> dict:
        data = self.model_dump(mode="json", exclude={"live"})
        data["live"] = self.live.state_spec()
        return data


class DeltaSink(_Model):
    """The pipeline's result table. A keyed aggregation upserts one row per key; windows, sessions, process
    functions, interval joins and co-groups append each result once."""

    kind: Literal["delta"] = "delta"
    path: str = Field(min_length=1)


class Locations(_Model):
    """Where the engine keeps its own tables. Everything lives under ``root`` unless overridden."""

    root: str = Field(min_length=1)

    def _sub(self, name: str) -> str:
        return uris.join(self.root, name)

    @property
    def state_root(self) -> str:
        return self._sub("state")

    @property
    def manifests(self) -> str:
        return self._sub("manifests")

    @property
    def quarantine(self) -> str:
        return self._sub("quarantine")

    @property
    def checkpoints(self) -> str:
        return self._sub("checkpoints")

    def live_run(self, run_name: str) -> str:
        """The live phase's own tables of one run (its progress and the held-back part of a split version)."""
        return uris.join(self.root, "live", run_name)


class Maintenance(_Model):
    """How the engine keeps its tables from growing without bound (:mod:`phases.storage.maintenance`). Not part of
    the fingerprint: it shapes no state."""

    auto_compact: bool = Field(
        True, description="Delta auto compaction on the tables every live micro-batch rewrites (state, sink)."
    )
    retain: timedelta = Field(
        timedelta(days=7),
        description="VACUUM retention of the engine's tables and the sink; Delta refuses less than its 7-day "
        "safety interval unless spark.databricks.delta.retentionDurationCheck.enabled is false.",
    )


DEFAULT_MAX_FUTURE = timedelta(days=1)


class Pipeline(_Model):
    """Sources + key + event time + watermark delay + operator + sink + settings, declared once."""

    name: str
    source: DeltaSource | KafkaSource | HybridSource = Field(discriminator="kind")
    key_columns: list[str] = Field(min_length=1)
    event_time: str
    watermark_delay: timedelta = Field(description="How far event time may lag the newest record.")
    operator: Operator = Field(discriminator="kind")
    steps: list[Filter | Derive | PartitionOperator] = Field(
        default_factory=list, description="Record steps before the operator; they run in both phases."
    )
    end_of_stream: list[EndOfStreamStep] = Field(
        default_factory=list, description="Backlog-only blocking steps (full dam / full partition)."
    )
    enrich: Enrichment | None = None
    sink: DeltaSink
    locations: Locations
    checkpoint_interval: timedelta = Field(
        timedelta(seconds=5), description="Live phase: micro-batch trigger (and checkpoint) interval."
    )
    maintenance: Maintenance = Field(default_factory=Maintenance)
    max_future: timedelta | None = Field(
        DEFAULT_MAX_FUTURE,
        description="A record whose event time is more than this after its source version's commit time is "
        "quarantined (reason 'future') and does not move the watermark, so one far-future event cannot turn "
        "every later record late. None turns the guard off.",
    )
    min_event_time: datetime | None = Field(
        None,
        description="A record whose event time is before this is quarantined (reason 'past'). None: no bound. "
        "Naive datetimes are UTC.",
    )
    checkpoint_interval_during_backlog: timedelta = Field(
        timedelta(0),
        description="FLIP-309: 0 = the backlog runs as one batch job with no checkpoints; otherwise (>= "
        "checkpoint_interval) it commits a handoff after each increment of at most this much source time "
        "(commit time), so a crash re-runs at most one increment.",
    )
    # Catalog only (what an orchestrator shows of the pipeline's tables); not part of the fingerprint.
    description: str | None = Field(None, description="What the pipeline computes, shown on each of its assets.")
    owners: list[str] = Field(
        default_factory=list, description="Who owns the pipeline's tables: e-mail addresses or 'team:<name>'."
    )
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="Labels of the pipeline's tables (key: letters, digits, '_', '-', '.', optionally one "
        "'prefix/'; value: at most 63 of the same characters, or empty).",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _IDENTIFIER.match(v):
            raise ValueError(f"{v!r} is not a valid pipeline name (letters, digits, '_'; not a digit first)")
        return v

    @field_validator("key_columns")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        for col in v:
            if not _IDENTIFIER.match(col) or col.startswith(RESERVED_PREFIX):
                raise ValueError(f"key column {col!r} is not a column identifier without a leading '_'")
        if len(set(v)) != len(v):
            raise ValueError(f"key columns must be unique; got {v}")
        return v

    @field_validator("event_time")
    @classmethod
    def _event_time(cls, v: str) -> str:
        if not _IDENTIFIER.match(v) or v.startswith(RESERVED_PREFIX):
            raise ValueError(f"event_time {v!r} is not a column identifier without a leading '_'")
        return v

    @field_validator("watermark_delay")
    @classmethod
    def _delay(cls, v: timedelta) -> timedelta:
        if v < timedelta(0):
            raise ValueError(f"watermark_delay must be >= 0; got {v}")
        return v

    @field_validator("max_future")
    @classmethod
    def _max_future(cls, v: timedelta | None) -> timedelta | None:
        if v is not None and v < timedelta(0):
            raise ValueError(f"max_future must be >= 0 or None (no guard); got {v}")
        return v

    @field_validator("min_event_time")
    @classmethod
    def _min_event_time(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            from datetime import UTC

            return v.replace(tzinfo=UTC)
        return v

    @field_validator("checkpoint_interval")
    @classmethod
    def _interval(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError(f"checkpoint_interval must be > 0; got {v}")
        return v

    @field_validator("owners")
    @classmethod
    def _owners(cls, v: list[str]) -> list[str]:
        for owner in v:
            if not (_EMAIL.match(owner) or _TEAM.match(owner)):
                raise ValueError(
                    f"owner {owner!r} is neither an e-mail address nor 'team:<name>' (e.g. 'team:data-eng')"
                )
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _TAG_KEY.match(key):
                raise ValueError(
                    f"tag key {key!r} is not valid: letters, digits, '_', '-', '.', at most 63 of them, optionally "
                    "after one 'prefix/'"
                )
            if not _TAG_VALUE.match(value):
                raise ValueError(
                    f"tag {key!r}: value {value!r} is not valid: at most 63 letters, digits, '_', '-', '.'"
                )
        return v

    @model_validator(mode="after")
    def _cross_fields(self) -> Pipeline:
        backlog, live = self.checkpoint_interval_during_backlog, self.checkpoint_interval
        if backlog != timedelta(0) and backlog < live:
            raise ValueError(
                f"checkpoint_interval_during_backlog ({backlog.total_seconds()}s) must be 0 (no checkpoints "
                f"during backlog) or >= checkpoint_interval ({live.total_seconds()}s)"
            )
        kind = self.operator
        if isinstance(self.source, KafkaSource | HybridSource):
            if kind.two_inputs:
                raise ValueError(
                    f"{self.operator.kind} reads two Delta sources; a Kafka source as its input is not supported yet. "
                    "Land the topic in a Delta table first (or use a single-input operator)"
                )
            if backlog != timedelta(0):
                raise ValueError(
                    "checkpoint_interval_during_backlog > 0 builds the backlog from increments, which a "
                    f"{self.source.kind} source does not support (a Kafka backlog has no commit times; a hybrid "
                    "source's backlog ends at its handoff); set it to 0"
                )
        if backlog != timedelta(0) and not self.supports_increments:
            what = f"end_of_stream steps {[s.name for s in self.end_of_stream]}" if self.end_of_stream else ""
            what = what or f"operator kind {self.operator.kind!r}"
            able = [model.model_fields["kind"].default for model in OPERATOR_MODELS if model.takes_increments]
            raise ValueError(
                f"checkpoint_interval_during_backlog ({backlog.total_seconds()}s) makes the backlog commit in "
                f"increments of at most that much source time, and {what} cannot be built from increments "
                f"(increments take {', '.join(able)} without end_of_stream steps); set it to 0"
            )
        outputs = [a.name for a in getattr(self.operator, "aggregations", [])]
        clash = sorted(set(outputs) & set(self.key_columns))
        if clash:
            raise ValueError(f"aggregation names {clash} clash with key columns {self.key_columns}")
        for i, step in enumerate(self.steps):
            if step.kind in FULL_PARTITION_KINDS:
                raise ValueError(
                    f"steps[{i}] ({step.kind}) is a full-partition operator: it emits only after its input "
                    "ends, and the live phase's input never ends. Run it in an end_of_stream step (backlog "
                    "only) and join its output with 'enrich'."
                )
        names = [s.name for s in self.end_of_stream]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"end_of_stream step names must be unique; repeated: {dupes}")
        if self.enrich is not None and self.enrich.step not in names:
            raise ValueError(f"enrich.step {self.enrich.step!r} is not an end_of_stream step; steps: {names}")
        if kind.windowed:
            clash = sorted(set(self.key_columns) & {WINDOW_START, WINDOW_END})
            if clash:
                raise ValueError(f"key columns {clash} are reserved for the window's bounds")
        if kind.two_inputs:
            used = [f for f in ("steps", "end_of_stream", "enrich") if getattr(self, f)]
            if used:
                raise ValueError(
                    f"{self.operator.kind} has two inputs; {used} would apply to one of them only and are not "
                    "supported with two-input operators. Prepare the inputs upstream."
                )
            if self.operator.right.path == self.source.path:
                raise ValueError(f"{self.operator.kind}: right source is the pipeline's own source {self.source.path}")
        if kind.needs_ms_delay and self.watermark_delay % timedelta(milliseconds=1):
            raise ValueError(
                f"watermark_delay must be a whole number of milliseconds for a {self.operator.kind} operator "
                f"(Spark's watermark has millisecond resolution); got {self.watermark_delay}"
            )
        if self.event_time in self.key_columns:
            raise ValueError(f"event_time {self.event_time!r} cannot also be a key column")
        return self

    @property
    def state_keys(self) -> list[str]:
        """Columns that identify a row of the state (and of the sink): the keys, plus the window bounds."""
        if self.operator.windowed:
            return [*self.key_columns, WINDOW_START, WINDOW_END]
        return list(self.key_columns)

    @property
    def supports_increments(self) -> bool:
        """Whether the backlog can be built from pieces (catch-up increments, daily slices): only when its
        state is a mergeable aggregate, no end-of-stream step needs the whole backlog at once, and the source is a
        Delta table (a Kafka or hybrid source's backlog runs as one job up to its handoff position)."""
        return not self.end_of_stream and self.operator.takes_increments and self.source.kind == "delta"

    @property
    def right_source(self) -> DeltaSource | None:
        """The second input of a two-input operator."""
        return self.operator.right if self.operator.two_inputs else None

    @property
    def delay_us(self) -> int:
        return int(self.watermark_delay / timedelta(microseconds=1))

    @property
    def max_future_us(self) -> int | None:
        return None if self.max_future is None else int(self.max_future / timedelta(microseconds=1))

    @property
    def min_event_time_us(self) -> int | None:
        if self.min_event_time is None:
            return None
        return int(
            (self.min_event_time - datetime(1970, 1, 1, tzinfo=self.min_event_time.tzinfo)) / timedelta(microseconds=1)
        )

    def state_spec(self) -> dict:
        """The part of the definition that shapes the state; its hash is the pipeline fingerprint."""
        return {
            "name": self.name,
            "source": self.source.state_spec(),
            "key_columns": list(self.key_columns),
            "event_time": self.event_time,
            "watermark_delay_us": self.delay_us,
            "operator": self.operator.model_dump(mode="json", exclude={"bucket"}),  # a join bucket shapes no state
            # Only when used, so that pipelines without them keep their fingerprint.
            **({"steps": [step.model_dump(mode="json") for step in self.steps]} if self.steps else {}),
            **(
                {"end_of_stream": [step.model_dump(mode="json") for step in self.end_of_stream]}
                if self.end_of_stream
                else {}
            ),
            **({"enrich": self.enrich.model_dump(mode="json")} if self.enrich else {}),
            **({"max_future_us": self.max_future_us} if self.max_future != DEFAULT_MAX_FUTURE else {}),
            **({"min_event_time_us": self.min_event_time_us} if self.min_event_time is not None else {}),
            "state_schema_version": STATE_SCHEMA_VERSION,
            "operator_version": OPERATOR_VERSION,
        }

    def fingerprint(self) -> str:
        blob = json.dumps(self.state_spec(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:32]
