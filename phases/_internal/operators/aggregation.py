"""The keyed-aggregation logic, written once and used by both phases.

Every aggregation is a commutative monoid over *buffers*:

* ``lift`` turns one input record into a buffer row (a count of 1, the value as a partial sum, ...);
* ``merge`` aggregates buffer rows per key (sum of counts, sum of sums, min of mins, fold of reduces);
* ``finalize`` turns a key's buffers into output columns (avg = sum / count).

The backlog phase lifts the sorted backlog records and merges them per key; the state it hands over is
exactly the merged buffers. The live phase combines each micro-batch's lifted records with its keys' stored
buffers by the *same* merge expressions, in the run's state store (:mod:`phases._internal.state.keyed_store`). Only
state access differs between the phases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.definition import (
    WINDOW_END,
    WINDOW_START,
    AggKind,
    Aggregation,
    Pipeline,
    sql_expression_problem,
)
from phases._internal.errors import DefinitionError
from phases._internal.records import CHANGE_TYPE, TAKEN_BACK
from phases._internal.reduce_fold import fold

MAX_TS = "_max_ts"  # buffer: the key's greatest event time (drives the live watermark after the switch)
_WINDOW = "_window"  # a record's window (start, end) while it is lifted
ROWS = "_rows"  # buffer: on-time records aggregated for the key
LIVE_ROWS = "_live_rows"  # live phase only: records of the key that arrived after the switch
TS = "_ts"  # the event time column of the unified (state + live) stream

_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType)
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_ORDERABLE = (*_NUMERIC, T.StringType, T.DateType, T.TimestampType, T.TimestampNTZType, T.BooleanType)


# Two values of each type a reduce may fold: the expression is evaluated on them once, before any data is read.
_SAMPLES: dict[type, tuple] = {
    T.ByteType: (1, 2),
    T.ShortType: (1, 2),
    T.IntegerType: (1, 2),
    T.LongType: (1, 2),
    T.FloatType: (1.5, 2.5),
    T.DoubleType: (1.5, 2.5),
    T.StringType: ("a", "b"),
    T.BooleanType: (True, False),
}


def reduce_problem(reduce_sql: str, dtype: T.DataType) -> str | None:
    """What is wrong with ``reduce_sql`` as a fold of two ``dtype`` values ``acc`` and ``x`` (None: nothing), found
    the way the engine runs it: analysed over a frame of just ``acc`` and ``x`` (a column other than those two, an
    aggregate function, a type error), then evaluated once on two sample values (an implicit cast that fails at run
    time, such as ``acc + 'a'``). Needs an active SparkSession; both phases build their logic through it."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return None
    # The answer depends on the text, the type and how the session casts; a live start and its backlog ask it of the
    # same definition again (two Spark jobs each time), so the process keeps it.
    key = (reduce_sql, dtype.json(), spark.conf.get("spark.sql.ansi.enabled", "true"))
    if key not in _REDUCE_PROBLEMS:
        _REDUCE_PROBLEMS[key] = _find_reduce_problem(spark, reduce_sql, dtype)  # pyright: ignore[reportArgumentType]
    return _REDUCE_PROBLEMS[key]  # pyright: ignore[reportArgumentType]


_REDUCE_PROBLEMS: dict[tuple[str, str, str], str | None] = {}


def _find_reduce_problem(spark, reduce_sql: str, dtype: T.DataType) -> str | None:
    from pyspark.errors import PySparkException

    sql_type = dtype.simpleString()
    schema = T.StructType([T.StructField("acc", dtype, True), T.StructField("x", dtype, True)])
    folded = f"CAST(({reduce_sql}) AS {sql_type}) AS folded"
    try:
        analysed = spark_internals.empty_frame(spark, schema).selectExpr(folded)
        if spark_internals.analysed_root_node(analysed) == "Aggregate":
            return "it uses an aggregate function; a reduce combines two values, acc and x, at a time"
        sample = _SAMPLES.get(type(dtype))
        if sample is not None:
            spark.createDataFrame([sample], schema).selectExpr(folded).collect()
    except PySparkException as exc:
        said = " ".join(line.strip() for line in str(exc).splitlines()[:1])
        if any(marker in said for marker in ("MISSING_GROUP_BY", "MISSING_AGGREGATION")):
            return "it uses an aggregate function; a reduce combines two values, acc and x, at a time"
        return f"{said} (a reduce sees only acc and x, of the column's type {sql_type})"
    return None


