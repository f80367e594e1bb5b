"""Tumbling and sliding windows (``window_aggregate``): the aggregation buffers per key and window; a
window is emitted once, when the watermark passes its end, and then leaves the state. The rule that closes a
window (:meth:`phases._internal.operators.aggregation.WindowedAggregationLogic.closed`, end <= watermark) is the same in
the backlog's handoff and in every live micro-batch.

Live, the open windows are in the run's state store, keyed by (window end, key, window start) and stored in the
order of the window's end: a micro-batch combines its records into their windows by point lookups, then closes the
windows at or below the watermark by reading each store partition from its start until the first window that
ends later (not a scan of every open window)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.definition import SOURCE_LABEL, WINDOW_END, WindowedAggregate
from phases._internal.operators.aggregation import WindowedAggregationLogic
from phases._internal.operators.base import ClosingStoreStep
from phases._internal.operators.keyed_aggregate import ROWS_PER_FILE, AggregationStoreStep, KeyedAggregateKind
from phases._internal.state.keyed_store import LiveStateStore, OrderedLayout

END_US = "_window_end_us"  # the store's order column: a window's end, in microseconds


class WindowStoreStep(ClosingStoreStep, AggregationStoreStep):
    """Windows: each on-time record lifted into its windows' buffers and combined with their stored buffers (the
    backlog's SQL, in the JVM); then the windows the watermark closed, finalized, appended to the sink once (the
    batch's Delta transaction id), and removed from the store in the same commit.

    Replays: the version loaded is the one the previous progress record names, so a replayed micro-batch closes the
    same windows with the same values, and a sink append already committed is skipped."""

    logic: WindowedAggregationLogic

    @classmethod
    def open_store(cls, spark: SparkSession, logic: WindowedAggregationLogic, store_root: str) -> LiveStateStore:
        """Per (window end, key, window start) the window's buffers, in the order of the window's end."""
        schema = T.StructType([T.StructField(END_US, T.LongType()), *logic.buffer_schema.fields])
        keys = [END_US, *logic.keys]
        return LiveStateStore(spark, store_root, OrderedLayout(tuple(keys), tuple(logic.buffer_names), END_US), schema)

    @staticmethod
    def start_rows(state: DataFrame) -> DataFrame:
        return state.withColumn(END_US, F.unix_micros(F.col(WINDOW_END)))

    def batch_rows(self, spark, records) -> DataFrame | None:
        on_time = records[SOURCE_LABEL]
        # Each record in each of its windows, as it is: the store combines a window's rows in turn.
        return None if on_time is None else self.start_rows(self.logic.lift(on_time))

    def write_closed(self, closed: DataFrame, count: int, writes) -> None:
        closed = closed.coalesce(max(1, -(-count // ROWS_PER_FILE)))
        writes.append_owned(self.logic.finalize(closed), self.sink_path, "sink")


class WindowAggregateKind(KeyedAggregateKind):
    spec = WindowedAggregate
    logic_class = WindowedAggregationLogic
    step_class = WindowStoreStep
