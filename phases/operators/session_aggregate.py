"""Session windows (``session_aggregate``): per key, sessions of records less than the gap apart; the live
phase re-merges the touched keys' open sessions with the batch's records, and a session is emitted once,
when the watermark passes its end (the windows' rule)."""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from phases.definition import WINDOW_END, WINDOW_START, SessionAggregate
from phases.operators.aggregation import SessionAggregationLogic
from phases.operators.base import OneInputStep
from phases.operators.window_aggregate import WindowAggregateKind
from phases.storage import tables

_OP = "_op"  # the session MERGE's source rows: 'upsert' or 'delete'


class SessionStep(OneInputStep):
    """Sessions, their live state in the handoff's Delta state table: the touched keys' open sessions re-merged with
    the batch's records (one MERGE replaces them), then the sessions the watermark closed appended to the sink once
    and removed from the state."""

    def __init__(self, logic: SessionAggregationLogic, state_path: str, sink_path: str, store_root: str | None = None):
        self.logic, self.state_path, self.sink_path = logic, state_path, sink_path

    def apply(self, spark: SparkSession, records: DataFrame | None, closing_us: int | None, batch: int, app) -> None:
        if records is not None:
            logic = self.logic
            keys, bounds = logic.group_keys, [*logic.group_keys, WINDOW_START, WINDOW_END]
            partial = logic.merge(logic.lift(records)).persist()
            try:
                touched = F.broadcast(partial.select(*keys).distinct())
                old = spark.read.format("delta").load(self.state_path).join(touched, keys)
                cols = [*bounds, *logic.buffer_names]
                merged = logic.merge_partials(old.select(*cols).unionByName(partial.select(*cols)))
                gone = old.select(*cols).join(merged.select(*bounds), bounds, "left_anti")
                source = merged.withColumn(_OP, F.lit("upsert")).unionByName(gone.withColumn(_OP, F.lit("delete")))
                with tables.idempotent_dml(spark, app("state"), batch):
                    (
                        DeltaTable.forPath(spark, self.state_path)
                        .alias("t")
                        .merge(source.alias("s"), tables.key_match("t", "s", bounds))
                        .whenMatchedDelete(condition=f"s.{_OP} = 'delete'")
                        .whenMatchedUpdate(set={c: f"s.`{c}`" for c in logic.buffer_names})
                        .whenNotMatchedInsert(condition=f"s.{_OP} = 'upsert'", values={c: f"s.`{c}`" for c in cols})
                        .execute()
                    )
            finally:
                partial.unpersist()
        self.close(spark, closing_us, batch, app)

    def close(self, spark: SparkSession, closing_us: int | None, batch: int, app) -> None:
        """Emits the sessions ending at or before ``closing_us`` and drops them from the state."""
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


class SessionAggregateKind(WindowAggregateKind):
    spec = SessionAggregate
    live_state_in_store = False  # sessions keep their live state in the handoff's state table (for now)
    logic_class = SessionAggregationLogic
    step_class = SessionStep