def _add(t: str, s: str) -> str:
    """Null-aware sum of two partial sums (SQL: a sum of only nulls is null)."""
    return f"CASE WHEN {t} IS NULL THEN {s} WHEN {s} IS NULL THEN {t} ELSE {t} + {s} END"


def _least(t: str, s: str) -> str:
    return f"least({t}, {s})"  # least/greatest skip nulls, like min/max


def _greatest(t: str, s: str) -> str:
    return f"greatest({t}, {s})"


def _pairwise_fold(dtype: T.DataType, reduce_sql: str) -> Callable[[str, str], str]:
    """The user's reduce applied to two partial results, skipping nulls (the same fold as :func:`fold`)."""
    sql_type = dtype.simpleString()

    def combine(t: str, s: str) -> str:
        return (
            f"aggregate(filter(array({s}), v -> v IS NOT NULL), {t}, "
            f"(acc, x) -> CASE WHEN acc IS NULL THEN x ELSE CAST(({reduce_sql}) AS {sql_type}) END)"
        )

    return combine


@dataclass(frozen=True)
class _Buffer:
    name: str
    dtype: T.DataType
    lift: Column
    merge: Column
    #: SQL combining two merged buffers, given the two column references (pairwise form of ``merge``).
    combine: Callable[[str, str], str] = _add


def _signed(buffer: _Buffer) -> _Buffer:
    """Over a keyed aggregation's results read as changes, a row taken back (an update's old row, a delete) lifts to
    the negated buffer: counts and sums (an average's too) then subtract it. ``_max_ts`` is kept as it is (the
    greatest event time seen drives no result; the definition refuses min, max and reduce over changes)."""
    if buffer.name == MAX_TS:
        return buffer
    sign = F.when(F.col(CHANGE_TYPE).isin(*TAKEN_BACK), F.lit(-1)).otherwise(F.lit(1))
    return _Buffer(buffer.name, buffer.dtype, buffer.lift * sign, buffer.merge, buffer.combine)


