"""The live phase: Structured Streaming over the source's versions after the handoff's V.

Every operator kind runs as a continuous increment (:mod:`phases._internal.live.micro_batch`): one streaming query over
the live inputs (a two-input operator reads both sources in that one query), no staging table, the keyed state
in the run's state store (:mod:`phases._internal.state.keyed_store`), exact under any split of versions into
micro-batches. The switch replays nothing: the backlog wrote the store's version 1 from the handoff's state, and
the live phase's immediate checkpoint is its first progress record.

``LiveRunner.streaming_only`` runs the same query from the sources' first versions with an empty state: one
streaming job over all the data, the reference the two-phase result must equal.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from phases._internal import spark_internals
from phases._internal.coordination import leases
from phases._internal.definition import SOURCE_LABEL, Pipeline
from phases._internal.definition.changes import DefinitionChanges
from phases._internal.deployment import Placement, place, require_serving
from phases._internal.deployment.kept import Kept, keep_after_start
from phases._internal.errors import (
    DefinitionError,
    LiveQueryStopped,
    ManifestError,
    PhaseStateError,
    SchemaChangeError,
    StateStoreError,
)
from phases._internal.handoff import intents, manifest
from phases._internal.lateness import watermark_after
from phases._internal.live import start_checks
from phases._internal.live.arrivals import arrival_chunks
from phases._internal.live.compactor import Compactor
from phases._internal.live.micro_batch import IncrementalLive
from phases._internal.live.plan import LivePlan, Progress
from phases._internal.live.report import LiveStart, query_status
from phases._internal.schema_changes import is_schema_change_stop, take_up
from phases._internal.sources.delta import DeltaTableSource
from phases._internal.sources.kafka import raise_if_refused
from phases._internal.sources.reader import open_source
from phases._internal.steps.end_of_stream import EndOfStreamRunner, prepared_schema
from phases._internal.storage import changelog, tables

log = logging.getLogger(__name__)

STOP_POLL_S = 1.0  # how often a running live phase looks for a request to stop (a redeploy's)
# A start that does not drain (``LiveRunner.start(drain=False)``) waits this long at most for the query's first
# micro-batch, polling this often.
FIRST_BATCH_WAIT_S = 30.0
FIRST_BATCH_POLL_S = 0.05
# How long a wait for the applied positions may run past one trigger interval before Spark's own wait takes over.
APPLIED_GRACE_S = 30.0


class LiveRunner:
    def __init__(
        self,
        spark: SparkSession,
        where: Placement,
        handoff: manifest.HandoffManifest | None,
        *,
        max_files_per_trigger: int | None = None,
        take_over: bool = False,
    ):
        """Use :meth:`from_manifest` or :meth:`streaming_only`. ``max_files_per_trigger`` splits the source
        reads into micro-batches (a version may then span several: it is applied once complete). ``take_over``
        takes the pipeline's live lease over from a holder whose process is gone. ``where``: the definition and
        where it runs, as placed once (:func:`phases._internal.deployment.place`)."""
        self.spark = spark
        self.take_over = take_over
        self.lease: leases.Lease | None = None
        self.placement = where
        self.pipeline = where.definition
        self.handoff = handoff
        self.plan = LivePlan.of(spark, where, handoff, max_files_per_trigger=max_files_per_trigger)
        self.holder = f"live run {self.run_name} ({uuid.uuid4().hex[:8]})"
        self.incremental = IncrementalLive(spark, self.plan)
        self.compactor: Compactor | None = None
        self.kept: Kept | None = None  # the copy of the previous generation's results this start made (None: none)
        # Why the running query was stopped on request (a redeploy's swap,
        # :func:`phases._internal.coordination.leases.request_stop`); None while it runs or when it stopped otherwise.
        self.stopped_for: str | None = None
        self._watcher: threading.Event | None = None

    # What the plan holds, by the names the runner's callers use.
    @property
    def run_name(self) -> str:
        return self.plan.paths.run_name

    @property
    def state_path(self) -> str:
        return self.plan.paths.state

    @property
    def checkpoints(self) -> str:
        return self.plan.paths.checkpoints

    @property
    def kind(self):
        return self.plan.kind

    @property
    def logic(self):
        return self.plan.logic

    @property
    def source(self):
        """The reader of the pipeline's own source."""
        return self.plan.source

    @classmethod
    def from_manifest(
        cls, spark: SparkSession, pipeline: Pipeline, manifest_id: str | None = None, **kwargs
    ) -> LiveRunner:
        """The live phase of the newest handoff (which must be ``manifest_id`` when given); refuses a
        missing, partial, superseded or mismatched manifest. The definition runs as declared, as the generation that
        serves it (placed once: :func:`phases._internal.deployment.place`); a pipeline placed elsewhere: :meth:`at`."""
        return cls.at(spark, place(spark, pipeline), manifest_id, **kwargs)

    @classmethod
    def at(cls, spark: SparkSession, where: Placement, manifest_id: str | None = None, **kwargs) -> LiveRunner:
        """:meth:`from_manifest` of ``where.definition`` where ``where`` places it."""
        handoff = manifest.latest(spark, where.manifests, where.name, manifest_id)
        try:
            manifest.check_matches(spark, handoff, where, where.redeploys.amended)
        except ManifestError as exc:
            if DefinitionChanges.between(handoff.state_spec, where.definition.state_spec()).way == "forward":
                raise  # its way out is a redeploy that records the change (no generation, no rollback)
            raise start_checks.after_a_swap(spark, where, exc) from exc
        EndOfStreamRunner(spark, where).require_finished(handoff.source_version, handoff.fingerprint)
        intents.refuse_open(spark, where, handoff.manifest_id)
        return cls(spark, where, handoff, **kwargs)

    @classmethod
    def streaming_only(cls, spark: SparkSession, pipeline: Pipeline, **kwargs) -> LiveRunner:
        """One streaming job over all versions from the first, with empty initial state: the definition writes
        where it is declared (generation 0's tables; no redeploy log is read)."""
        return cls.streaming_only_at(spark, Placement(pipeline), **kwargs)

    @classmethod
    def streaming_only_at(cls, spark: SparkSession, where: Placement, **kwargs) -> LiveRunner:
        """:meth:`streaming_only` of ``where.definition`` where ``where`` places it (as placed: no redeploy log is
        read)."""
        for spec in (i.spec for i in where.definition.inputs):
            if spec.kind == "kafka":  # a topic is read from its earliest offsets
                continue
            if spec.starting_version > 0:  # pyright: ignore[reportAttributeAccessIssue]
                raise PhaseStateError(
                    f"pipeline {where.name!r}: source {where.location(spec)} reads versions "
                    f"0..{spec.starting_version - 1} as one snapshot (starting_version), which a streaming job over "  # pyright: ignore[reportAttributeAccessIssue]
                    "its change feed cannot; start the live phase from a handoff"
                )
            source = open_source(spark, spec, where)
            source.require_change_feed(source.head_version())
        return cls(spark, where, None, **kwargs)

    # --- running ---------------------------------------------------------------------------------
    def _trigger(self, available_now: bool) -> dict:
        if available_now:
            return {"availableNow": True}
        return {"processingTime": f"{self.pipeline.checkpoint_interval.total_seconds()} seconds"}

    def start(
        self, *, available_now: bool = False, drain: bool = True, first_batch_wait_s: float = FIRST_BATCH_WAIT_S
    ) -> LiveStart:
        """Starts the live query and returns once everything available now is applied.

        ``available_now`` runs the query over what is available and stops it (catch-up / tests). ``drain=False``
        returns sooner, once the query's first micro-batch has recorded its progress (when anything waited at the
        start; at most ``first_batch_wait_s``), and leaves the rest of what waits to the running query: a caller that
        reports progress (the Dagster live step) reports from then on instead of after a drain, which under steady
        arrivals lasts as long as the arrivals outpace the micro-batches. Holds the pipeline's live lease while
        running: a second live phase of the pipeline is refused (:class:`phases._internal.errors.LeaseHeld`) and never
        stops this one.
        """
        q = self.incremental.query
        if q is not None and q.isActive:
            raise PhaseStateError(f"live phase {self.run_name} of {self.pipeline.name!r} is already running")
        self.lease = leases.acquire(self.spark, self.placement, "live", self.holder, take_over=self.take_over)
        try:
            if self.handoff is not None:
                # Checked now, holding the live lease (a swap away from this generation takes it first), not when
                # the runner was built: a runner built before a swap would mix both definitions in the sink.
                self.incremental.generations = require_serving(self.spark, self.placement)
            started = self._start(available_now, drain, first_batch_wait_s)
        except BaseException:
            self.stop()
            raise
        self._keep_previous_results()
        if available_now:
            self.incremental.close_topic()  # the query ran what was available and ended
            self._release()
            return started
        if self.pipeline.sink.mode == "changelog" and self.pipeline.sink.compact_every.total_seconds() > 0:
            self.compactor = Compactor(self.spark, self.placement).start()
        self._watch_for_stop_requests()
        return started

    def _keep_previous_results(self) -> None:
        """After a swap, once this generation serves and its first micro-batch is recorded: the copy kept for a
        rollback (:mod:`phases._internal.deployment.kept`), outside the time without fresh results."""
        if self.handoff is not None and self.placement.serving:
            self.kept = keep_after_start(self.spark, self.placement, self.holder, self.incremental.generations)

    def _watch_for_stop_requests(self) -> None:
        """Polls for a request to stop this live phase (:func:`phases._internal.coordination.leases.request_stop`, made
        after the query started) and stops it at a micro-batch boundary: the query is stopped while no trigger is
        active, then the run's lease is released, as :meth:`stop` does."""
        done = threading.Event()
        self._watcher = done
        since_us = time.time_ns() // 1000

        def watch() -> None:
            while not done.wait(STOP_POLL_S):
                try:
                    request = leases.stop_request(self.spark, self.placement, "live")
                except Exception:  # noqa: BLE001 - the session is stopping; the next poll or the caller decides
                    continue
                if request is None or request.at_us < since_us:
                    continue
                log.info(
                    "live phase %s: stopping, as %s asked: %s", self.run_name, request.requested_by, request.reason
                )
                # Recorded before the query stops: a caller polling the query then sees a requested stop, never a
                # query that "stopped from outside".
                self.stopped_for = f"stopped on request of {request.requested_by}: {request.reason}"
                self._stop_between_batches()
                self.stop()
                return

        threading.Thread(target=watch, name=f"phases-stop-watch-{self.run_name[:8]}", daemon=True).start()

    def _stop_between_batches(self, wait_s: float = 60.0) -> None:
        """Stops the query at a micro-batch boundary: at once when no trigger runs, else as soon as the running
        micro-batch has written its progress record (at most ``wait_s``; a batch stopped half-way is replayed by the
        next start, as after a crash)."""
        q = self.incremental.query
        recorded = self.incremental.batch_recorded
        recorded.clear()
        deadline = time.monotonic() + wait_s
        while q is not None and q.isActive and time.monotonic() < deadline:
            if recorded.is_set() or not q.status.get("isTriggerActive"):
                break
            time.sleep(0.02)
        if q is not None and q.isActive:
            q.stop()

    def _release(self) -> None:
        if self.lease is not None:
            leases.release(self.spark, self.lease)
            self.lease = None

    def _take_up_schema(self) -> None:
        """Rebuilds the operator for the sources' current schemas and widens the state and the sink to it
        (:mod:`phases._internal.schema_changes`); raises SchemaChangeError when the operator cannot take it."""
        p, spark = self.pipeline, self.spark
        try:
            logic = self.plan.build_logic(spark)
        except DefinitionError as exc:
            raise SchemaChangeError(
                f"pipeline {p.name!r}: the source's schema changed and its operator cannot take it: {exc}. "
                "To proceed: change the source back, or adapt the pipeline and run the backlog again with "
                "BacklogRunner(...).run(reset=True)"
            ) from exc
        # Aggregations check their buffers against the change; process functions get the new columns (their
        # state is JSON); two-input operators keep rows as they are, their state and sink columns widen like
        # the source's.
        records = prepared_schema(spark, self.placement, self.source.schema())
        sources = self.kind.schema_change_sources(spark, p, logic, records, self.state_path)
        for path, wanted, what in (
            (self.state_path, self.kind.state_schema(logic), "state table"),
            (self.placement.sink_path, changelog.sink_schema(p, logic.output_schema), "sink"),
        ):
            if tables.exists(spark, path):
                take_up(spark, path, wanted, what, p.name, sources)
        self.incremental.use(logic)

    def _query_name(self) -> str:
        return f"{self.pipeline.name}_{self.run_name[:8]}".replace("-", "_")

    def _resume_after_schema_change(self) -> bool:
        """Restarts the live query (from its checkpoint) when Delta's source stopped it on a schema change;
        True when it did."""
        q = self.incremental.query
        if q is None or q.isActive or not is_schema_change_stop(q.exception()):
            return False
        self._take_up_schema()
        self.incremental.start(self._trigger(False), self._query_name())
        return True

    def _start(self, available_now: bool, drain: bool, first_batch_wait_s: float) -> LiveStart:
        started = time.perf_counter()
        self._take_up_schema()
        name = self._query_name()
        if available_now:
            # Delta's source stops a query at a schema change; a new query takes the new schema up.
            for _ in range(3):
                q = self.incremental.start(self._trigger(True), name)
                try:
                    q.awaitTermination()  # raises the query's error when it failed
                except StreamingQueryException as exc:
                    if not is_schema_change_stop(q.exception()):
                        self._raise_engine_error(exc)
                        raise
                    self._take_up_schema()
                    continue
                break
            self._raise_if_failed(q)
            return self._started(started)
        self.incremental.start(self._trigger(False), name)
        if drain:
            self.process_available()
        elif self._anything_waits():  # read after the start: its switch's record is the first progress
            self._await_first_batch(first_batch_wait_s)
        return self._started(started)

    def _anything_waits(self) -> bool:
        """Whether an input has records after what the live phase applied (an unknown distance counts as none: the
        start then does not wait for a first micro-batch that may never come)."""
        return any(lag.behind for lag in self.lags())

    def _await_first_batch(self, timeout_s: float) -> None:
        """Waits until the started query's first micro-batch has recorded its progress, at most ``timeout_s``;
        raises the query's error when it fails meanwhile (a schema change resumes it, as while it runs)."""
        deadline = time.monotonic() + timeout_s
        while self.incremental.first_batch_at_us is None and time.monotonic() < deadline:
            self.raise_if_failed()
            time.sleep(FIRST_BATCH_POLL_S)

    def _started(self, started: float) -> LiveStart:
        return LiveStart(
            self.run_name, time.perf_counter() - started, time.time_ns() // 1000, self.incremental.first_batch_at_us
        )

    def process_available(self) -> None:
        """Blocks until every source version available now is applied and in the sink.

        When every input is a Delta table, returns as soon as the progress log's newest record is complete through
        each input's head version as of the call; Spark's own wait (``processAllAvailable``) returns only after a
        trigger that finds nothing new, up to a whole trigger interval later. It remains the way for Kafka inputs
        (whose ends a commit marker moves) and when the query stops or does not catch up within a trigger interval
        (a schema change, a version without data changes)."""
        if self.incremental.query is None:
            raise PhaseStateError("the live phase is not running; call start() first")
        heads = self._delta_heads()
        if heads is not None and self._await_applied(heads):
            return
        for _ in range(3):
            try:
                self.incremental.query.processAllAvailable()
                return
            except StreamingQueryException as exc:
                if not self._resume_after_schema_change():
                    self._raise_engine_error(exc)
                    raise
        self.incremental.query.processAllAvailable()

    def _delta_heads(self) -> dict[str, int] | None:
        """Each input's head version, when every input is a Delta table (else None)."""
        inputs = self.incremental.inputs
        if not all(isinstance(inp.source, DeltaTableSource) for inp in inputs):
            return None
        return {inp.label: inp.source.head_version() for inp in inputs}

    def _await_applied(self, heads: dict[str, int]) -> bool:
        """Waits until the newest progress record is complete through ``heads`` and Spark's checkpoint has committed
        every micro-batch it planned, at least one (True), at most a trigger interval and :data:`APPLIED_GRACE_S`
        while the query runs; False when it stopped or did not get there."""
        deadline = time.monotonic() + self.pipeline.checkpoint_interval.total_seconds() + APPLIED_GRACE_S
        folder = self.incremental.query_folder
        while True:
            latest = self.incremental.latest_progress()
            if all(latest.of(label).complete_below > head for label, head in heads.items()):
                planned = spark_internals.checkpoint_batch_ids(self.spark, folder, spark_internals.OFFSETS)
                committed = spark_internals.checkpoint_batch_ids(self.spark, folder, spark_internals.COMMITS)
                if planned and committed and committed[-1] >= planned[-1]:
                    return True
            q = self.incremental.query
            if q is None or not q.isActive or time.monotonic() > deadline:
                return False
            time.sleep(FIRST_BATCH_POLL_S)

    @property
    def query(self) -> StreamingQuery | None:
        """The live query (None before :meth:`start`)."""
        return self.incremental.query

    def stop(self) -> None:
        """Stops the query (and a changelog sink's background compaction), unloads the run's state store from the
        executors (its newest snapshot uploaded first, so that a restart does not replay the changelogs since the
        last upload) and releases the live lease."""
        if self._watcher is not None:
            self._watcher.set()
        try:
            if self.compactor is not None:
                self.compactor.stop()
                self.compactor = None
            q = self.incremental.query
            if q is not None and q.isActive:
                q.stop()
            self.incremental.close_topic()
            self._unload_state()
        finally:
            self._release()

    def _unload_state(self) -> None:
        # Only an optimisation of the next start: a failure is logged, and the next opening loads what is there.
        try:
            unloaded = self.incremental.step.release()
        except StateStoreError as exc:
            log.warning("live phase %s: the state store stays loaded until Spark's maintenance: %s", self.run_name, exc)
            return
        if unloaded:
            log.info("live phase %s: state store unloaded (%d partitions)", self.run_name, unloaded)

    def raise_if_failed(self) -> None:
        """Raises PhaseStateError when the started query has stopped (with the query's own error). A query
        that Delta's source stopped on a schema change is resumed instead, taking the change up."""
        if self.stopped_for is not None:
            return  # stopped on request, cleanly: the caller reads stopped_for
        self._resume_after_schema_change()
        q = self.incremental.query
        if q is not None and not q.isActive:
            exc = q.exception()
            if exc is not None:
                self._raise_engine_error(exc)
            raise LiveQueryStopped(
                f"the live query of {self.pipeline.name!r} stopped"
                + (f": {exc}" if exc is not None else " without an error (stopped from outside)")
            )

    def _raise_engine_error(self, exc: BaseException) -> None:
        """Re-raises the engine error a micro-batch raised (Spark's exception only wraps its text)."""
        failure = self.incremental.failure
        if failure is not None:
            raise failure from exc
        raise_if_refused(exc, self.pipeline.inputs)

    def _raise_if_failed(self, q: StreamingQuery) -> None:
        exc = q.exception()
        if exc is not None:
            self._raise_engine_error(exc)
            raise exc

    def lag(self):
        """How far the live phase is behind its source now (:class:`phases._internal.sources.lag.InputLag`; no Spark
        job): versions after the last applied one (Delta), or records after the last micro-batch's end offsets
        (Kafka)."""
        return self.lags()[0]

    def lags(self):
        """:meth:`lag` of every input (the source first, then a two-input operator's right source)."""
        from phases._internal.sources import lag as source_lag
        from phases._internal.sources.kafka import ChunkPlan

        latest = self.incremental.latest_progress()
        out = []
        for inp in self.pipeline.inputs:
            progress = latest.of(inp.label)
            watermark = watermark_after(progress.running_max_us, self.pipeline.delay_us)
            position = self.handoff.positions.get(inp.label) if self.handoff else None
            end = latest.offsets_of(inp.label)
            if end is not None:
                topic = (inp.spec.live if inp.spec.kind == "hybrid" else inp.spec).topic  # pyright: ignore[reportAttributeAccessIssue]
                position = ChunkPlan(topic, end, end, 1).to_json()
            label = "source" if inp.label == SOURCE_LABEL else inp.name
            out.append(
                source_lag.input_lag(
                    label,
                    inp.spec,
                    self.placement,
                    version=progress.complete_below - 1,
                    position=position,
                    watermark_us=watermark,
                )
            )
        return out

    def arrival_chunks(self, label: str = SOURCE_LABEL) -> dict[int, dict[int, tuple[int, int]]]:
        """A Kafka input's arrival-chunk log: :func:`phases._internal.live.arrivals.arrival_chunks`."""
        return arrival_chunks(self.pipeline, self.handoff, self.incremental.progress_log, label)

    def latest_progress(self) -> Progress:
        """What the live phase has applied so far: its newest progress record (the switch's before its first
        micro-batch), with the state store's layout and version (:class:`phases._internal.live.plan.Progress`)."""
        return self.incremental.latest_progress()

    def status(self) -> dict:
        """Batch id, input rates, the pipeline's watermark and last applied source version, for progress
        reports."""
        return {"run": self.run_name, "live": query_status(self)}
