"""The live phase as a continuous increment: one streaming query per live input, no staging table.

Used for every operator kind: this module is the driver (versions, lateness, quarantine, progress); the
operator's own step comes from its kind (:mod:`phases._internal.operators`). The query reads the source's change feed
after the handoff version (a two-input operator's both sources, in one query); each micro-batch runs, in
``foreachBatch``, the same steps a catch-up increment runs over a version range
(:func:`phases._internal.tagging.tag_changes`, the operator's lift and merge):

1. **complete versions only**: the batch's end offset (Spark's offset log, written before the batch runs)
   says whether its last source version is complete. A version split across micro-batches (file limits, a
   restart with many versions pending) is *held back* in a small ``pending`` table and applied whole with
   the batch that completes it. So the version watermark W(v) and the closing of windows and sessions see
   exactly what one streaming job over one version per micro-batch sees, for any split and any merge of
   versions into micro-batches;
2. validation and lateness by W(v), continuing from the progress of the previous batch; invalid and late
   records to the quarantine (only when there are any);
3. the operator's step (its kind's): every kind advances its state in the run's state store
   (:mod:`phases._internal.state.keyed_store`) by one version; version 1 is the backlog's handed-over state, so the
   switch replays nothing;
4. the sink: changed keys upserted or appended as a changelog (keyed aggregation), the windows/sessions the
   watermark closed appended (removed from the state in the same store commit), or the process function's and
   the joins' output rows appended;
5. last, one progress record (running maximum event time, closed watermark, held version): a file in the
   run's progress log (:mod:`phases._internal.coordination.progress_log`), not a Delta commit.

Every write is idempotent per micro-batch (the sink's and the pending tables' commits carry the run and batch
id, the quarantine's Delta ``txnAppId``/``txnVersion``; a state store version is loaded by the number the previous
progress record names), and everything the sink gets is computed from the state the batch started from, so a
micro-batch replayed after a crash at any point writes exactly what the first attempt would have. Spark's own
watermark is not used: there is no stateful Spark operator in the query.

At the switch the live phase writes its first progress record (batch -1: the handoff's version, maximum
event time and final watermark) before the query starts: its immediate checkpoint. Nothing is replayed.
"""

from __future__ import annotations

import logging
import threading
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from phases._internal import spark_internals
from phases._internal.coordination.progress_log import ProgressLog
from phases._internal.deployment import generations
from phases._internal.errors import PhasesError, PhaseStateError, ProgressRecordDamaged
from phases._internal.handoff import manifest
from phases._internal.lateness import VERSION, watermark_after
from phases._internal.live import resume as live_resume
from phases._internal.live import start_checks
from phases._internal.live.plan import InputProgress, LiveInput, LivePlan, Progress
from phases._internal.storage import changelog, fs, live_writes, maintenance, quarantine, tables
from phases._internal.tagging import tag_changes
from phases._internal.topics.sink import TopicSink, topic_sink

log = logging.getLogger(__name__)

HELD_BY = "_held_by"  # pending rows: the micro-batch that held them back
# A micro-batch keeps the rows it held back in the driver for the next one up to this many; more are read back from
# the pending table.
HELD_ROWS_KEPT = 50_000
_INPUT = "_input"  # two-input query: the input a row comes from ("" or "right")
_ROW_COLUMNS = ("_row", "_row_right")  # two-input query: each input's row, packed


def _row_column(inp) -> str:
    return inp.suffix("_row")


# --- the driver ----------------------------------------------------------------------------------------


