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
from phases.keyed_aggregate import (
    MAX_TS,
    KeyedAggregationLogic,
    SessionAggregationLogic,
    WindowedAggregationLogic,
)
from phases.lateness import VERSION
from phases.process_operator import TIMERS as PROCESS_TIMERS
from phases.process_operator import ProcessLogic
from phases.two_input import LEFT, LEFT_ROWS, RIGHT, RIGHT_ROWS, CoGroupLogic, IntervalJoinLogic

QUERY = "increment"  # the query's checkpoint sub-folder
HELD_BY = "_held_by"  # pending rows: the micro-batch that held them back
_OP = "_op"  # session MERGE source: 'upsert' or 'delete'
_TOUCHED = "_touched"
_INPUT = "_input"  # two-input query: the input a row comes from ("" or "right")
_ROW_COLUMNS = ("_row", "_row_right")  # two-input query: each input's row, packed


def _row_column(inp) -> str:
    return inp.suffix("_row")


PROGRESS_SCHEMA = T.StructType(
    [
        T.StructField("batch_id", T.LongType(), False),
        T.StructField("complete_below", T.LongType(), False),
        T.StructField("running_max_us", T.LongType(), True),
        T.StructField("closed_us", T.LongType(), True),
        T.StructField("held_version", T.LongType(), True),
        T.StructField("at_us", T.LongType(), False),
        # a two-input operator's right input (null otherwise)
        T.StructField("right_complete_below", T.LongType(), True),
        T.StructField("right_running_max_us", T.LongType(), True),
        T.StructField("right_held_version", T.LongType(), True),
    ]
)


@dataclass(frozen=True)
class InputProgress:
    """How far one input is applied."""

    complete_below: int  # every version of the input below this one is applied
    running_max_us: int | None  # max valid event time of those versions (W(v) = this - delay)
    held_version: int | None  # a version read only in part, held in the input's pending table


@dataclass(frozen=True)
class Progress:
    """What the live phase had applied after micro-batch ``batch_id`` (-1: the switch). The unprefixed
    input fields are the pipeline's source; ``right_*`` a two-input operator's second source."""

    batch_id: int
    complete_below: int
    running_max_us: int | None
    closed_us: int | None  # windows/sessions/co-group windows ending at or before this were emitted
    held_version: int | None
    at_us: int = 0
    right_complete_below: int | None = None
    right_running_max_us: int | None = None
    right_held_version: int | None = None

    def of(self, label: str) -> InputProgress:
        prefix = f"{label}_" if label else ""
        return InputProgress(
            getattr(self, f"{prefix}complete_below"),
            getattr(self, f"{prefix}running_max_us"),
            getattr(self, f"{prefix}held_version"),
        )

    @staticmethod
    def of_inputs(batch_id: int, inputs: dict[str, InputProgress], closed_us: int | None, at_us: int = 0) -> Progress:
        fields: dict = {"batch_id": batch_id, "closed_us": closed_us, "at_us": at_us}
        for label, inp in inputs.items():
            prefix = f"{label}_" if label else ""
            fields[f"{prefix}complete_below"] = inp.complete_below
            fields[f"{prefix}running_max_us"] = inp.running_max_us
            fields[f"{prefix}held_version"] = inp.held_version
        return Progress(**fields)

    def row(self) -> tuple:
        return tuple(getattr(self, f.name) for f in PROGRESS_SCHEMA.fields)


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


def _upsert(spark: SparkSession, path: str, rows: DataFrame, keys: list[str], app_id: str, batch: int) -> None:
    """Replaces the rows of ``rows``' keys in the table at ``path`` and inserts the new ones: one MERGE,
    skipped when Delta already committed (``app_id``, ``batch``)."""
    with _idempotent_dml(spark, app_id, batch):
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(rows.alias("s"), _eq("t", "s", keys))
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )


# --- the operators' live steps -------------------------------------------------------------------------


class OneInputStep:
    """A single-input operator's step: the watermark that closes windows is the input's own."""

    def closing(self, watermarks: dict[str, int | None]) -> int | None:
        return watermarks[""]

    def apply_inputs(
        self,
        spark: SparkSession,
        records: dict[str, DataFrame | None],
        watermarks: dict[str, int | None],
        closing_us: int | None,
        batch: int,
        app,
    ) -> None:
        self.apply(spark, records[""], closing_us, batch, app)


