"""Two-input keyed operators: an interval join and a windowed co-group of the pipeline's source (left) with
a second source (right). One logic object per operator builds the batch plan (backlog) and the
per-micro-batch steps of the live phase (:mod:`phases._internal.live.micro_batch`) from the same column expressions.

Each input keeps its own arrival order and lateness: a record of version ``v`` of an input is late iff its
event time ``<= W(v)`` of *that* input (:mod:`phases._internal.lateness`). With late records out, both operators'
results depend only on the on-time records, not on how they were batched:

* interval join: every pair of on-time records with equal keys and ``left.ts + lower <= right.ts <= left.ts
  + upper``;
* co-group: every (key, window) whose end both inputs' watermarks passed, with all its on-time records.

Live, both inputs are read by one query (:mod:`phases._internal.live.micro_batch`): each micro-batch joins or collects
the new rows of both inputs against the state on Delta, with each input's own watermark.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterator
from datetime import timedelta
from functools import reduce

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from phases._internal.definition import WINDOW_END, WINDOW_START, CoGroup, IntervalJoin, Pipeline
from phases._internal.errors import DefinitionError
from phases._internal.operators.aggregation import MAX_TS
from phases._internal.runtime.user_code import load_function

LEFT, RIGHT = "left", "right"
RIGHT_PREFIX = "right_"
LEFT_ROWS, RIGHT_ROWS = "_left", "_right"  # state / co-group buffers: the window's (or key's) rows per input
BUCKET = "_bucket"  # interval join: the event-time bucket a pair meets in


def _us(delta: timedelta) -> int:
    return int(delta / timedelta(microseconds=1))


def _user_fields(schema: T.StructType) -> list[T.StructField]:
    return [f for f in schema.fields if not f.name.startswith("_")]


class TwoInputLogic:
    """What both two-input operators share: the inputs' columns, checked against the pipeline."""

    def __init__(self, pipeline: Pipeline, left_schema: T.StructType, right_schema: T.StructType):
        self.pipeline = pipeline
        self.keys = list(pipeline.key_columns)
        self.event_time = pipeline.event_time
        self.left_fields = _user_fields(left_schema)
        self.right_fields = _user_fields(right_schema)
        left = {f.name: f.dataType for f in self.left_fields}
        right = {f.name: f.dataType for f in self.right_fields}
        for col in [*self.keys, self.event_time]:
            for label, fields, path in (
                ("source", left, pipeline.source.location),
                ("right source", right, pipeline.right_source.location),
            ):
                if col not in fields:
                    raise DefinitionError(f"column {col!r} is not in the {label} {path}; columns: {sorted(fields)}")
            if left[col] != right[col]:
                raise DefinitionError(
                    f"column {col!r} is {left[col].simpleString()} in the source but {right[col].simpleString()} "
                    "in the right source; keys and event time must have the same type in both inputs"
                )
        if not isinstance(left[self.event_time], T.TimestampType):
            raise DefinitionError(f"event_time column {self.event_time!r} must be a timestamp")
        self.key_fields = [next(f for f in self.left_fields if f.name == k) for k in self.keys]

    def fields(self, side: str) -> list[T.StructField]:
        return self.left_fields if side == LEFT else self.right_fields

    def row_type(self, side: str) -> T.StructType:
        return T.StructType(self.fields(side))

    def rows_struct(self, side: str) -> Column:
        return F.struct(*[F.col(f.name) for f in self.fields(side)])

    def empty_rows(self, side: str) -> Column:
        return F.array().cast(T.ArrayType(self.row_type(side)))


# --- interval join -----------------------------------------------------------------------------------