class IncrementalLive:
    """One live run (``run_name``) of a pipeline: its query, progress and pending tables."""

    def __init__(self, spark: SparkSession, plan: LivePlan):
        self.spark, self.plan = spark, plan
        self.placement, self.kind, self.inputs = plan.placement, plan.kind, plan.inputs
        self.pipeline = plan.pipeline  # the definition, as declared
        self.run_name, self.state_path, self.checkpoints = plan.paths.run_name, plan.paths.state, plan.paths.checkpoints
        self.start_progress, self.max_files_per_trigger = plan.start, plan.max_files_per_trigger
        self.progress_log = ProgressLog(spark, plan.paths.progress_log)
        self.step = self.kind.live_step(plan.logic, self.state_path, plan.paths.sink, plan.paths.state_store)
        self.query: StreamingQuery | None = None
        # The engine error a micro-batch raised (Spark reports it wrapped in its own; the runner re-raises this).
        self.failure: PhasesError | None = None
        self._progress: dict[int, Progress] = {}
        self._table_ids: dict[str, str] = {}
        self._meta: dict[str, list[str]] = {}  # two-input query: each input's own change columns
        # The rows each input's last micro-batch held back, as it wrote them to the pending table, kept in the driver
        # (input label -> (batch id, local rows)): the next micro-batch of the query reads them there, not from the
        # table (a Delta read is planned with a scan of the table's files: two Spark jobs). A start reads the table.
        self._held_rows: dict[str, tuple[int, DataFrame]] = {}
        # The query generation (phases._internal.live.resume): its micro-batch N is the progress log's batch base + N.
        self.base = 0
        self.query_folder = live_resume.generation_folder(self.checkpoints, 0)
        self._resumed_from = plan.start
        self._resumed_id = -1  # the batch id of the record the query generation starts after (prepare)
        # Set once a micro-batch's progress record is written: what a stop at a micro-batch boundary waits for.
        self.batch_recorded = threading.Event()
        self.first_batch_at_us: int | None = None  # when the query's first micro-batch recorded its progress
        # The redeploy log as the start read it (which generation serves; the swaps it records), set by the runner.
        self.generations = generations.Generations()
        # A topic sink's writer (phases._internal.topics.sink), started by prepare for the placement's generation.
        self.topic: TopicSink | None = None

    @property
    def logic(self):
        return self.plan.logic

    def use(self, logic) -> None:
        """Runs the next micro-batches with ``logic`` (rebuilt after a source schema change)."""
        self.plan.logic = logic
        self.step = self.kind.live_step(logic, self.state_path, self.plan.paths.sink, self.plan.paths.state_store)

    # --- tables ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Creates the sink, quarantine and state if missing; picks the query generation that resumes exactly
        (:mod:`phases._internal.live.resume`) and writes the switch's progress record when the log has none."""
        spark, p = self.spark, self.pipeline
        fs.sweep_orphan_checksums(*self._write_targets().values())
        writes = self._recorded_writes()
        # Before the start writes anything: the tables against the handoff, where no live write is recorded yet.
        start_checks.refuse_missing_tables(spark, self.placement, self.plan.handoff, writes, self._write_targets())
        start_checks.refuse_sink_not_as_handed_off(
            spark, self.placement, self.plan.handoff, self.run_name, writes, self.generations
        )
        quarantine.ensure(spark, self.placement.quarantine)
        changelog.ensure_sink(spark, self.placement, self.logic.output_schema)
        self._open_topic()
        tables.ensure(spark, self.state_path, self.kind.state_schema(self.logic))
        if p.maintenance.auto_compact and p.sink.mode != "changelog":  # a changelog's is the compactor's work
            maintenance.enable_auto_compaction(spark, self.placement.sink_path)
        # The switch's record: the live phase's immediate checkpoint.
        resume = live_resume.plan(
            spark,
            self.progress_log,
            self.checkpoints,
            self.start_progress.record(),
            self._applied_writes,
            self._way_out(),
        )
        if resume.write_record:
            self.progress_log.write(resume.latest_id, resume.record)
        self.base, self.query_folder = resume.base, resume.folder
        self._resumed_from = Progress.from_record(resume.record)
        self._resumed_id = resume.latest_id
        self._progress = {}
        self._held_rows = {}
        start_checks.refuse_tables_behind_the_log(
            self.spark,
            self.pipeline.name,
            self.run_name,
            self._resumed_from,
            resume.latest_id,
            self._write_targets(),
            (self.checkpoints, self.progress_log.root),
        )

    def _open_topic(self) -> None:
        """A topic sink: its writer for the placement's generation (fencing any older writer of it), and the
        handoff's results published unless they are out already (the backlog stopped before it published them)."""
        if self.topic is not None:
            self.topic.close()
        self.topic = topic_sink(self.placement)
        if self.topic is not None:
            handoff = self.plan.handoff
            self.topic.check()
            if handoff is not None:  # one streaming job (no handoff) publishes its micro-batches only
                recorded = self._recorded_writes()
                self.topic.refuse_lost_writes(
                    handoff.manifest_id, max(recorded.get("sink", -1), recorded.get("upsert", -1))
                )
                self.topic.publish_handoff(
                    self.spark,
                    handoff.manifest_id,
                    self.placement.sink_path,
                    handoff.sink_version,
                    bases=lambda: manifest.base_sink_versions(self.spark, self.placement.manifests, handoff),
                )

    def close_topic(self) -> None:
        """Closes the topic sink's writer (the live phase stopped)."""
        if self.topic is not None:
            self.topic.close()
            self.topic = None

    def _recorded_writes(self) -> dict[str, int]:
        """The writes the newest whole progress record names (empty: none yet, or no whole record; the resume plan
        deals with damaged records)."""
        for batch_id in reversed(self.progress_log.batch_ids()):
            try:
                record = self.progress_log.read(batch_id)
            except (ProgressRecordDamaged, ValueError):
                continue
            if record is not None:
                return record.get("writes") or {}
        return {}

    def _write_targets(self) -> dict[str, str]:
        """The table each of the run's writes goes to (``what`` -> path)."""
        targets = {"sink": self.placement.sink_path, "upsert": self.placement.sink_path}
        for inp in self.inputs:
            targets[inp.suffix("quarantine")] = self.placement.quarantine
            targets[inp.suffix("pending")] = self._pending_path(inp)
        return targets

    def _way_out(self) -> str:
        return live_resume.way_out(self.pipeline.name, self.checkpoints, self.progress_log.root)

    def _applied_writes(self) -> dict[str, int]:
        """The newest micro-batch (progress-log batch id) each of the run's tables recorded a write of."""
        paths = [self.state_path, self.placement.sink_path, self.placement.quarantine]
        paths += [self._pending_path(inp) for inp in self.inputs]
        newest: dict[str, int] = {}
        for path in dict.fromkeys(paths):
            found = live_writes.live_writes(self.spark, path, self.pipeline.name, self.run_name)
            if found is not None:
                newest[path] = found
        return newest

    def _writes(self, spark: SparkSession, batch_id: int) -> live_writes.BatchWrites:
        """Batch ``batch_id``'s writes: the query's first micro-batch after a start may be a replay (its predecessor's
        record is the newest one the start found), every later one writes after its predecessor's record."""
        first = batch_id == self._resumed_id + 1
        publish = None  # pyright: ignore[reportAssignmentType]
        if self.topic is not None:
            topic, run, after_handoff = self.topic, self.run_name, self.plan.handoff is not None

            def publish(rows: DataFrame, batch: int, replay_possible: bool) -> None:
                topic.publish(rows, batch, run, replay_possible=replay_possible, after_handoff=after_handoff)

        return live_writes.BatchWrites(spark, self.pipeline.name, self.run_name, batch_id, first=first, publish=publish)

    def _pending_path(self, inp: LiveInput) -> str:
        return self.plan.paths.pending(inp)

    def _progress_after(self, batch_id: int) -> Progress:
        """The progress recorded by micro-batch ``batch_id`` (-1: the switch's). A new query generation's first
        micro-batch reads a version the record held in part again whole."""
        if batch_id in self._progress:
            return self._progress[batch_id]
        if batch_id == self.base - 1 and self.base > 0:
            return self._resumed_from.without_held()
        record = self.progress_log.read(batch_id)
        if record is None:
            latest = self.progress_log.latest()
            raise PhaseStateError(
                f"live run {self.run_name} of {self.pipeline.name!r}: micro-batch {batch_id + 1} needs the progress "
                f"of micro-batch {batch_id}, but the progress log {self.progress_log.root} ends at "
                f"{latest[0] if latest else None}; the checkpoint {self.checkpoints} and the progress log no "
                "longer belong together"
            )
        return Progress.from_record(record)

    def latest_progress(self) -> Progress:
        if self._progress:
            return self._progress[max(self._progress)]
        latest = self.progress_log.latest()
        return Progress.from_record(latest[1]) if latest is not None else self.start_progress

    def _kafka_offsets(self, batch_id: int) -> dict[str, dict[str, int]]:
        """Each Kafka input's end offsets after ``batch_id`` (Spark's offset log), by input label; empty when every
        input is a Delta table."""
        chunked = [inp for inp in self.inputs if inp.source.arrival == "chunks"]
        if not chunked:
            return {}
        entry = spark_internals.read_offset_log(self.spark, self.query_folder, batch_id)
        out = {}
        for inp in chunked:
            offsets = entry.kafka_offsets(inp.source.topic)  # pyright: ignore[reportAttributeAccessIssue]
            if offsets is None:
                raise PhaseStateError(f"no offsets of kafka topic {inp.source.topic!r} in {entry.path}")  # pyright: ignore[reportAttributeAccessIssue]
            out[inp.label] = {str(p): o for p, o in sorted(offsets.items())}
        return out

    def _end_offsets(self, batch_id: int) -> dict[str, tuple[int, bool]]:
        """Per input: (first version not fully read, whether that version was read in part) after
        ``batch_id``; an input the query has not read yet is missing.

        From Spark's offset log, written before the batch runs (one offset per source, told apart by the Delta
        table id): (reservoirVersion, index); index -1 means every version below reservoirVersion is read,
        index >= 0 that reservoirVersion is read up to that file only (an input read in whole versions: to its
        last file)."""
        entry = spark_internals.read_offset_log(self.spark, self.query_folder, batch_id)
        by_id = {table_id: label for label, table_id in self._table_ids.items()}
        out: dict[str, tuple[int, bool]] = {}
        for offset in entry.delta_offsets():
            label = by_id.get(offset.table_id, "" if len(self.inputs) == 1 else None)
            if label is None:
                raise PhaseStateError(f"{entry.path}: a Delta source offset of an unknown table: {offset}")
            source = next(inp.source for inp in self.inputs if inp.label == label)
            if offset.index >= 0 and getattr(source, "whole_versions", False):  # read to its last file: complete
                out[label] = (offset.reservoir_version + 1, False)
            else:
                out[label] = (offset.reservoir_version, offset.index >= 0)
        if not out and len(self.inputs) == 1:
            raise PhaseStateError(f"no Delta source offset in {entry.path}: {entry.sources!r}")
        return out

    # --- one micro-batch -----------------------------------------------------------------------------
    def _held(self, spark: SparkSession, inp: LiveInput, batch_id: int) -> DataFrame:
        """The rows of ``inp`` that micro-batch ``batch_id`` held back: those the query's previous micro-batch kept
        when it was that one, else the pending table's."""
        kept = self._held_rows.get(inp.label)
        if kept is not None and kept[0] == batch_id:
            return kept[1]
        held = spark.read.format("delta").load(self._pending_path(inp))
        return held.filter(F.col(HELD_BY) == batch_id).drop(HELD_BY)

    def _rows_of(self, batch: DataFrame, inp: LiveInput) -> DataFrame:
        """The change rows of one input in the query's micro-batch (two inputs: unpacked from the union)."""
        if len(self.inputs) == 1:
            return batch
        meta = self._meta.get(inp.label) or [
            c for c in batch.columns if c.startswith("_") and c not in (_INPUT, *_ROW_COLUMNS)
        ]
        return batch.filter(F.col(_INPUT) == inp.label).select(f"{_row_column(inp)}.*", *meta)

    def _tag_input(
        self,
        inp: LiveInput,
        batch: DataFrame,
        writes: live_writes.BatchWrites,
        before: InputProgress,
        ends,
        kept: dict[str, tuple[int, DataFrame]],
    ) -> tuple[DataFrame | None, InputProgress, DataFrame]:
        """Holds back a version read in part (and keeps those rows in ``kept`` for the next micro-batch), tags the
        complete ones, quarantines; returns (on-time records or None, the input's progress after the batch, the
        persisted rows to unpersist)."""
        spark, batch_id = writes.spark, writes.batch
        rows = self._rows_of(batch, inp)
        if inp.source.arrival == "chunks":
            # One micro-batch = one arrival chunk: the number after the previous batch's (the same on a replay).
            rows = rows.withColumn(VERSION, F.lit(before.complete_below).cast("long"))
            ends = {**ends, inp.label: (before.complete_below + 1, False)}
        if before.held_version is not None:
            rows = self._held(spark, inp, batch_id - 1).unionByName(rows, allowMissingColumns=True)
        rows = rows.persist()
        check_batch = getattr(inp.source, "check_batch", None)
        if check_batch is not None:  # a topic's Avro values of a schema version newer than the query's: restart
            check_batch(rows)
        end_version, partial_tail = ends.get(inp.label, (before.complete_below, False))
        check_versions = getattr(inp.source, "check_versions", None)
        if check_versions is not None:  # another pipeline's results: a rewrite of them stops the live phase
            check_versions(before.complete_below, end_version)
        held_version = None
        if partial_tail:  # the tail of version end_version waits for the batch that completes it
            held_version = end_version
            held = rows.filter(F.col(VERSION) >= end_version)
            pending = held.withColumn(HELD_BY, F.lit(batch_id).cast("long"))
            writes.append_owned(pending, self._pending_path(inp), inp.suffix("pending"), merge_schema=True)
            local = spark_internals.local_copy(held, HELD_ROWS_KEPT)  # the rows written: ``rows`` is persisted
            if local is not None:
                kept[inp.label] = (batch_id, local)
        complete = rows.filter(F.col(VERSION) < end_version)
        tagged = tag_changes(spark, self.placement, complete, before.running_max_us, phase="live", batch_id=batch_id)
        if tagged.has_quarantine:
            q_rows = tagged.quarantine
            if inp.label:
                q_rows = quarantine.of_input(q_rows, inp.label)
            writes.append_once(q_rows, self.placement.quarantine, inp.suffix("quarantine"))
        after = InputProgress(max(end_version, before.complete_below), tagged.running_max_us, held_version)
        return (tagged.prepared if tagged.has_on_time else None), after, rows

    def apply_batch(self, batch: DataFrame, query_batch_id: int) -> None:
        """Micro-batch ``query_batch_id`` of the query: the progress log's batch ``base + query_batch_id``, the id
        its writes carry."""
        try:
            self._apply_batch(batch, query_batch_id)
        except PhasesError as exc:
            self.failure = exc
            raise

    def _apply_batch(self, batch: DataFrame, query_batch_id: int) -> None:
        spark, p = batch.sparkSession, self.pipeline
        batch_id = self.base + query_batch_id
        if batch_id <= self._resumed_id:
            self._recorded_already(batch_id)
            return
        before = self._progress_after(batch_id - 1)
        kafka_offsets = self._kafka_offsets(query_batch_id)
        ends = self._end_offsets(query_batch_id) if len(kafka_offsets) < len(self.inputs) else {}
        writes = self._writes(spark, batch_id)
        records: dict[str, DataFrame | None] = {}
        after: dict[str, InputProgress] = {}
        persisted: list[DataFrame] = []
        kept: dict[str, tuple[int, DataFrame]] = {}
        try:
            for inp in self.inputs:
                records[inp.label], after[inp.label], rows = self._tag_input(
                    inp, batch, writes, before.of(inp.label), ends, kept
                )
                persisted.append(rows)
            watermarks = {label: watermark_after(a.running_max_us, p.delay_us) for label, a in after.items()}
            closing = self.kind.closing(watermarks)
            state = before.state
            if any(r is not None for r in records.values()) or closing != before.closed_us:
                state = self.step.apply_inputs(spark, records, watermarks, closing, writes, state=state)
            progress = Progress.of_inputs(
                batch_id,
                after,
                closing if closing is not None else before.closed_us,
                _now_us(),
                kafka_offsets,
                query_base=self.base,
                state=state,
                writes={**(before.writes or {}), **dict.fromkeys(writes.committed, batch_id)},
            )
            self.progress_log.write(batch_id, progress.record())
            self._progress = {batch_id: progress}
            self._held_rows = kept  # a batch that fails keeps none: its replay reads the table
            self.batch_recorded.set()
            if self.first_batch_at_us is None:
                self.first_batch_at_us = _now_us()
        finally:
            for rows in persisted:
                rows.unpersist()

    def _recorded_already(self, batch_id: int) -> None:
        """Spark runs again a micro-batch whose progress record is written: the process died after the record and
        before Spark's commit log recorded the batch. The record is the truth (every write of the batch is made
        before it): nothing is applied again, and the next micro-batch goes on from the state the record names. (Run
        again, the batch would have read what Spark gives it this time, kept the record on disk as it was and the
        new progress in memory, and the next micro-batch would have started from that.)"""
        record = self.progress_log.read(batch_id)
        if record is None:  # the start found it (prepare); only a log changed under a running query loses it
            raise PhaseStateError(
                f"live run {self.run_name} of {self.pipeline.name!r}: Spark runs micro-batch {batch_id} again, whose "
                f"progress record the start found, but the progress log {self.progress_log.root} no longer holds it"
            )
        log.warning(
            "live run %s: micro-batch %d is recorded in the progress log already (the run stopped before Spark's "
            "commit log recorded it); not applied again",
            self.run_name,
            batch_id,
        )
        self._progress = {batch_id: Progress.from_record(record)}
        self._held_rows = {}  # the next micro-batch reads what this one held from the pending table
        self.batch_recorded.set()

    # --- running -------------------------------------------------------------------------------------
    def _stream(self) -> DataFrame:
        """The query's input: the one source's change feed, or the inputs' change feeds in one union, each
        input's row packed in its own struct column (their schemas differ) next to the change columns."""
        streams = [self._read_live(inp) for inp in self.inputs]
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
            self._meta[inp.label] = meta
        # A Delta input's change columns and a Kafka input's positions differ: each row gets nulls for the other's.
        return packed[0].unionByName(packed[1], allowMissingColumns=True)

    def _read_live(self, inp: LiveInput) -> DataFrame:
        """The input's stream from the positions of the record the query generation starts after (Spark ignores
        them once its checkpoint has offsets): Delta versions after the last complete one, Kafka offsets."""
        start = self._resumed_from.of(inp.label)
        after_version = start.complete_below - 1 if start.complete_below > 0 else None
        offsets = self._resumed_from.offsets_of(inp.label)
        if inp.source.arrival == "chunks" and offsets is not None:
            return inp.source.read_live(after_version, self.max_files_per_trigger, start_offsets=offsets)  # pyright: ignore[reportCallIssue]
        return inp.source.read_live(after_version, self.max_files_per_trigger)

    def start(self, trigger: dict, name: str) -> StreamingQuery:
        self.failure = None
        self.first_batch_at_us = None
        self.prepare()
        self._table_ids = {inp.label: inp.source.table_id() for inp in self.inputs}
        self.query = (
            self._stream()
            .writeStream.queryName(name)
            .foreachBatch(self.apply_batch)
            .option("checkpointLocation", self.query_folder)
            .trigger(**trigger)
            .start()
        )
        return self.query


def _now_us() -> int:
    return time.time_ns() // 1000