class KeyedStep(OneInputStep):
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
            _upsert(spark, self.sink_path, logic.finalize(changed), keys, app("sink"), batch)
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
            _upsert(spark, self.state_path, logic.states(passed), keys, app("state"), batch)
        finally:
            passed.unpersist()


class IntervalJoinStep:
    """Interval join: the batch's new rows of each input joined with the other input's rows held in the state
    (one row per key: each input's rows that can still match) and with each other; the pairs appended to the
    sink first, then the new rows merged into their keys' state, leaving out rows no future row of the
    other input can match (its watermark passed ``ts + upper``, or ``ts - lower``).

    A batch replayed after a crash before the state write joins against the same state and appends the same
    pairs (Delta skips the second append); one replayed after it skips both writes. Rows of keys without new
    rows stay until their key gets one: they can match nothing, they only take room."""

    def __init__(self, logic: IntervalJoinLogic, state_path: str, sink_path: str):
        self.logic, self.state_path, self.sink_path = logic, state_path, sink_path

    def closing(self, watermarks: dict[str, int | None]) -> int | None:
        return CoGroupLogic.closing_watermark(watermarks[""], watermarks["right"])

    def _pairs(self, left: DataFrame, right: DataFrame) -> DataFrame:
        logic = self.logic
        joined = left.alias("l").join(logic._renamed_right(right).alias("r"), logic._condition(), "inner")
        return logic._select_output(joined)

    def apply_inputs(self, spark, records, watermarks, closing_us, batch, app) -> None:
        logic, keys, et = self.logic, self.logic.keys, self.logic.event_time
        new_left, new_right = records[""], records["right"]
        if new_left is None and new_right is None:
            return
        left_cols = [f.name for f in logic.fields(LEFT)]
        right_cols = [f.name for f in logic.fields(RIGHT)]
        new_left = None if new_left is None else new_left.select(*left_cols).persist()
        new_right = None if new_right is None else new_right.select(*right_cols).persist()
        try:
            news = [df.select(*keys) for df in (new_left, new_right) if df is not None]
            touched = (news[0] if len(news) == 1 else news[0].unionByName(news[1])).distinct()
            held = spark.read.format("delta").load(self.state_path).join(touched, keys)
            pairs = []
            if new_left is not None:
                old_right = held.select(F.explode(RIGHT_ROWS).alias("_r")).select("_r.*")
                pairs.append(self._pairs(new_left, old_right))
            if new_right is not None:
                old_left = held.select(F.explode(LEFT_ROWS).alias("_r")).select("_r.*")
                pairs.append(self._pairs(old_left, new_right))
            if new_left is not None and new_right is not None:
                pairs.append(self._pairs(new_left, new_right))
            out = pairs[0]
            for more in pairs[1:]:
                out = out.unionByName(more)
            out = out.persist()
            try:
                if not out.isEmpty():
                    tables.append_once(out, self.sink_path, app("sink"), batch)
            finally:
                out.unpersist()
            lifted = []
            if new_left is not None:
                lifted.append(
                    new_left.select(
                        *keys,
                        F.array(logic.rows_struct(LEFT)).alias(LEFT_ROWS),
                        logic.empty_rows(RIGHT).alias(RIGHT_ROWS),
                        F.col(et).alias(MAX_TS),
                    )
                )
            if new_right is not None:
                lifted.append(
                    new_right.select(
                        *keys,
                        logic.empty_rows(LEFT).alias(LEFT_ROWS),
                        F.array(logic.rows_struct(RIGHT)).alias(RIGHT_ROWS),
                        F.col(et).alias(MAX_TS),
                    )
                )
            rows = lifted[0] if len(lifted) == 1 else lifted[0].unionByName(lifted[1])
            grouped = rows.groupBy(*keys).agg(
                F.flatten(F.collect_list(LEFT_ROWS)).alias(LEFT_ROWS),
                F.flatten(F.collect_list(RIGHT_ROWS)).alias(RIGHT_ROWS),
                F.max(MAX_TS).alias(MAX_TS),
            )
            keep_left, keep_right = self._keep(watermarks)
            with _idempotent_dml(spark, app("state"), batch):
                (
                    DeltaTable.forPath(spark, self.state_path)
                    .alias("t")
                    .merge(grouped.alias("s"), _eq("t", "s", keys))
                    .whenMatchedUpdate(
                        set={
                            LEFT_ROWS: f"filter(concat(t.{LEFT_ROWS}, s.{LEFT_ROWS}), {keep_left})",
                            RIGHT_ROWS: f"filter(concat(t.{RIGHT_ROWS}, s.{RIGHT_ROWS}), {keep_right})",
                            MAX_TS: f"greatest(t.{MAX_TS}, s.{MAX_TS})",
                        }
                    )
                    .whenNotMatchedInsert(
                        values={
                            **{k: f"s.`{k}`" for k in keys},
                            LEFT_ROWS: f"filter(s.{LEFT_ROWS}, {keep_left})",
                            RIGHT_ROWS: f"filter(s.{RIGHT_ROWS}, {keep_right})",
                            MAX_TS: f"s.{MAX_TS}",
                        }
                    )
                    .execute()
                )
        finally:
            for df in (new_left, new_right):
                if df is not None:
                    df.unpersist()

    def _keep(self, watermarks: dict[str, int | None]) -> tuple[str, str]:
        """SQL lambdas: a left row is kept while a future right row (ts > the right watermark) can match it
        (``ts + upper > right_wm``); a right row while a future left row can (``ts - lower > left_wm``)."""
        logic, et = self.logic, self.logic.event_time
        left_wm, right_wm = watermarks[""], watermarks["right"]
        keep_left = "x -> true"
        if right_wm is not None:
            keep_left = f"x -> x.`{et}` > timestamp_micros({right_wm - logic.upper_ms * 1000})"
        keep_right = "x -> true"
        if left_wm is not None:
            keep_right = f"x -> x.`{et}` > timestamp_micros({left_wm + logic.lower_ms * 1000})"
        return keep_left, keep_right


