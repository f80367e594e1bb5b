"""The live phase: Structured Streaming over the source's versions after the handoff's V.

Keyed aggregations, windows, sessions and process functions run as a continuous increment: one streaming
query per live input, no staging table, state on Delta, exact under any split of versions into
micro-batches (:mod:`phases.live_increment`). Two-input operators still run the earlier layout described
below (moving them is the next step of the live-phase rebuild).

Two streaming queries, each with its own checkpoint under ``checkpoints/<manifest_id>/``:

* **tagger** reads the source's change feed after version V, validates records, tags late ones with
  the version watermark (:mod:`phases.lateness`, continuing from the backlog's maximum event time),
  appends on-time records to the ``live_input`` table and quarantines the rest. Every write of a
  micro-batch is idempotent (Delta ``txnAppId``/``txnVersion`` = the batch id), so a replayed batch
  never duplicates.
* **aggregate** streams the union of the handed-over state (one buffer row per key, read as a stream of
  the state table) and the lifted live records through the keyed aggregation's merge in Spark's own
  state store, and upserts changed keys into the sink. Its first micro-batch replays the state: that is
  the immediate checkpoint of the switch. The state rows carry each key's max event time, so after it
  Spark's watermark is the final backlog watermark. On restart the state table's offsets are already
  committed, so the state is never applied twice and the backlog is never re-read.

``LiveRunner.streaming_only`` runs the same queries from the source's first version with an empty
state: one streaming job over all the data, the reference the two-phase result must equal.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import PurePosixPath

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from phases import lateness, leases, manifest, quarantine, schema_evolution, tables
from phases.backlog import live_checkpoint_root
from phases.definition import WINDOW_START, Pipeline
from phases.delta_source import DeltaTableSource
from phases.end_of_stream import EndOfStreamRunner, prepared_schema
from phases.errors import DefinitionError, PhaseStateError
from phases.keyed_aggregate import (
    logic_for,
)
from phases.live_increment import IncrementalLive, Progress, state_schema
from phases.process_operator import ProcessLogic, process_logic_for
from phases.records import split_invalid
from phases.two_input import CoGroupLogic, two_input_logic_for

STREAMING_ONLY = "streaming-only"
BATCH_ID = "_batch_id"
PROGRESS_SCHEMA = T.StructType(
    [
        T.StructField("batch_id", T.LongType(), False),
        T.StructField("version", T.LongType(), False),
        T.StructField("max_event_time_us", T.LongType(), False),
    ]
)


@contextmanager
def _session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """Sets runtime SQL confs for the duration of the block (a streaming query started inside keeps them)."""
    before = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


@dataclass(frozen=True)
class LiveInput:
    """One source of the live phase and the tables its tagger writes (the right input of a two-input
    operator has its own: its versions, watermark and progress are its own)."""

    label: str  # "" for the pipeline's source, "right" for a two-input operator's second source
    source: DeltaTableSource
    after_version: int | None  # the handoff's version of this source (None: from the first version)
    base_max_us: int | None  # this source's backlog max event time
    live_input: str
    progress: str

    def suffix(self, what: str) -> str:
        return f"{what}_{self.label}" if self.label else what


@dataclass(frozen=True)
class LiveStart:
    """What starting the live phase took."""

    run_name: str
    start_seconds: float  # queries started -> first aggregate checkpoint committed
    first_checkpoint_at_us: int  # wall clock of that commit


class LiveRunner:
    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        handoff: manifest.HandoffManifest | None,
        *,
        max_files_per_trigger: int | None = None,
        operator_batches: int | None = None,
        take_over: bool = False,
    ):
        """Use :meth:`from_manifest` or :meth:`streaming_only`. ``max_files_per_trigger`` splits the source
        reads into micro-batches; ``operator_batches`` also splits a process or two-input operator's reads of the tagged
        records (available now) into about that many micro-batches (benchmarks of stream mode). ``take_over``
        takes the pipeline's live lease over from a holder whose process is gone."""
        self.spark = spark
        self.take_over = take_over
        self.lease: leases.Lease | None = None
        self.pipeline = pipeline
        self.handoff = handoff
        self.max_files_per_trigger = max_files_per_trigger
        self.operator_batches = operator_batches
        self.source = DeltaTableSource(spark, pipeline.source)
        if handoff is None and pipeline.enrich is not None:
            raise PhaseStateError(
                f"pipeline {pipeline.name!r} enriches with end-of-stream step {pipeline.enrich.step!r}, which emits "
                "only after the backlog ends: it has no single-streaming-job form; start it from a handoff"
            )
        records = prepared_schema(spark, pipeline, self.source.schema())
        self.run_name = handoff.manifest_id if handoff else STREAMING_ONLY
        self.holder = f"live run {self.run_name} ({uuid.uuid4().hex[:8]})"
        loc = pipeline.locations
        self.checkpoints = live_checkpoint_root(pipeline, self.run_name)
        self.live_input = str(PurePosixPath(loc.live_input) / self.run_name)
        self.progress = str(PurePosixPath(loc.live_progress) / self.run_name)
        self.state_path = handoff.state_path if handoff else str(PurePosixPath(loc.state_root) / STREAMING_ONLY)
        self.inputs = [
            LiveInput(
                "",
                self.source,
                handoff.source_version if handoff else None,
                handoff.backlog_max_event_time_us if handoff else None,
                self.live_input,
                self.progress,
            )
        ]
        self.process = process_logic_for(spark, pipeline, records)
        self.two_input = None
        if pipeline.right_source is not None:
            right = DeltaTableSource(spark, pipeline.right_source)
            self.two_input = two_input_logic_for(pipeline, records, right.schema())
            self.inputs.append(
                LiveInput(
                    "right",
                    right,
                    handoff.right_source_version if handoff else None,
                    handoff.right_max_event_time_us if handoff else None,
                    f"{self.live_input}__right",
                    f"{self.progress}__right",
                )
            )
            self.carriers = f"{self.live_input}__carriers"
        self.logic = self.process or self.two_input or logic_for(pipeline, records)
        self.taggers: list[StreamingQuery] = []
        self.aggregate: StreamingQuery | None = None
        self.incremental: IncrementalLive | None = None
        if self.two_input is None:
            start = Progress(
                batch_id=-1,
                complete_below=handoff.source_version + 1 if handoff else 0,
                running_max_us=handoff.backlog_max_event_time_us if handoff else None,
                closed_us=handoff.final_watermark_us if handoff else None,
                held_version=None,
            )
            self.incremental = IncrementalLive(
                spark,
                pipeline,
                run_name=self.run_name,
                logic=self.logic,
                source=self.source,
                after_version=handoff.source_version if handoff else None,
                start=start,
                state_path=self.state_path,
                checkpoints=self.checkpoints,
                max_files_per_trigger=max_files_per_trigger,
            )

    @property
    def tagger(self) -> StreamingQuery | None:
        """The pipeline source's tagger query."""
        return self.taggers[0] if self.taggers else None

    @classmethod
    def from_manifest(
        cls, spark: SparkSession, pipeline: Pipeline, manifest_id: str | None = None, **kwargs
    ) -> LiveRunner:
        """The live phase of the newest handoff (which must be ``manifest_id`` when given); refuses a
        missing, partial, superseded or mismatched manifest."""
        handoff = manifest.latest(spark, pipeline.locations.manifests, pipeline.name, manifest_id)
        manifest.check_matches(spark, handoff, pipeline)
        EndOfStreamRunner(spark, pipeline).require_finished(handoff.source_version)
        return cls(spark, pipeline, handoff, **kwargs)

    @classmethod
    def streaming_only(cls, spark: SparkSession, pipeline: Pipeline, **kwargs) -> LiveRunner:
        """One streaming job over all versions from the first, with empty initial state."""
        return cls(spark, pipeline, None, **kwargs)

    # --- set-up ----------------------------------------------------------------------------------
    def _prepare_tables(self) -> None:
        p, spark = self.pipeline, self.spark
        for inp in self.inputs:
            input_schema = T.StructType(
                [
                    *inp.source.schema().fields,
                    T.StructField(lateness.VERSION, T.LongType()),
                    T.StructField(lateness.WATERMARK_US, T.LongType()),  # W(v) of the record's version
                    T.StructField(BATCH_ID, T.LongType()),
                ]
            )
            tables.ensure(spark, inp.live_input, input_schema)
            tables.ensure(spark, inp.progress, PROGRESS_SCHEMA)
        quarantine.ensure(spark, p.locations.quarantine)
        tables.ensure(spark, p.sink.path, self.logic.output_schema)
        if self.handoff is None:
            tables.ensure(spark, self.state_path, self.two_input.state_schema)
        if self.two_input is not None:
            left, right = (self._max_event_time_us(inp) for inp in self.inputs)
            self.two_input.carriers(spark, left, right).write.format("delta").mode("append").save(self.carriers)

    def _max_event_time_us(self, inp: LiveInput) -> int | None:
        """The greatest valid event time of an input so far: backlog and tagged live versions."""
        row = self.spark.read.format("delta").load(inp.progress).agg(F.max("max_event_time_us")).collect()[0]
        found = [m for m in (inp.base_max_us, row[0]) if m is not None]
        return max(found) if found else None

    def _app_id(self, what: str) -> str:
        return f"{self.pipeline.name}:{self.run_name}:{what}"

    # --- tagger ----------------------------------------------------------------------------------
    def _prior_maxima(self, inp: LiveInput, batch_id: int) -> list[tuple[int, int]]:
        rows = (
            self.spark.read.format("delta")
            .load(inp.progress)
            .filter(F.col("batch_id") < batch_id)
            .groupBy("version")
            .agg(F.max("max_event_time_us").alias("m"))
            .collect()
        )
        return [(int(r["version"]), int(r["m"])) for r in rows]

    def _tag_batch(self, inp: LiveInput, batch: DataFrame, batch_id: int) -> None:
        p, spark = self.pipeline, batch.sparkSession
        batch = batch.persist()
        try:
            valid, invalid = split_invalid(batch, p)
            in_batch = lateness.version_maxima(valid, p.event_time)
            merged: dict[int, int] = {}
            for version, max_us in [*self._prior_maxima(inp, batch_id), *in_batch]:
                merged[version] = max(max_us, merged.get(version, max_us))
            marks, _ = lateness.version_watermarks(sorted(merged.items()), inp.base_max_us, p.delay_us)
            on_time, late = lateness.split_late(spark, valid, marks, p.event_time)
            user_cols = [c for c in batch.columns if not c.startswith("_")]
            accepted = on_time.select(
                *user_cols,
                F.col(lateness.VERSION).cast("long"),
                F.col(lateness.WATERMARK_US).cast("long"),
                F.lit(batch_id).cast("long").alias(BATCH_ID),
            )
            tables.append_once(accepted, inp.live_input, self._app_id(inp.suffix("input")), batch_id)
            q_rows = quarantine.invalid_and_late(
                invalid, late, pipeline=p.name, phase="live", event_time=p.event_time, batch_id=batch_id
            )
            if inp.label:
                q_rows = q_rows.withColumn("reason", F.concat(F.lit(quarantine.RIGHT_INPUT_REASON), F.col("reason")))
            tables.append_once(q_rows, p.locations.quarantine, self._app_id(inp.suffix("quarantine")), batch_id)
            progress = spark.createDataFrame([(batch_id, v, m) for v, m in in_batch], PROGRESS_SCHEMA)
            tables.append_once(progress, inp.progress, self._app_id(inp.suffix("progress")), batch_id)
        finally:
            batch.unpersist()

    # --- aggregate -------------------------------------------------------------------------------
    def _operator_reader(self, live_input: str) -> DataFrame:
        """The operator's stream of a tagged input, in about ``operator_batches`` micro-batches if set."""
        reader = self.spark.readStream.format("delta")
        if self.operator_batches:
            files = int(self.spark.sql(f"DESCRIBE DETAIL delta.`{live_input}`").collect()[0]["numFiles"])
            reader = reader.option("maxFilesPerTrigger", max(1, -(-files // self.operator_batches)))
        return reader.load(live_input)

    def _two_input_stream(self) -> DataFrame:
        spark = self.spark
        seeds = spark.readStream.format("delta").load(self.state_path)
        left, right = (self._operator_reader(inp.live_input) for inp in self.inputs)
        carriers = spark.readStream.format("delta").load(self.carriers)
        return self.two_input.live(seeds, left, right, carriers)

    def _append_co_groups(self, batch: DataFrame, batch_id: int) -> None:
        """Calls the co-group function on the windows Spark closed in this batch (not the carriers')."""
        real = batch.filter(F.col(WINDOW_START).isNotNull())
        tables.append_once(self.two_input.apply(real), self.pipeline.sink.path, self._app_id("sink"), batch_id)

    def _append_outputs(self, batch: DataFrame, batch_id: int) -> None:
        tables.append_once(batch, self.pipeline.sink.path, self._app_id("sink"), batch_id)

    # --- running ---------------------------------------------------------------------------------
    def _trigger(self, available_now: bool) -> dict:
        if available_now:
            return {"availableNow": True}
        return {"processingTime": f"{self.pipeline.checkpoint_interval.total_seconds()} seconds"}

    def start(self, *, available_now: bool = False) -> LiveStart:
        """Starts both queries and returns once the first aggregate checkpoint (the state replay) is committed.

        ``available_now`` runs each query over what is available and stops it (catch-up / tests). Holds the
        pipeline's live lease while running: a second live phase of the pipeline is refused
        (:class:`phases.leases.LeaseHeld`) and never stops this one.
        """
        if any(q is not None and q.isActive for _, q in self._queries()):
            raise PhaseStateError(f"live phase {self.run_name} of {self.pipeline.name!r} is already running")
        self.lease = leases.acquire(self.spark, self.pipeline, "live", self.holder, take_over=self.take_over)
        try:
            started = self._start_incremental(available_now) if self.incremental else self._start_queries(available_now)
        except BaseException:
            self.stop()
            raise
        if available_now:
            self._release()
        return started

    def _release(self) -> None:
        if self.lease is not None:
            leases.release(self.spark, self.lease)
            self.lease = None

    def _start_queries(self, available_now: bool) -> LiveStart:
        self._prepare_tables()
        started = time.perf_counter()
        name = f"{self.pipeline.name}_{self.run_name[:8]}".replace("-", "_")
        self.taggers = []
        for inp in self.inputs:
            tagger = (
                inp.source.read_live(inp.after_version, self.max_files_per_trigger)
                .writeStream.queryName(f"{name}_{inp.suffix('tagger')}")
                .foreachBatch(partial(self._tag_batch, inp))
                .option("checkpointLocation", f"{self.checkpoints}/{inp.suffix('tagger')}")
                .trigger(**self._trigger(available_now))
                .start()
            )
            self.taggers.append(tagger)
        if available_now:
            for tagger in self.taggers:
                tagger.awaitTermination()
                self._raise_if_failed(tagger)
        if isinstance(self.two_input, CoGroupLogic):
            stream, mode, sink = self._two_input_stream(), "append", self._append_co_groups
        else:
            stream, mode, sink = self._two_input_stream(), "append", self._append_outputs
        writer = (
            stream.writeStream.queryName(f"{name}_aggregate")
            .outputMode(mode)
            .foreachBatch(sink)
            .option("checkpointLocation", f"{self.checkpoints}/aggregate")
            .trigger(**self._trigger(available_now))
        )
        conf = self.two_input.live_query_conf if self.two_input is not None else {}
        with _session_conf(self.spark, conf):
            self.aggregate = writer.start()  # the query keeps a copy of the session's conf
        if available_now:
            self.aggregate.awaitTermination()
            self._raise_if_failed(self.aggregate)
        else:
            self.aggregate.processAllAvailable()
        return LiveStart(self.run_name, time.perf_counter() - started, time.time_ns() // 1000)

    def _take_up_schema(self) -> None:
        """Rebuilds the operator for the source's current schema and widens the state and the sink to it
        (:mod:`phases.schema_evolution`); raises SchemaChangeError when the operator cannot take it."""
        p, spark = self.pipeline, self.spark
        records = prepared_schema(spark, p, self.source.schema())
        try:
            logic = process_logic_for(spark, p, records) or logic_for(p, records)
        except DefinitionError as exc:
            raise schema_evolution.SchemaChangeError(
                f"pipeline {p.name!r}: the source's schema changed and its operator cannot take it: {exc}. "
                "To proceed: change the source back, or adapt the pipeline and run the backlog again with "
                "BacklogRunner(...).run(reset=True)"
            ) from exc
        if isinstance(logic, ProcessLogic):
            # The user's function gets the new columns; the state is JSON, the outputs its own schema.
            sources: dict[str, str] = {}
        else:
            sources = schema_evolution.buffer_sources(logic)
            changed = schema_evolution.changes(spark, self.state_path, logic.buffer_schema, sources)
            schema_evolution.check_operator(spark, logic, records, p.name, changed)
        for path, wanted, what in (
            (self.state_path, state_schema(logic), "state table"),
            (p.sink.path, logic.output_schema, "sink"),
        ):
            if tables.exists(spark, path):
                schema_evolution.take_up(spark, path, wanted, what, p.name, sources)
        self.logic = logic
        self.incremental.use(logic)

    def _query_name(self) -> str:
        return f"{self.pipeline.name}_{self.run_name[:8]}".replace("-", "_")

    def _resume_after_schema_change(self) -> bool:
        """Restarts the live query (from its checkpoint) when Delta's source stopped it on a schema change;
        True when it did."""
        q = self.incremental.query if self.incremental else None
        if q is None or q.isActive or not schema_evolution.is_schema_change_stop(q.exception()):
            return False
        self._take_up_schema()
        self.incremental.start(self._trigger(False), self._query_name())
        return True

    def _start_incremental(self, available_now: bool) -> LiveStart:
        started = time.perf_counter()
        self._take_up_schema()
        name = self._query_name()
        if available_now:
            # Delta's source stops a query at a schema change; a new query takes the new schema up.
            for _ in range(3):
                q = self.incremental.start(self._trigger(True), name)
                try:
                    q.awaitTermination()  # raises the query's error when it failed
                except StreamingQueryException:
                    if not schema_evolution.is_schema_change_stop(q.exception()):
                        raise
                    self._take_up_schema()
                    continue
                break
            self._raise_if_failed(q)
            return LiveStart(self.run_name, time.perf_counter() - started, time.time_ns() // 1000)
        self.incremental.start(self._trigger(False), name)
        self.process_available()
        return LiveStart(self.run_name, time.perf_counter() - started, time.time_ns() // 1000)

    def process_available(self) -> None:
        """Blocks until every source version available now is tagged, aggregated and in the sink."""
        if self.incremental is not None:
            if self.incremental.query is None:
                raise PhaseStateError("the live phase is not running; call start() first")
            for _ in range(3):
                try:
                    self.incremental.query.processAllAvailable()
                    return
                except StreamingQueryException:
                    if not self._resume_after_schema_change():
                        raise
            self.incremental.query.processAllAvailable()
            return
        if not self.taggers or self.aggregate is None:
            raise PhaseStateError("the live phase is not running; call start() first")
        for tagger in self.taggers:
            tagger.processAllAvailable()
        self.aggregate.processAllAvailable()

    def _queries(self) -> list[tuple[str, StreamingQuery | None]]:
        if self.incremental is not None:
            return [("live", self.incremental.query)]
        named = [(inp.suffix("tagger"), q) for inp, q in zip(self.inputs, self.taggers, strict=False)]
        return [*(named or [("tagger", None)]), ("aggregate", self.aggregate)]

    def stop(self) -> None:
        """Stops the queries and releases the live lease."""
        try:
            for _, q in self._queries():
                if q is not None and q.isActive:
                    q.stop()
        finally:
            self._release()

    def raise_if_failed(self) -> None:
        """Raises PhaseStateError when a started query has stopped (with the query's own error). A live query
        that Delta's source stopped on a schema change is resumed instead, taking the change up."""
        self._resume_after_schema_change()
        for label, q in self._queries():
            if q is not None and not q.isActive:
                exc = q.exception()
                raise PhaseStateError(
                    f"the live phase's {label} query of {self.pipeline.name!r} stopped"
                    + (f": {exc}" if exc is not None else " without an error (stopped from outside)")
                )

    @staticmethod
    def _raise_if_failed(q: StreamingQuery) -> None:
        exc = q.exception()
        if exc is not None:
            raise exc

    def status(self) -> dict:
        """Batch ids, input rates and the current watermark, for progress reports."""
        if self.incremental is not None:
            # One query does what the tagger and the aggregate did: both report it.
            one = self.incremental.status()
            return {"run": self.run_name, "tagger": one, "aggregate": one}
        out: dict = {"run": self.run_name}
        for label, q in self._queries():
            prog = q.lastProgress if q is not None else None
            out[label] = {
                "active": bool(q and q.isActive),
                "batch_id": prog.get("batchId") if prog else None,
                "input_rows_per_second": prog.get("inputRowsPerSecond") if prog else None,
                "processed_rows_per_second": prog.get("processedRowsPerSecond") if prog else None,
                "watermark": (prog.get("eventTime") or {}).get("watermark") if prog else None,
                "source_version": _end_version(prog) if prog else None,
            }
        return out


def _end_version(progress: dict) -> int | None:
    """The last source version a query has fully read, from its progress report's Delta end offset
    (``reservoirVersion`` is the next version to read; ``index`` -1 means none of it yet)."""
    for src in progress.get("sources") or []:
        match = re.search(r'"reservoirVersion"\s*:\s*(\d+)', str(src.get("endOffset")))
        if match:
            return int(match.group(1)) - 1
    return None