class KeyedAggregationLogic:
    """Buffers, lift, merge and finalize for one pipeline, checked against the source schema."""

    def __init__(self, pipeline: Pipeline, source_schema: T.StructType):
        self.pipeline = pipeline
        self.keys = list(pipeline.key_columns)
        fields = {f.name: f.dataType for f in source_schema.fields}
        for col in [*self.keys, pipeline.event_time]:
            if col not in fields:
                raise DefinitionError(
                    f"column {col!r} is not in source {pipeline.source.path}; columns: {sorted(fields)}"  # pyright: ignore[reportAttributeAccessIssue]
                )
        if not isinstance(fields[pipeline.event_time], T.TimestampType):
            raise DefinitionError(
                f"event_time column {pipeline.event_time!r} must be a timestamp; it is "
                f"{fields[pipeline.event_time].simpleString()}"
            )
        self.key_types = {k: fields[k] for k in self.keys}
        self.aggregations = list(pipeline.operator.aggregations)  # pyright: ignore[reportAttributeAccessIssue]
        self._buffers: list[_Buffer] = []
        self._lift_columns: list[Column] | None = None
        for agg in self.aggregations:
            self._buffers.extend(self._buffers_for(agg, fields))
        ts = F.col(pipeline.event_time)
        self._buffers.append(_Buffer(MAX_TS, T.TimestampType(), ts, F.max(MAX_TS), _greatest))
        self._buffers.append(_Buffer(ROWS, T.LongType(), F.lit(1).cast("long"), F.sum(ROWS)))
        if pipeline.reads_changes:
            # A sum over changes counts its values too: once every value is taken back it is null again, as SQL's
            # sum of no values is (not 0).
            for agg in self.aggregations:
                if agg.kind is AggKind.SUM:
                    present = F.when(F.col(agg.column).isNotNull(), 1).otherwise(0).cast("long")  # pyright: ignore[reportArgumentType]
                    self._buffers.append(_Buffer(f"{agg.name}__n", T.LongType(), present, F.sum(f"{agg.name}__n")))
            self._buffers = [_signed(b) for b in self._buffers]

    #: how many state rows one record is merged into (sliding windows: size / slide)
    windows_per_record = 1

    @staticmethod
    def _buffers_for(agg: Aggregation, fields: dict[str, T.DataType]) -> list[_Buffer]:
        n = agg.name
        if agg.column is not None and agg.column not in fields:
            raise DefinitionError(
                f"aggregation {n!r}: column {agg.column!r} is not in the source; columns: {sorted(fields)}"
            )
        dtype = fields.get(agg.column) if agg.column else None
        col = F.col(agg.column) if agg.column else None

        def need(types: tuple, what: str) -> None:
            if not isinstance(dtype, types):
                valid = sorted({t.typeName() for t in types})
                raise DefinitionError(
                    f"aggregation {n!r} ({agg.kind.value}): column {agg.column!r} is "
                    f"{dtype.simpleString()}; {what} needs one of {valid}"
                )

        if agg.kind is AggKind.COUNT:
            lift = F.lit(1) if col is None else F.when(col.isNotNull(), 1).otherwise(0)
            return [_Buffer(f"{n}__n", T.LongType(), lift.cast("long"), F.sum(f"{n}__n"))]
        if agg.kind is AggKind.SUM:
            need(_NUMERIC, "sum")
            bt = T.LongType() if isinstance(dtype, _INTEGRAL) else T.DoubleType()
            return [_Buffer(f"{n}__sum", bt, col.cast(bt), F.sum(f"{n}__sum"))]
        if agg.kind is AggKind.AVG:
            need(_NUMERIC, "avg")
            return [
                _Buffer(f"{n}__sum", T.DoubleType(), col.cast("double"), F.sum(f"{n}__sum")),
                _Buffer(
                    f"{n}__n",
                    T.LongType(),
                    F.when(col.isNotNull(), 1).otherwise(0).cast("long"),
                    F.sum(f"{n}__n"),
                ),
            ]
        if agg.kind in (AggKind.MIN, AggKind.MAX):
            need(_ORDERABLE, agg.kind.value)
            fn = F.min if agg.kind is AggKind.MIN else F.max
            pair = _least if agg.kind is AggKind.MIN else _greatest
            return [_Buffer(f"{n}__{agg.kind.value}", dtype, col, fn(f"{n}__{agg.kind.value}"), pair)]  # pyright: ignore[reportArgumentType]
        # reduce: fold the collected values (and, live, the backlog's partial result) with the user's
        # associative + commutative expression.
        need(_ORDERABLE, "reduce")
        problem = sql_expression_problem(agg.reduce)  # pyright: ignore[reportArgumentType]
        if problem is not None:
            raise DefinitionError(
                f"aggregation {agg.name!r}: reduce {agg.reduce!r} is not a Spark SQL expression: {problem}"
            )
        problem = reduce_problem(agg.reduce, dtype)  # pyright: ignore[reportArgumentType]
        if problem is not None:
            raise DefinitionError(
                f"aggregation {agg.name!r}: reduce {agg.reduce!r} cannot fold column {agg.column!r}: {problem}"
            )
        b = f"{n}__acc"
        return [_Buffer(b, dtype, col, fold(b, dtype, agg.reduce), _pairwise_fold(dtype, agg.reduce))]  # pyright: ignore[reportArgumentType]

    # --- the three steps -------------------------------------------------------------------------
    @property
    def buffer_schema(self) -> T.StructType:
        fields = [T.StructField(k, t, True) for k, t in self.key_types.items()]
        fields += [T.StructField(b.name, b.dtype, True) for b in self._buffers]
        return T.StructType(fields)

    @property
    def buffer_names(self) -> list[str]:
        return [b.name for b in self._buffers]

    def lift(self, records: DataFrame, carry: tuple[str, ...] = ()) -> DataFrame:
        """One buffer row per record: keys, buffers, the event time as ``_ts`` and the ``carry`` columns."""
        if self._lift_columns is None:  # built once: each column is a few calls into the JVM, every micro-batch
            cols = [F.col(k) for k in self.keys]
            cols += [b.lift.cast(b.dtype).alias(b.name) for b in self._buffers]
            self._lift_columns = [*cols, F.col(self.pipeline.event_time).alias(TS)]
        return records.select(*self._lift_columns, *carry)

    def merge_columns(self) -> list[Column]:
        return [b.merge.cast(b.dtype).alias(b.name) for b in self._buffers]

    def combine_set(self, t: str, s: str) -> dict[str, str]:
        """SQL per buffer column combining the merged buffers of table aliases ``t`` and ``s`` (a MERGE's
        update set: the state's buffers with a micro-batch's)."""
        return {b.name: b.combine(f"{t}.`{b.name}`", f"{s}.`{b.name}`") for b in self._buffers}

    def merge(self, buffers: DataFrame) -> DataFrame:
        """Buffers merged per key (batch)."""
        return buffers.groupBy(*self.keys).agg(*self.merge_columns())

    def merge_partials(self, partials: DataFrame) -> DataFrame:
        """Already merged buffers of several pieces (increments, slices) merged again."""
        return self.merge(partials)

    def finalize(self, state: DataFrame) -> DataFrame:
        """Output rows (keys + one column per aggregation) from merged buffers."""
        return state.select(*self.finalize_columns())

    def finalize_columns(self) -> list[Column]:
        """The output columns over merged buffers (:meth:`finalize`)."""
        cols = [F.col(k) for k in self.keys]
        for agg in self.aggregations:
            n = agg.name
            if agg.kind is AggKind.COUNT:
                cols.append(F.col(f"{n}__n").alias(n))
            elif agg.kind is AggKind.SUM and self.pipeline.reads_changes:
                cols.append(F.when(F.col(f"{n}__n") > 0, F.col(f"{n}__sum")).alias(n))
            elif agg.kind is AggKind.SUM:
                cols.append(F.col(f"{n}__sum").alias(n))
            elif agg.kind is AggKind.AVG:
                cols.append(F.when(F.col(f"{n}__n") > 0, F.col(f"{n}__sum") / F.col(f"{n}__n")).alias(n))
            elif agg.kind in (AggKind.MIN, AggKind.MAX):
                cols.append(F.col(f"{n}__{agg.kind.value}").alias(n))
            else:
                cols.append(F.col(f"{n}__acc").alias(n))
        return cols

    @property
    def output_schema(self) -> T.StructType:
        fields = [T.StructField(k, t, True) for k, t in self.key_types.items()]
        for agg in self.aggregations:
            b = [x for x in self._buffers if x.name.startswith(f"{agg.name}__")][0]
            dtype = T.DoubleType() if agg.kind is AggKind.AVG else b.dtype
            fields.append(T.StructField(agg.name, dtype, True))
        return T.StructType(fields)


