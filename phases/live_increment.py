"""The live phase as a continuous increment: one streaming query per live input, no staging table.

Used for the aggregation family (keyed aggregations, tumbling/sliding windows, session windows) and process
functions (their state and timers on Delta, run through the backlog's own pass). The query
reads the source's change feed after the handoff version; each micro-batch runs, in ``foreachBatch``, the
same steps a catch-up increment runs over a version range (:func:`phases.backlog.tag_changes`, the
operator's lift and merge):

1. **complete versions only**: the batch's end offset (Spark's offset log, written before the batch runs)
   says whether its last source version is complete. A version split across micro-batches (file limits, a
   restart with many versions pending) is *held back* in a small ``pending`` table and applied whole with
   the batch that completes it. So the version watermark W(v) and the closing of windows and sessions see
   exactly what one streaming job over one version per micro-batch sees, for any split and any merge of
   versions into micro-batches;
2. validation and lateness by W(v), continuing from the progress of the previous batch; invalid and late
   records to the quarantine (only when there are any);
3. the operator's increment merged into its state table on Delta (one MERGE; the same buffers the backlog
   hands over, so the switch replays nothing: the live phase starts on the handoff's state table);
4. the sink: changed keys upserted (keyed aggregation), or the windows/sessions the watermark closed
   appended and removed from the state;
5. last, one progress row (running maximum event time, closed watermark, held version).

Every write is idempotent per micro-batch (Delta ``txnAppId``/``txnVersion`` = the batch id, also for the
MERGE and DELETE statements), and everything the sink gets is read back from the state *after* the state
write, so a micro-batch replayed after a crash at any point writes exactly what the first attempt would
have. Spark's own watermark is not used: there is no stateful Spark operator in the query.

At the switch the live phase writes its first progress row (batch -1: the handoff's version, maximum event
time and final watermark) before the query starts: its immediate checkpoint. Nothing is replayed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from phases import fs, maintenance, quarantine, tables
from phases.backlog import tag_changes
from phases.definition import WINDOW_END, WINDOW_START, Pipeline
from phases.delta_source import DeltaTableSource
from phases.errors import PhaseStateError
from phases.keyed_aggregate import KeyedAggregationLogic, SessionAggregationLogic, WindowedAggregationLogic
from phases.lateness import VERSION
from phases.process_operator import TIMERS as PROCESS_TIMERS
from phases.process_operator import ProcessLogic

QUERY = "increment"  # the query's checkpoint sub-folder
HELD_BY = "_held_by"  # pending rows: the micro-batch that held them back
_OP = "_op"  # session MERGE source: 'upsert' or 'delete'
_TOUCHED = "_touched"

PROGRESS_SCHEMA = T.StructType(
    [
        T.StructField("batch_id", T.LongType(), False),
        T.StructField("complete_below", T.LongType(), False),
        T.StructField("running_max_us", T.LongType(), True),
        T.StructField("closed_us", T.LongType(), True),
        T.StructField("held_version", T.LongType(), True),
        T.StructField("at_us", T.LongType(), False),
    ]
)


@dataclass(frozen=True)
class Progress:
    """What the live phase had applied after micro-batch ``batch_id`` (-1: the switch)."""

    batch_id: int
    complete_below: int  # every source version below this one is applied
    running_max_us: int | None  # max valid event time of those versions (W(v) = this - delay)
    closed_us: int | None  # windows/sessions ending at or before this were emitted
    held_version: int | None  # a version read only in part, held in the pending table
    at_us: int = 0

    def row(self) -> tuple:
        return (
            self.batch_id,
            self.complete_below,
            self.running_max_us,
            self.closed_us,
            self.held_version,
            self.at_us,
        )


@contextmanager
def _idempotent_dml(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """Delta skips a DML statement (MERGE, DELETE) whose (app id, version) it has already committed."""
    spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(version))
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


def _eq(t: str, s: str, columns: list[str]) -> str:
    return " AND ".join(f"{t}.`{c}` = {s}.`{c}`" for c in columns)


# --- the operators' live steps -------------------------------------------------------------------------


class KeyedStep:
    """Keyed aggregation: the batch's buffers merged into each key's state, changed keys upserted."""

    def __init__(self, logic: KeyedAggregationLogic, state_path: str, sink_path: str):
        self.logic, self.state_path, self.sink_path = logic, state_path, sink_path

    def apply(self, spark: SparkSession, records: DataFrame | None, closing_us: int | None, batch: int, app) -> None:
        if records is None:
            return
        logic, keys = self.logic, self.logic.keys
        partial = logic.merge(logic.lift(records)).persist()
        try:
            with _idempotent_dml(spark, app("state"), batch):
                (
                    DeltaTable.forPath(spark, self.state_path)
                    .alias("t")
                    .merge(partial.alias("s"), _eq("t", "s", keys))
                    .whenMatchedUpdate(set=logic.combine_set("t", "s"))
                    .whenNotMatchedInsertAll()
                    .execute()
                )
            # Read back after the state write: a replayed batch (state already merged) writes the same rows.
            changed = spark.read.format("delta").load(self.state_path).join(F.broadcast(partial.select(*keys)), keys)
            with _idempotent_dml(spark, app("sink"), batch):
                (
                    DeltaTable.forPath(spark, self.sink_path)
                    .alias("t")
                    .merge(logic.finalize(changed).alias("s"), _eq("t", "s", keys))
                    .whenMatchedUpdateAll()
                    .whenNotMatchedInsertAll()
                    .execute()
                )
        finally:
            partial.unpersist()


class WindowStep(KeyedStep):
    """Windows: the batch's buffers merged into the open windows; windows the watermark closed appended
    to the sink once and removed from the state."""

    def apply(self, spark: SparkSession, records: DataFrame | None, closing_us: int | None, batch: int, app) -> None:
        if records is not None:
            logic = self.logic
            partial = logic.merge(logic.lift(records))
            with _idempotent_dml(spark, app("state"), batch):
                (
                    DeltaTable.forPath(spark, self.state_path)
                    .alias("t")
                    .merge(partial.alias("s"), _eq("t", "s", logic.keys))
                    .whenMatchedUpdate(set=logic.combine_set("t", "s"))
                    .whenNotMatchedInsertAll()
                    .execute()
                )
        self.close(spark, closing_us, batch, app)

    def close(self, spark: SparkSession, closing_us: int | None, batch: int, app) -> None:
        """Emits the windows ending at or before ``closing_us`` and drops them from the state."""
        if closing_us is None:
            return
        closed = F.col(WINDOW_END) <= F.timestamp_micros(F.lit(closing_us))
        state = spark.read.format("delta").load(self.state_path)
        out = self.logic.finalize(state.filter(closed)).persist()
        try:
            if out.isEmpty():
                return
            tables.append_once(out, self.sink_path, app("sink"), batch)
            with _idempotent_dml(spark, app("closed"), batch):
                DeltaTable.forPath(spark, self.state_path).delete(closed)
        finally:
            out.unpersist()


class SessionStep(WindowStep):
    """Sessions: the touched keys' open sessions re-merged with the batch's records (one MERGE replaces
    them), then the sessions the watermark closed emitted like windows."""

    logic: SessionAggregationLogic

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
                with _idempotent_dml(spark, app("state"), batch):
                    (
                        DeltaTable.forPath(spark, self.state_path)
                        .alias("t")
                        .merge(source.alias("s"), _eq("t", "s", bounds))
                        .whenMatchedDelete(condition=f"s.{_OP} = 'delete'")
                        .whenMatchedUpdate(set={c: f"s.`{c}`" for c in logic.buffer_names})
                        .whenNotMatchedInsert(condition=f"s.{_OP} = 'upsert'", values={c: f"s.`{c}`" for c in cols})
                        .execute()
                    )
            finally:
                partial.unpersist()
        self.close(spark, closing_us, batch, app)


class ProcessStep:
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
            due = F.exists(F.col(PROCESS_TIMERS), lambda t: t * 1000 <= F.lit(closing_us))
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
            with _idempotent_dml(spark, app("state"), batch):
                (
                    DeltaTable.forPath(spark, self.state_path)
                    .alias("t")
                    .merge(logic.states(passed).alias("s"), _eq("t", "s", keys))
                    .whenMatchedUpdateAll()
                    .whenNotMatchedInsertAll()
                    .execute()
                )
        finally:
            passed.unpersist()


def step_for(logic, state_path: str, sink_path: str):
    """The live step of an operator's logic."""
    if isinstance(logic, ProcessLogic):
        return ProcessStep(logic, state_path, sink_path)
    if isinstance(logic, SessionAggregationLogic):
        return SessionStep(logic, state_path, sink_path)
    if isinstance(logic, WindowedAggregationLogic):
        return WindowStep(logic, state_path, sink_path)
    return KeyedStep(logic, state_path, sink_path)


