"""The windowed co-group (``co_group``) of the pipeline's source with a second source (Delta or Kafka): every (key,
window) whose end both inputs' watermarks passed, with all its on-time records of both, passed to the
user's function once.

Live, the open windows' rows are in the run's state store, stored in the order of the window's end (as the
windows of :mod:`phases._internal.operators.window_aggregate`): a micro-batch adds its rows to their windows by point
lookups and closes the windows the smaller watermark passed by an ordered read of each store partition's start."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.definition import RIGHT_LABEL, SOURCE_LABEL, WINDOW_END, CoGroup
from phases._internal.operators.base import ClosingStoreStep
from phases._internal.operators.join_logic import LEFT, LEFT_ROWS, RIGHT, RIGHT_ROWS, CoGroupLogic
from phases._internal.operators.two_input import TwoInputKind
from phases._internal.state.keyed_store import LiveStateStore, OrderedLayout

END_US = "_window_end_us"  # the store's order column: a window's end, in microseconds


class CoGroupStoreStep(ClosingStoreStep):
    """Co-group: the batch's rows of both inputs collected per (key, window) and appended to the window's rows in the
    store (point lookups); the windows both watermarks closed removed in the same commit, passed to the user's
    function, and its rows appended to the sink once (marked with the batch id).

    Replays: the version loaded is the one the previous progress record names, so a replayed micro-batch closes the
    same windows with the same rows (the function sees each input's rows in event-time order), and a sink append
    already committed is skipped."""

    logic: CoGroupLogic

    @classmethod
    def open_store(cls, spark: SparkSession, logic: CoGroupLogic, store_root: str) -> LiveStateStore:
        schema = T.StructType([T.StructField(END_US, T.LongType()), *logic.state_schema.fields])
        keys, values = [END_US, *logic.group], [LEFT_ROWS, RIGHT_ROWS]
        return LiveStateStore(spark, store_root, OrderedLayout(tuple(keys), tuple(values), END_US), schema)

    @staticmethod
    def start_rows(state: DataFrame) -> DataFrame:
        return state.withColumn(END_US, F.unix_micros(F.col(WINDOW_END)))

    def batch_rows(self, spark, records) -> DataFrame | None:
        logic = self.logic
        lifted = [
            logic.lift(df, side)
            for df, side in ((records[SOURCE_LABEL], LEFT), (records[RIGHT_LABEL], RIGHT))
            if df is not None
        ]
        if not lifted:
            return None
        rows = lifted[0] if len(lifted) == 1 else lifted[0].unionByName(lifted[1])
        return self.start_rows(rows.groupBy(*logic.group).agg(*logic.merge_columns()))

    def combine_sql(self) -> list[str]:
        """A window's rows of each input: the stored ones, then the batch's."""
        return [f"concat(t.`{c}`, s.`{c}`)" for c in (LEFT_ROWS, RIGHT_ROWS)]

    def write_closed(self, closed: DataFrame, count: int, writes) -> None:
        writes.append_owned(self.logic.apply(closed.drop(END_US)), self.sink_path, "sink")


class CoGroupKind(TwoInputKind):
    spec = CoGroup
    logic_class = CoGroupLogic
    step_class = CoGroupStoreStep
