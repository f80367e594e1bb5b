"""What the two-input kinds (interval join, co-group) share: the handoff of their backlog plan, the
closing watermark (the smaller of the two inputs'), and their refusal of backlog increments."""

from __future__ import annotations

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import types as T

from phases._internal.definition import RIGHT_LABEL, SOURCE_LABEL, Pipeline
from phases._internal.lateness import watermark_after
from phases._internal.operators.base import (
    HandoffCounts,
    OperatorKind,
    StoreStep,
    Watermarks,
    counted,
    observed,
    table_counts,
)
from phases._internal.operators.join_logic import CoGroupLogic, TwoInputLogic
from phases._internal.storage import tables


class TwoInputHandoff:
    """The operator's backlog output and the rows/windows still open, with the on-time records of both."""

    def __init__(
        self,
        spark: SparkSession,
        out: DataFrame,
        state: DataFrame,
        inputs: list[DataFrame],
        input_rows: list[Observation],
        logic: TwoInputLogic,
        live: type[StoreStep],
    ):
        """``inputs``: both inputs' on-time records; ``input_rows`` their counts, observed as the writes of
        ``out`` and ``state`` read them; ``live``: the live step, whose store gets the state as its version 1."""
        self.spark, self._inputs, self._input_rows = spark, inputs, input_rows
        self.logic, self.live = logic, live
        # Cached: the state table and the store's version 1 are written from it (the store does not read it back).
        self._handed_over = state.persist()
        self.state, self._state_rows = counted(self._handed_over, "handoff state")
        self.out, self._sink_rows = counted(out, "handoff sink")

    def write_live_state(self, store_root: str) -> None:
        """Version 1 of the run's state store: the state table's rows, from the cache."""
        rows = self.live.start_rows(self._handed_over)
        self.live.open_store(self.spark, self.logic, store_root).write_start(rows)

    def write_state(self, path: str) -> None:
        self.state.write.format("delta").mode("errorifexists").save(path)
        self.state_path = path

    def write_sink(self, path: str) -> None:
        writer = self.out.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        writer.options(**tables.sink_properties(change_feed=True)).save(path)

    def counts(self, spark: SparkSession, state_path: str, sink_path: str) -> HandoffCounts:
        """From the writes themselves (the inputs counted as the writes read them), else by a scan."""
        inputs = (
            observed(o, lambda df=df: {"rows": df.count()})
            for o, df in zip(self._input_rows, self._inputs, strict=True)
        )
        return HandoffCounts(
            int(observed(self._state_rows, lambda: table_counts(spark, state_path))["rows"]),
            sum(int(m["rows"]) for m in inputs),
            int(observed(self._sink_rows, lambda: table_counts(spark, sink_path))["rows"]),
        )

    def close(self) -> None:
        self.spark.catalog.clearCache()


class TwoInputKind(OperatorKind[TwoInputLogic]):
    """What the interval join and the co-group share (their models declare two inputs)."""

    step_class: type[StoreStep]

    def logic(self, spark: SparkSession, pipeline: Pipeline, schemas: list[T.StructType]):
        return self.logic_class(pipeline, schemas[0], schemas[1])  # pyright: ignore[reportAttributeAccessIssue]

    def closing(self, watermarks: Watermarks) -> int | None:
        return CoGroupLogic.closing_watermark(watermarks[SOURCE_LABEL], watermarks[RIGHT_LABEL])

    def backlog(self, spark: SparkSession, pipeline: Pipeline, logic, inputs) -> TwoInputHandoff:
        left, right = inputs
        wm = [watermark_after(t.running_max_us, pipeline.delay_us) for t in inputs]
        (left_in, left_rows), (right_in, right_rows) = (
            counted(t.prepared, f"{side} input") for t, side in zip(inputs, ("left", "right"), strict=True)
        )
        out, state = logic.backlog(left_in, right_in, wm[0], wm[1])  # pyright: ignore[reportAttributeAccessIssue]
        inputs_read = [left.prepared, right.prepared]
        return TwoInputHandoff(spark, out, state, inputs_read, [left_rows, right_rows], logic, self.step_class)

    def live_step(self, logic, state_path: str, sink_path: str, store_root: str):
        return self.step_class(logic, state_path, sink_path, store_root)