class WindowedAggregationLogic(KeyedAggregationLogic):
    """The same buffers per (key, event-time window): ``lift`` first assigns each record to its windows
    (Spark's ``window()``, so batch and streaming assign identically); the window bounds join the keys."""

    def __init__(self, pipeline: Pipeline, source_schema: T.StructType):
        super().__init__(pipeline, source_schema)
        self.window = pipeline.operator.window  # pyright: ignore[reportAttributeAccessIssue]
        self.group_keys = list(pipeline.key_columns)
        self.keys = [*self.group_keys, WINDOW_START, WINDOW_END]
        self.key_types = {**self.key_types, WINDOW_START: T.TimestampType(), WINDOW_END: T.TimestampType()}
        self.windows_per_record = int(self.window.size / self.window.effective_slide)
        self._window_column: Column | None = None

    def lift(self, records: DataFrame) -> DataFrame:
        """One buffer row per record and window holding it: the group keys, the window's bounds, the buffers and the
        event time as ``_ts``. The buffers and ``_ts`` read the record's own columns: a record's ``window_start`` (the
        results of an upstream window pipeline read as a source) is its event time, not the window it falls in."""
        if self._lift_columns is None or self._window_column is None:  # built once (see KeyedAggregationLogic.lift)
            w = self.window
            ts = F.col(self.pipeline.event_time)
            window = (
                F.window(ts, w.spark_duration(w.size))
                if w.slide is None
                else F.window(ts, w.spark_duration(w.size), w.spark_duration(w.slide))
            )
            cols = [F.col(k) for k in self.group_keys]
            cols += [F.col(f"{_WINDOW}.start").alias(WINDOW_START), F.col(f"{_WINDOW}.end").alias(WINDOW_END)]
            cols += [b.lift.cast(b.dtype).alias(b.name) for b in self._buffers]
            self._window_column = window
            self._lift_columns = [*cols, ts.alias(TS)]
        return records.withColumn(_WINDOW, self._window_column).select(*self._lift_columns)

    @staticmethod
    def closed(state: DataFrame, watermark_us: int | None) -> Column:
        """Windows whose end is <= the watermark: final, emitted once."""
        if watermark_us is None:
            return F.lit(False)
        return F.col(WINDOW_END) <= F.timestamp_micros(F.lit(watermark_us))


