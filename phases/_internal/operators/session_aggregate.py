"""Session windows (``session_aggregate``): per key, sessions of records less than the gap apart (Spark's
``session_window`` rule); a session is emitted once, when the watermark passes its end (the windows' rule).

Live, the open sessions are in the run's state store (``SessionStateStore`` of the engine's helper): a key's open
sessions are found by a prefix scan on the key and merged with the batch's records in the JVM, and the sessions the
watermark closed are read in the order of their end, from the start of each store partition."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.definition import SOURCE_LABEL, WINDOW_END, WINDOW_START, SessionAggregate
from phases._internal.operators.aggregation import TS, SessionAggregationLogic
from phases._internal.operators.base import ClosingStoreStep
from phases._internal.operators.keyed_aggregate import ROWS_PER_FILE, AggregationStoreStep
from phases._internal.operators.window_aggregate import WindowAggregateKind
from phases._internal.state.keyed_store import LiveStateStore, SessionLayout

START_US, END_US = "_session_start_us", "_session_end_us"  # the store's session bounds, in microseconds


class SessionStoreStep(ClosingStoreStep, AggregationStoreStep):
    """Sessions: each on-time record opens its own session [ts, ts + gap) and goes to its key's store partition; the
    store merges it with the key's open sessions (Spark's rule: a session takes the next one in when that one starts
    at or before its end; buffers combine with the backlog's SQL), then removes and returns the sessions ending at or
    before the watermark, which are appended to the sink once (marked with the batch id).

    Replays: the version loaded is the one the previous progress record names, so a replayed micro-batch closes the
    same sessions with the same values, and a sink append already committed is skipped."""

    logic: SessionAggregationLogic

    @classmethod
    def open_store(cls, spark: SparkSession, logic: SessionAggregationLogic, store_root: str) -> LiveStateStore:
        bounds = [T.StructField(START_US, T.LongType()), T.StructField(END_US, T.LongType())]
        schema = T.StructType([*logic.buffer_schema.fields, *bounds])
        layout = SessionLayout(tuple(logic.group_keys), tuple(logic.buffer_names), START_US, END_US)
        return LiveStateStore(spark, store_root, layout, schema)

    @staticmethod
    def start_rows(state: DataFrame) -> DataFrame:
        return state.withColumn(START_US, F.unix_micros(F.col(WINDOW_START))).withColumn(
            END_US, F.unix_micros(F.col(WINDOW_END))
        )

    def batch_rows(self, spark, records) -> DataFrame | None:
        on_time = records[SOURCE_LABEL]
        if on_time is None:
            return None
        logic = self.logic
        start = F.unix_micros(F.col(TS))  # each record's own session: [ts, ts + gap)
        return logic.lift(on_time).select(
            *logic.group_keys, start.alias(START_US), (start + F.lit(logic.gap_us)).alias(END_US), *logic.buffer_names
        )

    def write_closed(self, closed: DataFrame, count: int, writes) -> None:
        closed = closed.coalesce(max(1, -(-count // ROWS_PER_FILE)))
        bounded = closed.withColumn(WINDOW_START, F.timestamp_micros(F.col(START_US))).withColumn(
            WINDOW_END, F.timestamp_micros(F.col(END_US))
        )
        writes.append_owned(self.logic.finalize(bounded), self.sink_path, "sink")


class SessionAggregateKind(WindowAggregateKind):
    spec = SessionAggregate
    logic_class = SessionAggregationLogic
    step_class = SessionStoreStep
