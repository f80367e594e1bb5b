"""The stream operator of a pipeline, one model per kind: keyed, windowed and session aggregations, keyed
process functions, the interval join and the co-group. Each declares the shape the pipeline's validation needs
(:class:`OperatorModel`); what the kind does lives in :mod:`phases._internal.operators`."""

from __future__ import annotations

import re
from datetime import timedelta
from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from phases._internal import spark_internals
from phases._internal.definition.fields import (
    IDENTIFIER,
    RESERVED_PREFIX,
    ClassImportPath,
    FunctionImportPath,
    _Model,
    positive,
    whole_ms,
)
from phases._internal.definition.sources import DeltaSource, HybridSource, KafkaSource

# Bumped whenever the keyed-aggregation logic changes in a way that changes results.
OPERATOR_VERSION = 1


class OperatorModel(_Model):
    """The stream operator of a pipeline, one model per kind (``kind`` names it). Each declares the shape the
    pipeline's validation needs; what the kind does with it lives in :mod:`phases._internal.operators`."""

    kind: str
    two_inputs: ClassVar[bool] = False  # joins the pipeline's source with a second source (``right``)
    windowed: ClassVar[bool] = False  # state and sink rows are identified by the window bounds too
    needs_ms_delay: ClassVar[bool] = False  # uses Spark's millisecond-resolution watermark arithmetic
    takes_increments: ClassVar[bool] = False  # a mergeable state: catch-up increments, daily slices
    no_increments_because: ClassVar[str] = ""  # why not, for the error
    upserts: ClassVar[bool] = False  # one sink row per key, replaced as it changes (sink modes upsert / changelog)


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
    column: str | None = Field(default=None, description="Input column; optional for count (counts rows).")
    reduce: str | None = Field(default=None, description="For kind=reduce: SQL over `acc` and `x`, e.g. 'acc * x'.")

    @field_validator("name", "column")
    @classmethod
    def _identifier(cls, v: str | None) -> str | None:
        if v is not None and not IDENTIFIER.match(v):
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
        spark_internals.parse_sql_expression(spark, f"({text})")
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


def _not_bound_names(aggregations: list[Aggregation], what: str) -> list[Aggregation]:
    """Unique aggregation names, none of them a window bound's (``what``: the window or the session)."""
    clash = sorted({a.name for a in _unique_names(aggregations)} & {WINDOW_START, WINDOW_END})
    if clash:
        raise ValueError(f"aggregation names {clash} are reserved for the {what}'s bounds")
    return aggregations


class KeyedAggregate(OperatorModel):
    """Keyed aggregation: one output row per key, updated as records arrive."""

    kind: Literal["keyed_aggregate"] = "keyed_aggregate"
    takes_increments: ClassVar[bool] = True
    upserts: ClassVar[bool] = True
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
        return whole_ms(positive(v, "window size"), "window size")

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
        return _not_bound_names(v, "window")


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
        positive(v, "session gap")
        if v % timedelta(microseconds=1):
            raise ValueError(f"session gap must be a whole number of microseconds; got {v}")
        return v

    @field_validator("aggregations")
    @classmethod
    def _names(cls, v: list[Aggregation]) -> list[Aggregation]:
        return _not_bound_names(v, "session")


class ProcessOperator(OperatorModel):
    """A keyed process function: user code with value/list/map state and event-time timers
    (:class:`phases._internal.operators.process_function.KeyedProcessFunction`). Its output rows are appended to the
    sink.

    The backlog runs it over partitions sorted by key, version and event time, one key at a time, firing a
    key's timers up to the final backlog watermark at the end of the key (FLIP-140 / FLIP-327); the live
    phase runs the same function inside ``transformWithState``, seeded with the handed-over state and timers.
    """

    kind: Literal["process"] = "process"
    needs_ms_delay: ClassVar[bool] = True
    no_increments_because: ClassVar[str] = "keeps arbitrary per-key state that is not a mergeable aggregate"
    function: ClassImportPath = Field(
        description="Import path 'package.module:Class' of a KeyedProcessFunction subclass."
    )


MAX_BUCKETS_PER_ROW = 1000  # interval join: buckets one left row may be repeated in


class IntervalJoin(OperatorModel):
    """Inner interval join of the pipeline's source (left) with a second source (``right``: Delta, Kafka or
    hybrid, with the same key and event-time columns) on the keys: every pair with
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
    # PipelineSource: resolved in phases._internal.definition.pipeline, where it is defined (its upstream is a
    # Pipeline, which holds this operator).
    right: DeltaSource | KafkaSource | HybridSource | PipelineSource = Field(  # noqa: F821  # pyright: ignore[reportUndefinedVariable]
        discriminator="kind",
        description="The second input: a Delta table, a Kafka topic, an archive handing over to a topic or another "
        "pipeline's results, with the same key and event-time columns.",
    )
    lower: timedelta = Field(description="right.ts >= left.ts + lower (may be negative).")
    upper: timedelta = Field(description="right.ts <= left.ts + upper.")
    bucket: timedelta | None = Field(
        default=None,
        description="Width of the event-time buckets the join matches on besides the keys: each left row meets "
        "the right rows of the buckets its interval touches, so a key with many rows is not compared pair by "
        "pair. None: upper - lower (at least 1 ms), which puts a left row in at most two buckets. Changes no "
        "result; not part of the fingerprint.",
    )

    @field_validator("lower", "upper")
    @classmethod
    def _ms(cls, v: timedelta) -> timedelta:
        return whole_ms(v, "interval bounds")

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: timedelta | None) -> timedelta | None:
        if v is not None and v <= timedelta(0):
            raise ValueError(f"interval_join: bucket must be > 0 (or None for upper - lower); got {v}")
        return None if v is None else whole_ms(v, "bucket")

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
    """Co-group of the pipeline's source (left) and a second source (``right``: Delta, Kafka or hybrid) per key and
    tumbling event-time window: once both inputs' watermarks passed a window's end, ``function(key, window_start,
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
    right: DeltaSource | KafkaSource | HybridSource | PipelineSource = Field(  # noqa: F821  # pyright: ignore[reportUndefinedVariable]
        discriminator="kind",
        description="The second input: a Delta table, a Kafka topic, an archive handing over to a topic or another "
        "pipeline's results, with the same key and event-time columns.",
    )
    window: Window
    function: FunctionImportPath = Field(description="Import path 'package.module:function'.")
    output_schema: str = Field(description="Spark DDL of the function's output columns.")

    @field_validator("window")
    @classmethod
    def _tumbling(cls, v: Window) -> Window:
        if v.slide is not None and v.slide != v.size:
            raise ValueError("co_group windows are tumbling: leave 'slide' unset")
        return v


OPERATOR_MODELS = (KeyedAggregate, WindowedAggregate, SessionAggregate, ProcessOperator, IntervalJoin, CoGroup)
Operator = KeyedAggregate | WindowedAggregate | SessionAggregate | ProcessOperator | IntervalJoin | CoGroup