SEED_GAP = "_seed_gap_us"  # session seeds: the gap that makes one row span its whole (open) session


class SessionAggregationLogic(WindowedAggregationLogic):
    """The same buffers per (key, session). Sessions are found by Spark's ``session_window`` when buffers
    merge, not when records are lifted: ``lift`` keeps each record's event time, and an already merged
    session re-enters a merge as one *seed* row at its start whose own gap reaches its end — so partial
    results (increments, slices, the live seed) merge exactly like the records they came from."""

    def __init__(self, pipeline: Pipeline, source_schema: T.StructType):
        KeyedAggregationLogic.__init__(self, pipeline, source_schema)
        self.gap_us = int(pipeline.operator.gap / timedelta(microseconds=1))  # pyright: ignore[reportAttributeAccessIssue]
        self.group_keys = list(pipeline.key_columns)
        self.keys = [*self.group_keys, WINDOW_START, WINDOW_END]
        self.key_types = {**self.key_types, WINDOW_START: T.TimestampType(), WINDOW_END: T.TimestampType()}
        self.windows_per_record = 1

    def lift(self, records: DataFrame) -> DataFrame:
        """Group keys, buffers, the event time as ``_ts`` and no seed gap (records use the session gap)."""
        cols = [F.col(k) for k in self.group_keys]
        cols += [b.lift.cast(b.dtype).alias(b.name) for b in self._buffers]
        ts = F.col(self.pipeline.event_time)
        return records.select(*cols, ts.alias(TS), F.lit(None).cast("long").alias(SEED_GAP))

    def seeds(self, sessions: DataFrame) -> DataFrame:
        """Merged sessions as seed rows for another merge (same columns as :meth:`lift`)."""
        span = F.unix_micros(F.col(WINDOW_END)) - F.unix_micros(F.col(WINDOW_START))
        return sessions.select(
            *self.group_keys, *self.buffer_names, F.col(WINDOW_START).alias(TS), span.cast("long").alias(SEED_GAP)
        )

    def session_column(self) -> Column:
        gap = F.when(F.col(SEED_GAP).isNull(), F.lit(f"{self.gap_us} microseconds")).otherwise(
            F.concat(F.col(SEED_GAP).cast("string"), F.lit(" microseconds"))
        )
        return F.session_window(F.col(TS), gap)

    def merge(self, lifted: DataFrame) -> DataFrame:
        """Lifted records and/or seed rows merged into sessions per key (batch or stream)."""
        merged = lifted.groupBy(*self.group_keys, self.session_column().alias("_session")).agg(*self.merge_columns())
        return merged.select(
            *self.group_keys,
            F.col("_session.start").alias(WINDOW_START),
            F.col("_session.end").alias(WINDOW_END),
            *self.buffer_names,
        )

    def merge_partials(self, partials: DataFrame) -> DataFrame:
        return self.merge(self.seeds(partials))
