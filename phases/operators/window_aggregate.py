"""Tumbling and sliding windows (``window_aggregate``): the aggregation buffers per key and window; a
window is emitted once, when the watermark passes its end, and then leaves the state. The rule that closes a
window (:meth:`phases.operators.aggregation.WindowedAggregationLogic.closed`, end <= watermark) is the same in the
backlog's handoff and in every live micro-batch."""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from phases.definition import WindowedAggregate
from phases.operators.aggregation import WindowedAggregationLogic
from phases.operators.keyed_aggregate import KeyedAggregateKind, KeyedStep
from phases.storage import tables


class WindowStep(KeyedStep):
    """Windows: the batch's buffers merged into the open windows; windows the watermark closed appended
    to the sink once and removed from the state."""

    def apply(self, spark: SparkSession, records: DataFrame | None, closing_us: int | None, batch: int, app) -> None:
        if records is not None:
            logic = self.logic
            partial = logic.merge(logic.lift(records))
            with tables.idempotent_dml(spark, app("state"), batch):
                (
                    DeltaTable.forPath(spark, self.state_path)
                    .alias("t")
                    .merge(partial.alias("s"), tables.key_match("t", "s", logic.keys))
                    .whenMatchedUpdate(set=logic.combine_set("t", "s"))
                    .whenNotMatchedInsertAll()
                    .execute()
                )
        self.close(spark, closing_us, batch, app)

    def close(self, spark: SparkSession, closing_us: int | None, batch: int, app) -> None:
        """Emits the windows ending at or before ``closing_us`` and drops them from the state."""
        if closing_us is None:
            return
        state = spark.read.format("delta").load(self.state_path)
        closed = self.logic.closed(state, closing_us)
        out = self.logic.finalize(state.filter(closed)).persist()
        try:
            if out.isEmpty():
                return
            tables.append_once(out, self.sink_path, app("sink"), batch)
            with tables.idempotent_dml(spark, app("closed"), batch):
                DeltaTable.forPath(spark, self.state_path).delete(closed)
        finally:
            out.unpersist()


class WindowAggregateKind(KeyedAggregateKind):
    spec = WindowedAggregate
    live_state_in_store = False  # windows keep their live state in the handoff's state table (for now)
    logic_class = WindowedAggregationLogic
    step_class = WindowStep