class CoGroupStep:
    """Co-group: the batch's rows of both inputs collected into their (key, window) in the state (one
    MERGE); the windows both watermarks closed passed to the user's function, its rows appended to the sink
    once, then those windows removed from the state. Read back from the state after its write, so a replayed
    batch emits exactly what the first attempt would have."""

    def __init__(self, logic: CoGroupLogic, state_path: str, sink_path: str):
        self.logic, self.state_path, self.sink_path = logic, state_path, sink_path

    def closing(self, watermarks: dict[str, int | None]) -> int | None:
        return CoGroupLogic.closing_watermark(watermarks[""], watermarks["right"])

    def apply_inputs(self, spark, records, watermarks, closing_us, batch, app) -> None:
        logic = self.logic
        lifted = [
            logic.lift(df, side) for df, side in ((records[""], LEFT), (records["right"], RIGHT)) if df is not None
        ]
        if lifted:
            rows = lifted[0] if len(lifted) == 1 else lifted[0].unionByName(lifted[1])
            windows = rows.groupBy(*logic.group).agg(*logic.merge_columns())
            with _idempotent_dml(spark, app("state"), batch):
                (
                    DeltaTable.forPath(spark, self.state_path)
                    .alias("t")
                    .merge(windows.alias("s"), _eq("t", "s", logic.group))
                    .whenMatchedUpdate(set={c: f"concat(t.{c}, s.{c})" for c in (LEFT_ROWS, RIGHT_ROWS)})
                    .whenNotMatchedInsertAll()
                    .execute()
                )
        if closing_us is None:
            return
        closed = F.col(WINDOW_END) <= F.timestamp_micros(F.lit(closing_us))
        state = spark.read.format("delta").load(self.state_path)
        windows = state.filter(closed).persist()
        try:
            if windows.isEmpty():
                return
            out = logic.apply(windows)
            tables.append_once(out, self.sink_path, app("sink"), batch)
            with _idempotent_dml(spark, app("closed"), batch):
                DeltaTable.forPath(spark, self.state_path).delete(closed)
        finally:
            windows.unpersist()