# --- the driver ----------------------------------------------------------------------------------------


class IncrementalLive:
    """One live run (``run_name``) of an aggregation pipeline: its query, progress and pending tables."""

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        *,
        run_name: str,
        logic: KeyedAggregationLogic | ProcessLogic,
        source: DeltaTableSource,
        after_version: int | None,
        start: Progress,
        state_path: str,
        checkpoints: str,
        max_files_per_trigger: int | None,
    ):
        self.spark, self.pipeline, self.run_name, self.logic = spark, pipeline, run_name, logic
        self.source, self.after_version, self.start_progress = source, after_version, start
        self.state_path, self.checkpoints = state_path, checkpoints
        self.max_files_per_trigger = max_files_per_trigger
        self.progress_path = progress_path(pipeline, run_name)
        self.pending_path = f"{live_root(pipeline, run_name)}/pending"
        self.step = step_for(logic, state_path, pipeline.sink.path)
        self.query: StreamingQuery | None = None
        self._progress: dict[int, Progress] = {}

    def use(self, logic: KeyedAggregationLogic | ProcessLogic) -> None:
        """Runs the next micro-batches with ``logic`` (rebuilt after a source schema change)."""
        self.logic = logic
        self.step = step_for(logic, self.state_path, self.pipeline.sink.path)

    # --- tables ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Creates the sink, quarantine and state if missing, and writes the switch's progress row."""
        spark, p = self.spark, self.pipeline
        quarantine.ensure(spark, p.locations.quarantine)
        tables.ensure(spark, p.sink.path, self.logic.output_schema)
        tables.ensure(spark, self.state_path, state_schema(self.logic))
        if p.maintenance.auto_compact:
            maintenance.enable_auto_compaction(spark, self.state_path, p.sink.path)
        if not tables.exists(spark, self.progress_path):
            # One commit creates the table with its first row: the live phase's immediate checkpoint.
            row = spark.createDataFrame([self.start_progress.row()], PROGRESS_SCHEMA)
            row.write.format("delta").mode("append").save(self.progress_path)

    def app(self, what: str) -> str:
        return f"{self.pipeline.name}:{self.run_name}:{what}"

    def _progress_after(self, batch_id: int) -> Progress:
        """The progress row written by micro-batch ``batch_id`` (-1: the switch's)."""
        if batch_id in self._progress:
            return self._progress[batch_id]
        rows = (
            self.spark.read.format("delta")
            .load(self.progress_path)
            .filter(F.col("batch_id") <= batch_id)
            .orderBy(F.col("batch_id").desc())
            .limit(1)
            .collect()
        )
        if not rows or rows[0]["batch_id"] != batch_id:
            found = rows[0]["batch_id"] if rows else None
            raise PhaseStateError(
                f"live run {self.run_name} of {self.pipeline.name!r}: micro-batch {batch_id + 1} needs the progress "
                f"of micro-batch {batch_id}, but {self.progress_path} ends at {found}; the checkpoint "
                f"{self.checkpoints} and the progress table no longer belong together"
            )
        return Progress(**rows[0].asDict())

    def latest_progress(self) -> Progress:
        if self._progress:
            return self._progress[max(self._progress)]
        row = spark_last(self.spark, self.progress_path)
        return Progress(**row.asDict()) if row is not None else self.start_progress

    def _end_offset(self, batch_id: int) -> tuple[int, bool]:
        """(first version not fully read, whether that version was read in part) after ``batch_id``.

        From Spark's offset log, written before the batch runs: Delta's offset is (reservoirVersion, index);
        index -1 means every version below reservoirVersion is read, index >= 0 that reservoirVersion is read
        up to that file only."""
        text = fs.read_text(self.spark, f"{self.checkpoints}/{QUERY}/offsets/{batch_id}")
        for line in text.splitlines():
            if '"reservoirVersion"' in line:
                offset = json.loads(line)
                return int(offset["reservoirVersion"]), int(offset["index"]) >= 0
        raise PhaseStateError(f"no Delta source offset in {self.checkpoints}/{QUERY}/offsets/{batch_id}: {text!r}")

    # --- one micro-batch -----------------------------------------------------------------------------
    def _held(self, spark: SparkSession, batch_id: int) -> DataFrame:
        return spark.read.format("delta").load(self.pending_path).filter(F.col(HELD_BY) == batch_id).drop(HELD_BY)

    def apply_batch(self, batch: DataFrame, batch_id: int) -> None:
        spark, p = batch.sparkSession, self.pipeline
        before = self._progress_after(batch_id - 1)
        end_version, partial_tail = self._end_offset(batch_id)
        rows = batch
        if before.held_version is not None:
            rows = self._held(spark, batch_id - 1).unionByName(rows, allowMissingColumns=True)
        rows = rows.persist()
        try:
            held_version = None
            if partial_tail:  # the tail of version end_version waits for the batch that completes it
                held_version = end_version
                held = rows.filter(F.col(VERSION) >= end_version).withColumn(HELD_BY, F.lit(batch_id).cast("long"))
                held.write.format("delta").mode("append").option("txnAppId", self.app("pending")).option(
                    "txnVersion", batch_id
                ).option("mergeSchema", "true").save(self.pending_path)
            complete = rows.filter(F.col(VERSION) < end_version)
            tagged = tag_changes(spark, p, complete, before.running_max_us, phase="live", batch_id=batch_id)
            if tagged.has_quarantine:
                tables.append_once(tagged.quarantine, p.locations.quarantine, self.app("quarantine"), batch_id)
            running = tagged.running_max_us
            closing = None if running is None else running - p.delay_us
            records = tagged.prepared if tagged.has_on_time else None
            if records is not None or closing != before.closed_us:
                self.step.apply(spark, records, closing, batch_id, self.app)
            after = Progress(
                batch_id,
                max(end_version, before.complete_below),
                running,
                closing if closing is not None else before.closed_us,
                held_version,
                _now_us(),
            )
            row = spark.createDataFrame([after.row()], PROGRESS_SCHEMA)
            tables.append_once(row, self.progress_path, self.app("progress"), batch_id)
            self._progress = {batch_id: after}
        finally:
            rows.unpersist()

    # --- running -------------------------------------------------------------------------------------
    def start(self, trigger: dict, name: str) -> StreamingQuery:
        self.prepare()
        self.query = (
            self.source.read_live(self.after_version, self.max_files_per_trigger)
            .writeStream.queryName(name)
            .foreachBatch(self.apply_batch)
            .option("checkpointLocation", f"{self.checkpoints}/{QUERY}")
            .trigger(**trigger)
            .start()
        )
        return self.query

    def status(self) -> dict:
        """The query's rates, and the pipeline's own watermark and last applied version (Spark has none)."""
        q = self.query
        prog = q.lastProgress if q is not None else None
        latest = self.latest_progress()
        watermark = None
        if latest.running_max_us is not None:
            watermark = _iso(latest.running_max_us - self.pipeline.delay_us)
        return {
            "active": bool(q and q.isActive),
            "batch_id": prog.get("batchId") if prog else None,
            "input_rows_per_second": prog.get("inputRowsPerSecond") if prog else None,
            "processed_rows_per_second": prog.get("processedRowsPerSecond") if prog else None,
            "watermark": watermark,
            "source_version": latest.complete_below - 1,
        }


def state_schema(logic) -> T.StructType:
    """The schema of an operator's state table."""
    return logic.state_schema if isinstance(logic, ProcessLogic) else logic.buffer_schema


def live_root(pipeline: Pipeline, run_name: str) -> str:
    return pipeline.locations.live_run(run_name)


def progress_path(pipeline: Pipeline, run_name: str) -> str:
    return f"{live_root(pipeline, run_name)}/progress"


def spark_last(spark: SparkSession, path: str):
    if not tables.exists(spark, path):
        return None
    rows = spark.read.format("delta").load(path).orderBy(F.col("batch_id").desc()).limit(1).collect()
    return rows[0] if rows else None


def _now_us() -> int:
    return time.time_ns() // 1000


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=UTC).isoformat().replace("+00:00", "Z")
