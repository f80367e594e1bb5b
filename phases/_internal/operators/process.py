"""Keyed process functions with timers (``process``): per key, the user's state (JSON) and pending
event-time timers. The backlog and every live micro-batch run the same sorted pass
(:mod:`phases._internal.operators.process_pass`); live, it covers the keys with records and the keys whose timers the
new watermark makes due. Its state is arbitrary, not a mergeable aggregate: no backlog increments.

Live, the state rows are in the run's state store (``TimerStateStore`` of the engine's helper), with the timers in a
time-ordered index: the keys a watermark makes due are read from the index's start, not found by a scan of every
key's state. The user's function runs in Python between a lookup of the keys' rows and their replacement: one
round trip per micro-batch (not per key)."""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.definition import SOURCE_LABEL, Pipeline, ProcessOperator
from phases._internal.lateness import watermark_after
from phases._internal.operators.aggregation import MAX_TS
from phases._internal.operators.base import (
    HandoffCounts,
    OperatorKind,
    StoreStep,
    counted,
    observed,
    table_counts,
)
from phases._internal.operators.process_pass import ROWS, STATE, TIMERS, ProcessLogic
from phases._internal.state.keyed_store import LiveStateStore, RowLayout
from phases._internal.storage import tables


class ProcessHandoff:
    """The backlog's one pass (outputs and per-key state rows), persisted on disk and written apart."""

    def __init__(self, logic: ProcessLogic, prepared: DataFrame, final_watermark_us: int | None):
        self.logic = logic
        self.passed = logic.backlog_pass(prepared, final_watermark_us).persist(StorageLevel.DISK_ONLY)

    def write_live_state(self, store_root: str) -> None:
        """Version 1 of the run's state store: the state table's rows, from the persisted pass (not read back)."""
        spark = self.passed.sparkSession
        state = self.logic.states(self.passed)
        ProcessStoreStep.open_store(spark, self.logic, store_root).write_start(ProcessStoreStep.start_rows(state))

    def write_state(self, path: str) -> None:
        states, self._state = counted(self.logic.states(self.passed), "handoff state", records=F.sum(ROWS))
        states.write.format("delta").mode("errorifexists").save(path)
        self.state_path = path

    def write_sink(self, path: str) -> None:
        out, self._sink = counted(self.logic.outputs(self.passed), "handoff sink")
        writer = out.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        writer.options(**tables.sink_properties(change_feed=True)).save(path)

    def counts(self, spark: SparkSession, state_path: str, sink_path: str) -> HandoffCounts:
        """From the writes themselves, else by a scan of the tables."""
        state = observed(self._state, lambda: table_counts(spark, state_path, records=F.sum(ROWS)))
        sink = observed(self._sink, lambda: table_counts(spark, sink_path))
        return HandoffCounts(int(state["rows"]), int(state["records"] or 0), int(sink["rows"]))

    def close(self) -> None:
        self.passed.unpersist()


class ProcessStoreStep(StoreStep):
    """Process function: the state rows of the keys with records in the batch and of the keys whose timers the new
    watermark makes due, looked up in the store at the version the previous progress record names; the operator's
    pass (the backlog's own) from them; its outputs appended to the sink once (marked with the batch id),
    then the keys' new rows (and their timers' index entries) replaced in the store, committed as the next version.

    Replays: a micro-batch replayed after a crash looks the same rows up at the same version, so its pass produces
    the same outputs (an append already committed is skipped) and the same next version."""

    logic: ProcessLogic
    VALUES = (STATE, TIMERS, ROWS, MAX_TS)  # a key's row: the user's state (JSON), timers (epoch ms), counters

    @classmethod
    def open_store(cls, spark: SparkSession, logic: ProcessLogic, store_root: str) -> LiveStateStore:
        values = list(cls.VALUES)
        # Timers as the pass writes them (an array that may hold nulls, for Spark), so no cast is needed.
        fields = [
            T.StructField(f.name, T.ArrayType(T.LongType(), True)) if f.name == TIMERS else f
            for f in logic.state_schema.fields
        ]
        schema = T.StructType(fields)
        return LiveStateStore(spark, store_root, RowLayout(tuple(logic.keys), tuple(values), TIMERS), schema)

    @staticmethod
    def start_rows(state: DataFrame) -> DataFrame:
        return state

    def advance(self, spark, store, version, records, watermarks, closing_us, writes) -> int:
        logic, on_time = self.logic, records[SOURCE_LABEL]
        if on_time is None:
            keys = spark_internals.empty_frame(spark, T.StructType([logic.state_schema[k] for k in logic.keys]))
        else:
            keys = on_time.select(*logic.keys)
        found = store.store.lookup(keys, version, closing_us)  # pyright: ignore[reportAttributeAccessIssue]
        try:
            if on_time is None and not found.changed_keys:
                return version  # no records, no timer due: nothing to write
            previous = found.rows if found.changed_keys else None
            passed = logic.increment_pass(on_time, previous, closing_us).persist()
            try:
                out = logic.outputs(passed)
                if not out.isEmpty():
                    writes.append_owned(out, self.sink_path, "sink")
                store.store.replace(logic.states(passed), version).release()  # pyright: ignore[reportAttributeAccessIssue]
            finally:
                passed.unpersist()
        finally:
            found.release()
        return version + 1


class ProcessKind(OperatorKind[ProcessLogic]):
    spec = ProcessOperator
    state_event_time = MAX_TS

    def logic(self, spark: SparkSession, pipeline: Pipeline, schemas: list[T.StructType]) -> ProcessLogic:
        return ProcessLogic(spark, pipeline, schemas[0])

    def backlog(self, spark: SparkSession, pipeline: Pipeline, logic: ProcessLogic, inputs) -> ProcessHandoff:
        (tagged,) = inputs
        final_wm = watermark_after(tagged.running_max_us, pipeline.delay_us)
        return ProcessHandoff(logic, tagged.prepared, final_wm)

    def live_step(self, logic: ProcessLogic, state_path: str, sink_path: str, store_root: str) -> ProcessStoreStep:
        return ProcessStoreStep(logic, state_path, sink_path, store_root)