class IntervalJoinLogic(TwoInputLogic):
    def __init__(self, pipeline: Pipeline, left_schema: T.StructType, right_schema: T.StructType):
        super().__init__(pipeline, left_schema, right_schema)
        op: IntervalJoin = pipeline.operator  # pyright: ignore[reportAssignmentType]
        self.lower_ms, self.upper_ms = _us(op.lower) // 1000, _us(op.upper) // 1000
        self.bucket_us = _us(op.bucket_width)
        out_left = [f for f in self.left_fields if f.name not in self.keys]
        out_right = [
            T.StructField(RIGHT_PREFIX + f.name, f.dataType, True) for f in self.right_fields if f.name not in self.keys
        ]
        names = [f.name for f in out_left]
        clash = sorted({f.name for f in out_right} & set(names))
        if clash:
            raise DefinitionError(
                f"interval_join: left columns {clash} clash with the right columns renamed with {RIGHT_PREFIX!r}"
            )
        self.output_schema = T.StructType([*self.key_fields, *out_left, *out_right])
        self.state_schema = T.StructType(
            [
                *self.key_fields,
                T.StructField(LEFT_ROWS, T.ArrayType(self.row_type(LEFT)), True),
                T.StructField(RIGHT_ROWS, T.ArrayType(self.row_type(RIGHT)), True),
                T.StructField(MAX_TS, T.TimestampType(), True),
            ]
        )

    def _renamed_right(self, right: DataFrame) -> DataFrame:
        extra = [c for c in right.columns if c.startswith("_")]
        return right.select(*[F.col(f.name).alias(RIGHT_PREFIX + f.name) for f in self.right_fields], *extra)

    def _keys_present(self, prefix: str) -> Column:
        return reduce(operator.and_, [F.col(f"`{prefix}{k}`").isNotNull() for k in self.keys])

    def _condition(self) -> Column:
        ts, rts = f"l.`{self.event_time}`", f"r.`{RIGHT_PREFIX}{self.event_time}`"
        cond = F.expr(
            f"{rts} >= {ts} + INTERVAL {self.lower_ms} MILLISECONDS AND {rts} <= {ts} + INTERVAL {self.upper_ms} "
            "MILLISECONDS"
        )
        for k in self.keys:
            cond = cond & (F.col(f"l.`{k}`") == F.col(f"r.`{RIGHT_PREFIX}{k}`"))
        return cond

    def _select_output(self, joined: DataFrame) -> DataFrame:
        cols = [F.col(f"l.`{f.name}`").alias(f.name) for f in self.left_fields]
        cols += [F.col(f"r.`{f.name}`").alias(f.name) for f in self.output_schema.fields[len(cols) :]]
        return joined.select(*cols)

    def _bucket(self, micros: Column) -> Column:
        """The event-time bucket of ``micros`` (µs since the epoch): floor division, exact for any sign."""
        width = F.lit(self.bucket_us)
        return ((micros - F.pmod(micros, width)) / width).cast("long")

    def pairs(self, left: DataFrame, right: DataFrame) -> DataFrame:
        """Every pair of a ``left`` and a ``right`` row (both with the inputs' own columns) that the join emits,
        as output rows. Besides the keys, the rows meet on event-time buckets: a left row is repeated for each
        bucket its interval ``[ts + lower, ts + upper]`` touches, a right row sits in the bucket of its event
        time, so every matching pair meets in exactly one bucket and Spark compares only rows of nearby times
        (not every pair of a key)."""
        ts = F.unix_micros(F.col(f"`{self.event_time}`"))
        first = self._bucket(ts + F.lit(self.lower_ms * 1000))
        last = self._bucket(ts + F.lit(self.upper_ms * 1000))
        bucketed_left = left.withColumn(BUCKET, F.explode(F.sequence(first, last)))
        renamed = self._renamed_right(right)
        bucketed_right = renamed.withColumn(
            BUCKET, self._bucket(F.unix_micros(F.col(f"`{RIGHT_PREFIX}{self.event_time}`")))
        )
        cond = self._condition() & (F.col(f"l.{BUCKET}") == F.col(f"r.{BUCKET}"))
        return self._select_output(bucketed_left.alias("l").join(bucketed_right.alias("r"), cond, "inner"))

    def backlog(
        self, left: DataFrame, right: DataFrame, left_wm: int | None, right_wm: int | None
    ) -> tuple[DataFrame, DataFrame]:
        """(output pairs grouped by key, state: per key the rows that can still match a future row)."""
        partitions = int(left.sparkSession.conf.get("spark.sql.shuffle.partitions"))  # pyright: ignore[reportArgumentType]
        out = self.pairs(left, right).repartition(partitions, *self.keys).sortWithinPartitions(*self.keys)
        ts = F.col(self.event_time)
        # A future right row has ts > right_wm: a left row can match one iff ts + upper > right_wm.
        keep_left = (
            left if right_wm is None else left.filter(ts > F.timestamp_micros(F.lit(right_wm - self.upper_ms * 1000)))
        )
        keep_right = (
            right if left_wm is None else right.filter(ts > F.timestamp_micros(F.lit(left_wm + self.lower_ms * 1000)))
        )
        lifted = keep_left.select(
            *self.keys,
            F.array(self.rows_struct(LEFT)).alias(LEFT_ROWS),
            self.empty_rows(RIGHT).alias(RIGHT_ROWS),
            ts.alias(MAX_TS),
        ).unionByName(
            keep_right.select(
                *self.keys,
                self.empty_rows(LEFT).alias(LEFT_ROWS),
                F.array(self.rows_struct(RIGHT)).alias(RIGHT_ROWS),
                ts.alias(MAX_TS),
            )
        )
        state = lifted.groupBy(*self.keys).agg(
            F.flatten(F.collect_list(LEFT_ROWS)).alias(LEFT_ROWS),
            F.flatten(F.collect_list(RIGHT_ROWS)).alias(RIGHT_ROWS),
            F.max(MAX_TS).alias(MAX_TS),
        )
        return out, state


# --- co-group ----------------------------------------------------------------------------------------


