"""Keyed process functions with timers (``process``): per key, the user's state (JSON) and pending
event-time timers on Delta. The backlog and every live micro-batch run the same sorted pass
(:mod:`phases.operators.process_pass`); live, it covers the keys with records and the keys whose timers the new
watermark makes due. Its state is arbitrary, not a mergeable aggregate: no backlog increments."""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases.definition import Pipeline, ProcessOperator
from phases.lateness import watermark_after
from phases.operators.aggregation import MAX_TS
from phases.operators.base import HandoffCounts, OneInputStep, OperatorKind, counted, observed, table_counts
from phases.operators.process_pass import ROWS, TIMERS, ProcessLogic
from phases.storage import tables

_TOUCHED = "_touched"


class ProcessHandoff:
    """The backlog's one pass (outputs and per-key state rows), persisted on disk and written apart."""

    def __init__(self, logic: ProcessLogic, prepared: DataFrame, final_watermark_us: int | None):
        self.logic = logic
        self.passed = logic.backlog_pass(prepared, final_watermark_us).persist(StorageLevel.DISK_ONLY)

    def write_live_state(self, store_root: str) -> None:
        pass  # the live phase works on the handoff's state table

    def write_state(self, path: str) -> None:
        states, self._state = counted(self.logic.states(self.passed), "handoff state", records=F.sum(ROWS))
        states.write.format("delta").mode("errorifexists").save(path)

    def write_sink(self, path: str) -> None:
        out, self._sink = counted(self.logic.outputs(self.passed), "handoff sink")
        out.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)

    def counts(self, spark: SparkSession, state_path: str, sink_path: str) -> HandoffCounts:
        """From the writes themselves, else by a scan of the tables."""
        state = observed(self._state, lambda: table_counts(spark, state_path, records=F.sum(ROWS)))
        sink = observed(self._sink, lambda: table_counts(spark, sink_path))
        return HandoffCounts(int(state["rows"]), int(state["records"] or 0), int(sink["rows"]))

    def close(self) -> None:
        self.passed.unpersist()


class ProcessStep(OneInputStep):
    """Process function: the keys with records in the batch, and the keys whose timers the new watermark
    makes due, run from their state on Delta through the operator's pass (the backlog's own); their outputs
    appended to the sink, then their new state merged into the state table.

    The sink is written first: a batch replayed after a crash before the state write starts from the same
    state and produces the same outputs (Delta skips the second append); one replayed after the state write
    skips both writes."""

    def __init__(self, logic: ProcessLogic, state_path: str, sink_path: str):
        self.logic, self.state_path, self.sink_path = logic, state_path, sink_path

    def apply(self, spark: SparkSession, records: DataFrame | None, closing_us: int | None, batch: int, app) -> None:
        logic, keys = self.logic, self.logic.keys
        state = spark.read.format("delta").load(self.state_path)
        due = F.lit(False)
        if closing_us is not None:
            due = F.exists(F.col(TIMERS), lambda t: t * 1000 <= F.lit(closing_us))
        if records is not None:
            touched = records.select(*keys).distinct().withColumn(_TOUCHED, F.lit(True))
            previous = state.join(touched, keys, "left").filter(F.col(_TOUCHED).isNotNull() | due).drop(_TOUCHED)
        else:
            previous = state.filter(due)
            if previous.isEmpty():
                return
        passed = logic.increment_pass(records, previous, closing_us).persist()
        try:
            out = logic.outputs(passed)
            if not out.isEmpty():
                tables.append_once(out, self.sink_path, app("sink"), batch)
            tables.upsert(spark, self.state_path, logic.states(passed), keys, app("state"), batch)
        finally:
            passed.unpersist()


class ProcessKind(OperatorKind[ProcessLogic]):
    spec = ProcessOperator
    state_event_time = MAX_TS

    def logic(self, spark: SparkSession, pipeline: Pipeline, schemas: list[T.StructType]) -> ProcessLogic:
        return ProcessLogic(spark, pipeline, schemas[0])

    def backlog(self, spark: SparkSession, pipeline: Pipeline, logic: ProcessLogic, inputs) -> ProcessHandoff:
        (tagged,) = inputs
        final_wm = watermark_after(tagged.running_max_us, pipeline.delay_us)
        return ProcessHandoff(logic, tagged.prepared, final_wm)

    def live_step(self, logic: ProcessLogic, state_path: str, sink_path: str, store_root: str) -> ProcessStep:
        return ProcessStep(logic, state_path, sink_path)