def step_for(logic, state_path: str, sink_path: str):
    """The live step of an operator's logic."""
    if isinstance(logic, ProcessLogic):
        return ProcessStep(logic, state_path, sink_path)
    if isinstance(logic, IntervalJoinLogic):
        return IntervalJoinStep(logic, state_path, sink_path)
    if isinstance(logic, CoGroupLogic):
        return CoGroupStep(logic, state_path, sink_path)
    if isinstance(logic, SessionAggregationLogic):
        return SessionStep(logic, state_path, sink_path)
    if isinstance(logic, WindowedAggregationLogic):
        return WindowStep(logic, state_path, sink_path)
    return KeyedStep(logic, state_path, sink_path)


# --- the driver ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveInput:
    """One source the live query reads: the pipeline's (label ``""``) or a two-input operator's right one."""

    label: str
    source: DeltaTableSource
    after_version: int | None  # the handoff's version of this source (None: from the first version)

    def suffix(self, what: str) -> str:
        return f"{what}_{self.label}" if self.label else what


class IncrementalLive:
    """One live run (``run_name``) of a pipeline: its query, progress and pending tables."""

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        *,
        run_name: str,
        logic,
        inputs: list[LiveInput],
        start: Progress,
        state_path: str,
        checkpoints: str,
        max_files_per_trigger: int | None,
    ):
        self.spark, self.pipeline, self.run_name, self.logic = spark, pipeline, run_name, logic
        self.inputs, self.start_progress = inputs, start
        self.state_path, self.checkpoints = state_path, checkpoints
        self.max_files_per_trigger = max_files_per_trigger
        self.progress_path = progress_path(pipeline, run_name)
        self.pending_root = live_root(pipeline, run_name)
        self.step = step_for(logic, state_path, pipeline.sink.path)
        self.query: StreamingQuery | None = None
        self._progress: dict[int, Progress] = {}
        self._table_ids: dict[str, str] = {}

    def use(self, logic) -> None:
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

    def _pending_path(self, inp: LiveInput) -> str:
        return f"{self.pending_root}/{inp.suffix('pending')}"

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

    def _end_offsets(self, batch_id: int) -> dict[str, tuple[int, bool]]:
        """Per input: (first version not fully read, whether that version was read in part) after
        ``batch_id``; an input the query has not read yet is missing.

        From Spark's offset log, written before the batch runs (one line per source, told apart by the
        Delta table id): Delta's offset is (reservoirVersion, index); index -1 means every version below
        reservoirVersion is read, index >= 0 that reservoirVersion is read up to that file only."""
        path = f"{self.checkpoints}/{QUERY}/offsets/{batch_id}"
        text = fs.read_text(self.spark, path)
        by_id = {table_id: label for label, table_id in self._table_ids.items()}
        out: dict[str, tuple[int, bool]] = {}
        for line in text.splitlines():
            if '"reservoirVersion"' not in line:
                continue
            offset = json.loads(line)
            label = by_id.get(offset.get("reservoirId"), "" if len(self.inputs) == 1 else None)
            if label is None:
                raise PhaseStateError(f"{path}: a Delta source offset of an unknown table: {line!r}")
            out[label] = (int(offset["reservoirVersion"]), int(offset["index"]) >= 0)
        if not out and len(self.inputs) == 1:
            raise PhaseStateError(f"no Delta source offset in {path}: {text!r}")
        return out

    # --- one micro-batch -----------------------------------------------------------------------------
    def _held(self, spark: SparkSession, inp: LiveInput, batch_id: int) -> DataFrame:
        held = spark.read.format("delta").load(self._pending_path(inp))
        return held.filter(F.col(HELD_BY) == batch_id).drop(HELD_BY)

    def _rows_of(self, batch: DataFrame, inp: LiveInput) -> DataFrame:
        """The change rows of one input in the query's micro-batch (two inputs: unpacked from the union)."""
        if len(self.inputs) == 1:
            return batch
        meta = [c for c in batch.columns if c.startswith("_") and c not in (_INPUT, *_ROW_COLUMNS)]
        return batch.filter(F.col(_INPUT) == inp.label).select(f"{_row_column(inp)}.*", *meta)

    def _tag_input(
        self, spark: SparkSession, inp: LiveInput, batch: DataFrame, batch_id: int, before: InputProgress, ends
    ) -> tuple[DataFrame | None, InputProgress, DataFrame]:
        """Holds back a version read in part, tags the complete ones, quarantines; returns (on-time
        records or None, the input's progress after the batch, the persisted rows to unpersist)."""
        p = self.pipeline
        rows = self._rows_of(batch, inp)
        if before.held_version is not None:
            rows = self._held(spark, inp, batch_id - 1).unionByName(rows, allowMissingColumns=True)
        rows = rows.persist()
        end_version, partial_tail = ends.get(inp.label, (before.complete_below, False))
        held_version = None
        if partial_tail:  # the tail of version end_version waits for the batch that completes it
            held_version = end_version
            held = rows.filter(F.col(VERSION) >= end_version).withColumn(HELD_BY, F.lit(batch_id).cast("long"))
            tables.append_once(
                held, self._pending_path(inp), self.app(inp.suffix("pending")), batch_id, merge_schema=True
            )
        complete = rows.filter(F.col(VERSION) < end_version)
        tagged = tag_changes(spark, p, complete, before.running_max_us, phase="live", batch_id=batch_id)
        if tagged.has_quarantine:
            q_rows = tagged.quarantine
            if inp.label:
                q_rows = q_rows.withColumn("reason", F.concat(F.lit(quarantine.RIGHT_INPUT_REASON), F.col("reason")))
            tables.append_once(q_rows, p.locations.quarantine, self.app(inp.suffix("quarantine")), batch_id)
        after = InputProgress(max(end_version, before.complete_below), tagged.running_max_us, held_version)
        return (tagged.prepared if tagged.has_on_time else None), after, rows

    def apply_batch(self, batch: DataFrame, batch_id: int) -> None:
        spark, p = batch.sparkSession, self.pipeline
        before = self._progress_after(batch_id - 1)
        ends = self._end_offsets(batch_id)
        records: dict[str, DataFrame | None] = {}
        after: dict[str, InputProgress] = {}
        persisted: list[DataFrame] = []
        try:
            for inp in self.inputs:
                records[inp.label], after[inp.label], rows = self._tag_input(
                    spark, inp, batch, batch_id, before.of(inp.label), ends
                )
                persisted.append(rows)
            watermarks = {
                label: None if a.running_max_us is None else a.running_max_us - p.delay_us for label, a in after.items()
            }
            closing = self.step.closing(watermarks)
            if any(r is not None for r in records.values()) or closing != before.closed_us:
                self.step.apply_inputs(spark, records, watermarks, closing, batch_id, self.app)
            progress = Progress.of_inputs(
                batch_id, after, closing if closing is not None else before.closed_us, _now_us()
            )
            row = spark.createDataFrame([progress.row()], PROGRESS_SCHEMA)
            # mergeSchema: a progress table created before the right-input columns existed takes them up.
            tables.append_once(row, self.progress_path, self.app("progress"), batch_id, merge_schema=True)
            self._progress = {batch_id: progress}
        finally:
            for rows in persisted:
                rows.unpersist()

    # --- running -------------------------------------------------------------------------------------
    def _stream(self) -> DataFrame:
        """The query's input: the one source's change feed, or the inputs' change feeds in one union, each
        input's row packed in its own struct column (their schemas differ) next to the change columns."""
        streams = [inp.source.read_live(inp.after_version, self.max_files_per_trigger) for inp in self.inputs]
        if len(streams) == 1:
            return streams[0]
        user = [[f for f in s.schema.fields if not f.name.startswith("_")] for s in streams]
        packed = []
        for i, (inp, stream) in enumerate(zip(self.inputs, streams, strict=True)):
            meta = [c for c in stream.columns if c.startswith("_")]
            rows = []
            for j, other in enumerate(self.inputs):
                struct_type = T.StructType(user[j])
                if i == j:
                    rows.append(F.struct(*[F.col(f.name) for f in user[j]]).alias(_row_column(other)))
                else:
                    rows.append(F.lit(None).cast(struct_type).alias(_row_column(other)))
            packed.append(stream.select(F.lit(inp.label).alias(_INPUT), *rows, *meta))
        return packed[0].unionByName(packed[1])

    def start(self, trigger: dict, name: str) -> StreamingQuery:
        self.prepare()
        self._table_ids = {inp.label: inp.source.table_id() for inp in self.inputs}
        self.query = (
            self._stream()
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
    return logic.buffer_schema if isinstance(logic, KeyedAggregationLogic) else logic.state_schema


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