class CoGroupLogic(TwoInputLogic):
    def __init__(self, pipeline: Pipeline, left_schema: T.StructType, right_schema: T.StructType):
        super().__init__(pipeline, left_schema, right_schema)
        op: CoGroup = pipeline.operator  # pyright: ignore[reportAssignmentType]
        self.function_path = op.function
        load_function(op.function)  # fail on the driver, with the path, when it does not import
        self.size_us = _us(op.window.size)
        try:
            out = T._parse_datatype_string(op.output_schema)
        except Exception as exc:  # noqa: BLE001 - Spark raises several parse error types
            raise DefinitionError(f"co_group: output_schema {op.output_schema!r} is not Spark DDL: {exc}") from exc
        clash = sorted({f.name for f in out.fields} & {*self.keys, WINDOW_START, WINDOW_END})  # pyright: ignore[reportAttributeAccessIssue]
        if clash:
            raise DefinitionError(f"co_group: output columns {clash} clash with the keys or the window bounds")
        bounds = [
            T.StructField(WINDOW_START, T.TimestampType(), True),
            T.StructField(WINDOW_END, T.TimestampType(), True),
        ]
        self.output_columns = [f.name for f in out.fields]  # pyright: ignore[reportAttributeAccessIssue]
        self.output_schema = T.StructType([*self.key_fields, *bounds, *out.fields])  # pyright: ignore[reportAttributeAccessIssue]
        self.group = [*self.keys, WINDOW_START, WINDOW_END]
        self.state_schema = T.StructType(
            [
                *self.key_fields,
                *bounds,
                T.StructField(LEFT_ROWS, T.ArrayType(self.row_type(LEFT)), True),
                T.StructField(RIGHT_ROWS, T.ArrayType(self.row_type(RIGHT)), True),
            ]
        )

    def lift(self, rows: DataFrame, side: str) -> DataFrame:
        """One buffer row per record: its window, and itself in its input's array."""
        window = F.window(F.col(self.event_time), f"{self.size_us // 1000} milliseconds")
        mine = F.array(self.rows_struct(side))
        return rows.select(
            *self.keys,
            window.start.alias(WINDOW_START),
            window.end.alias(WINDOW_END),
            (mine if side == LEFT else self.empty_rows(LEFT)).alias(LEFT_ROWS),
            (mine if side == RIGHT else self.empty_rows(RIGHT)).alias(RIGHT_ROWS),
        )

    def merge_columns(self) -> list[Column]:
        return [
            F.flatten(F.collect_list(LEFT_ROWS)).alias(LEFT_ROWS),
            F.flatten(F.collect_list(RIGHT_ROWS)).alias(RIGHT_ROWS),
        ]

    @staticmethod
    def closing_watermark(left_wm: int | None, right_wm: int | None) -> int | None:
        """Windows close by the smaller watermark, and only once both inputs have one."""
        return None if left_wm is None or right_wm is None else min(left_wm, right_wm)

    def backlog(
        self, left: DataFrame, right: DataFrame, left_wm: int | None, right_wm: int | None
    ) -> tuple[DataFrame, DataFrame]:
        """(function output of the windows both final watermarks closed, open windows' rows as state)."""
        windows = (
            self.lift(left, LEFT).unionByName(self.lift(right, RIGHT)).groupBy(*self.group).agg(*self.merge_columns())
        )
        wm = self.closing_watermark(left_wm, right_wm)
        closed = F.lit(False) if wm is None else F.col(WINDOW_END) <= F.timestamp_micros(F.lit(wm))
        windows = windows.persist()
        return self.apply(windows.filter(closed)), windows.filter(~closed)

    def apply(self, windows: DataFrame) -> DataFrame:
        """Calls the user's function once per closed window (sorted by key: output grouped by key)."""
        partitions = int(windows.sparkSession.conf.get("spark.sql.shuffle.partitions"))  # pyright: ignore[reportArgumentType]
        ordered = windows.repartition(partitions, *self.keys).sortWithinPartitions(*self.group)
        path, keys, out_cols, event_time = self.function_path, self.keys, self.output_columns, self.event_time
        arrow_schema = to_arrow_schema(self.output_schema, timezone="UTC")
        allowed = set(out_cols)

        def order(row: dict) -> tuple:
            return (row[event_time], json.dumps(row, sort_keys=True, default=str))

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            fn = load_function(path)
            for batch in batches:
                produced = []
                for w in batch.to_pylist():
                    key = tuple(w[k] for k in keys)
                    left = sorted(w[LEFT_ROWS] or [], key=order)
                    right = sorted(w[RIGHT_ROWS] or [], key=order)
                    for row in fn(key, w[WINDOW_START], w[WINDOW_END], left, right) or []:
                        unknown = sorted(set(row) - allowed)
                        if unknown:
                            raise DefinitionError(
                                f"co_group function {path!r} for key {key!r} yielded columns {unknown} that are not "
                                f"in its output_schema; output columns: {out_cols}"
                            )
                        bounds = {WINDOW_START: w[WINDOW_START], WINDOW_END: w[WINDOW_END]}
                        produced.append({**dict(zip(keys, key, strict=True)), **bounds, **row})
                if produced:
                    yield pa.RecordBatch.from_pylist(produced, schema=arrow_schema)

        return ordered.mapInArrow(run, self.output_schema)
