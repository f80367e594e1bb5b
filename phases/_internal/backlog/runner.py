"""The backlog phase: a bounded, blocking Spark batch job over the source snapshot at version V.

Records are validated, tagged late by the version watermark (:mod:`phases._internal.lateness`), lifted into
aggregation buffers and merged per key by Spark's hash aggregation (the merge is order-insensitive, so
there is no sort by key: Spark combines map-side before its shuffle; the process kind, whose functions see
a key's records in order, sorts in :mod:`phases._internal.operators.process_pass`). No streaming
checkpoint is taken (FLIP-327 with ``checkpoint_interval_during_backlog == 0``). Writes, in order:

1. the quarantined records (replacing this pipeline's earlier backlog rows of the same versions);
2. the per-key state to a fresh Delta table ``state/<manifest_id>`` (one commit);
3. the results to the sink (overwrite: a re-run replaces, never duplicates);
4. last, the handoff manifest (one atomic Delta append).

Every aggregation is a monoid, so the state of versions 0..V can also be built from pieces: a catch-up
increment merges versions V+1..V' into the last handoff's state (:meth:`BacklogRunner.run_increment`),
and daily slices merge their partial states (:mod:`phases._internal.backlog.slices`).

A crash before step 4 leaves no manifest; the live phase cannot start, and a re-run starts over
idempotently. An orphaned ``state/<id>`` table of a crashed run is never referenced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

from pyspark.sql import DataFrame, SparkSession

from phases._internal import uris
from phases._internal.backlog import increments, progress, refusals
from phases._internal.backlog.partials import version_range_partial
from phases._internal.coordination import leases
from phases._internal.definition import OPERATOR_VERSION, RIGHT_LABEL, SOURCE_LABEL, STATE_SCHEMA_VERSION, Pipeline
from phases._internal.deployment import Placement, generations, place, require_serving
from phases._internal.errors import LeaseHeld, ManifestError, PhaseStateError, SourceError
from phases._internal.handoff import intents, manifest
from phases._internal.handoff.live_folders import live_started
from phases._internal.lateness import watermark_after
from phases._internal.operators.base import HandoffWrite
from phases._internal.operators.registry import kind_of
from phases._internal.sources.kafka import KafkaTopicSource, raise_if_refused
from phases._internal.sources.reader import continue_inputs, open_inputs
from phases._internal.state.keyed_store import StatePosition
from phases._internal.steps.end_of_stream import EndOfStreamRunner
from phases._internal.storage import fs, maintenance, quarantine, table_stats, tables
from phases._internal.tagging import tag_version_range
from phases._internal.topics import sink as topic_sinks

log = logging.getLogger(__name__)


class BacklogRunner:
    """Runs the backlog phase and writes the handoff: whole (:meth:`run`), as a catch-up increment on top
    of the last handoff (:meth:`run_increment`), or from daily slices (:mod:`phases._internal.backlog.slices`)."""

    def __init__(self, spark: SparkSession, pipeline: Pipeline, *, take_over: bool = False):
        """``take_over``: take the pipeline's backlog lease over from a holder whose process is gone. The definition
        runs as declared, as the generation that serves it (placed here once:
        :func:`phases._internal.deployment.place`); a pipeline placed elsewhere: :meth:`at`."""
        self._start(spark, place(spark, pipeline), take_over)

    @classmethod
    def at(cls, spark: SparkSession, where: Placement, *, take_over: bool = False) -> BacklogRunner:
        """The runner of ``where.definition`` where ``where`` places it (a redeploy's generation, a storage root)."""
        runner = cls.__new__(cls)
        runner._start(spark, where, take_over)
        return runner

    def _start(self, spark: SparkSession, where: Placement, take_over: bool) -> None:
        self.spark = spark
        self.placement = where
        self.pipeline = pipeline = where.definition
        self.readers = open_inputs(spark, where)  # one per input, by label
        self.source = self.readers[SOURCE_LABEL]
        self.kind = kind_of(pipeline)
        self.timings: dict[str, float] = {}
        self.holder = f"backlog run {uuid.uuid4().hex[:12]}"
        self.take_over = take_over
        self.removed_orphans: list[str] = []  # state tables of crashed runs this run removed

    @contextlib.contextmanager
    def lease(self) -> Iterator[None]:
        """The pipeline's backlog lease for this runner (re-entrant): one backlog at a time. In a terminal, the
        run shows a progress bar (:func:`phases._internal.backlog.progress.console`)."""
        hold = leases.hold(self.spark, self.placement, "backlog", self.holder, take_over=self.take_over)
        with hold, progress.console(self.spark):
            # Which generation serves is checked now, not when the runner was built: a runner built before a swap
            # would write the old definition's results into the sink the new one serves.
            gens = require_serving(self.spark, self.placement)
            if self.placement.serving:  # it writes the table consumers read: a swap the log lost would be overwritten
                unrecorded = generations.unrecorded_swap(self.spark, self.placement, gens)
                if unrecorded is not None:
                    raise generations.log_behind_error(self.placement, unrecorded)
            yield

    def _step(self, name: str):
        return progress.step(self.spark, self.pipeline.name, "backlog", name)

    def switched_to_live(self) -> str | None:
        """The manifest whose live phase has started (the pipeline is live from it), None before the switch."""
        p = self.pipeline
        try:
            current = manifest.latest(self.spark, self.placement.manifests, p.name)
        except ManifestError:
            return None
        return current.manifest_id if live_started(self.spark, self.placement, current.manifest_id) else None

    def refuse_after_switch(self, reset: bool) -> None:
        """:func:`phases._internal.backlog.refusals.refuse_after_switch` of this runner's generation."""
        refusals.refuse_after_switch(self.spark, self.placement, self.switched_to_live(), reset)

    def logic(self):
        """The operator logic over the records as the operator sees them (after steps and enrichment)."""
        return self.kind.logic_for(self.spark, self.placement, self.readers.values())

    def _end_version(self, end_version: int | None) -> int:
        head = self.source.head_version()
        v = head if end_version is None else end_version
        if not 0 <= v <= head:
            raise SourceError(f"end_version {end_version} is outside the source's versions 0..{head}")
        return v

    def run(self, end_version: int | None = None, *, reset: bool = False) -> manifest.HandoffManifest:
        """Runs the backlog over versions 0..end_version (default: the head now) and hands off. ``reset`` starts
        over after a switch; it also holds the pipeline's live lease while it runs, so it is refused while a live
        phase runs (and no live phase starts on the tables it rewrites)."""
        with self.lease(), self._live_lease_for_reset(reset):
            try:
                return self._run(end_version, reset)
            except Exception as exc:
                raise_if_refused(exc, self.placement.definition.inputs)
                raise

    @contextlib.contextmanager
    def _live_lease_for_reset(self, reset: bool) -> Iterator[None]:
        if not reset:
            yield
            return
        try:
            hold = leases.hold(self.spark, self.placement, "live", self.holder, take_over=self.take_over)
            hold.__enter__()
        except LeaseHeld as exc:
            raise LeaseHeld(
                f"pipeline {self.pipeline.name!r}: a reset is refused while its live phase runs: a reset rewrites the "
                f"state and the sink under it. Stop the live phase first, then reset. ({exc})"
            ) from exc
        try:
            yield
        finally:
            hold.__exit__(None, None, None)

    def _run(self, end_version: int | None, reset: bool) -> manifest.HandoffManifest:
        started = time.perf_counter()
        self.refuse_after_switch(reset)
        fs.sweep_orphan_checksums(self.placement.sink_path, self.placement.quarantine, self.placement.manifests)
        self.removed_orphans = maintenance.remove_orphan_state(self.spark, self.placement)
        v = self._end_version(end_version)
        topic_sinks.check(self.placement)  # before the backlog's passes: a missing topic is found first
        if self.pipeline.checkpoint_interval_during_backlog > timedelta(0):
            return self._run_in_increments(v, reset, started)
        return self._run_full(v, started)

    def increment_ends(self, end_version: int) -> list[int]:
        """:func:`phases._internal.backlog.increments.increment_ends` of this runner's source."""
        interval = self.pipeline.checkpoint_interval_during_backlog
        return increments.increment_ends(self.source.commit_times(), end_version, interval)

    def _run_in_increments(self, v: int, reset: bool, started: float) -> manifest.HandoffManifest:
        """FLIP-309's checkpoint interval during backlog, for a batch backlog (FLIP-383's recovery): the
        backlog commits a handoff after each increment, so a crash re-runs at most the increment it was in.
        A re-run continues from the newest handoff of this definition that ends an increment."""
        p = self.pipeline
        ends = self.increment_ends(v)
        done = None
        if not reset:
            try:
                newest = manifest.latest(self.spark, self.placement.manifests, p.name)
            except ManifestError:
                newest = None
            if (
                newest is not None
                and self.placement.is_fingerprint(newest.fingerprint)
                and newest.source_version in ends
            ):
                done = newest
        if done is None:
            done = self._run_full(ends[0], started)
        for end in ends:
            if end > done.source_version:
                done = self._run_increment(end)
        self.timings["increments"] = float(len(ends))
        return done

    def _run_full(self, v: int, started: float) -> manifest.HandoffManifest:
        try:
            return self._run_full_pass(v, started)
        finally:
            for source in self.readers.values():
                release = getattr(source, "release", None)
                if release is not None:
                    release()

    def _run_full_pass(self, v: int, started: float) -> manifest.HandoffManifest:
        if self.pipeline.end_of_stream:
            t = time.perf_counter()
            with self._step("end-of-stream steps"):
                EndOfStreamRunner(self.spark, self.placement).run_all(v)  # blocking, before the stream operator
            self.timings["end_of_stream_s"] = time.perf_counter() - t
        p, spark = self.pipeline, self.spark
        logic = self.logic()  # checks the definition against the sources' schemas before any pass
        with self._step("statistics (watermarks)"):
            per_record = self.kind.per_record_watermarks
            ends, inputs = {}, []
            for inp in p.inputs:  # the source up to v; a second input up to its own head
                reader = self.readers[inp.label]
                ends[inp.label] = end = v if inp.label == SOURCE_LABEL else reader.head_version()
                reader.require_change_feed(end)
                tagged = tag_version_range(
                    spark, self.placement, reader, (0, end), None, self.timings, per_record_watermarks=per_record
                )
                inputs.append(tagged)
            right = (ends[RIGHT_LABEL], inputs[1].running_max_us) if p.inputs.two else None
        if inputs[0].from_log:
            self.timings["statistics_from_log"] = 1.0
        t = time.perf_counter()
        rows = inputs[0].quarantine
        for inp, tagged in zip(p.inputs, inputs, strict=True):
            if inp.label != SOURCE_LABEL:
                rows = rows.unionByName(quarantine.of_input(tagged.quarantine, inp.label))
        empty = not any(i.has_quarantine for i in inputs)

        with self._step("quarantine"):
            quarantined = quarantine.replace_all_backlog(spark, self.placement.quarantine, p.name, rows, empty=empty)
        self.timings["quarantine_s"] = time.perf_counter() - t
        write = self.kind.backlog(spark, p, logic, inputs)
        handoff = self.write_handoff(
            write,
            source_version=v,
            max_us=inputs[0].running_max_us,
            started=started,
            kind="full",
            right=right,
            quarantined=quarantined,
        )
        return handoff

    def _publish_handoff(self, handoff: manifest.HandoffManifest) -> None:
        """A topic sink: the handoff's results published (after its manifest: the manifest's id names the write, and a
        live start publishes them when a crash came first; an increment's, what changed since the handoff it builds
        on: :mod:`phases._internal.topics.sink`)."""
        topic = topic_sinks.topic_sink(self.placement)
        if topic is None:
            return
        t = time.perf_counter()
        try:
            with self._step("topic"):
                topic.publish_handoff(
                    self.spark,
                    handoff.manifest_id,
                    self.placement.sink_path,
                    handoff.sink_version,
                    bases=lambda: manifest.base_sink_versions(self.spark, self.placement.manifests, handoff),
                )
        finally:
            topic.close()
        self.timings["topic_s"] = time.perf_counter() - t

    def run_increment(self, end_version: int | None = None) -> manifest.HandoffManifest:
        """Catch-up: merges versions V+1..end_version (default: the head) into the last handoff's state and
        hands off again, without re-reading versions 0..V. Returns the last handoff when nothing is new."""
        with self.lease():
            return self._run_increment(end_version)

    def _run_increment(self, end_version: int | None) -> manifest.HandoffManifest:
        refusals.refuse_increments(self.pipeline, "a catch-up increment")
        started = time.perf_counter()
        p = self.pipeline
        base = manifest.latest(self.spark, self.placement.manifests, p.name)
        manifest.check_matches(self.spark, base, self.placement, self.placement.redeploys.amended)
        if live_started(self.spark, self.placement, base.manifest_id):
            raise PhaseStateError(
                f"pipeline {p.name!r} already switched to live from manifest {base.manifest_id}; the live phase "
                "reads every version after it, a catch-up increment would count them twice"
            )
        self._continue_topics(base)
        v = self._end_version(end_version)
        if not self.kind.supports_increments:
            return self._run_step_increment(base, v, started)
        if v <= base.source_version:
            return base
        logic = self.logic()
        lo = base.source_version + 1
        with self._step("statistics (watermarks)"):
            pieces = self.kind.pieces(logic)
            part = version_range_partial(
                self.spark, self.placement, self.source, pieces, (lo, v), base.backlog_max_event_time_us, self.timings
            )
        t = time.perf_counter()
        with self._step("quarantine"):
            quarantine.replace_backlog(
                self.spark, self.placement.quarantine, p.name, part.quarantine, (lo, v), empty=not part.has_quarantine
            )
        self.timings["quarantine_s"] = time.perf_counter() - t
        previous = self.spark.read.format("delta").load(base.state_path).select(*part.buffers.columns)
        state = pieces.merge(previous.unionByName(part.buffers))
        return self.hand_off(state, logic, v, part.running_max_us, started=started, kind="increment", base=base)

    def _continue_topics(self, base: manifest.HandoffManifest, plans: dict[str, str] | None = None) -> None:
        """An increment's readers: a topic input continues from ``base``'s end offsets (or follows ``plans``)."""
        p = self.pipeline
        if p.inputs.tables_only:
            return
        firsts = {SOURCE_LABEL: base.source_version + 1}
        if p.inputs.two:
            firsts[RIGHT_LABEL] = (base.right_source_version if base.right_source_version is not None else -1) + 1
        self.readers = continue_inputs(self.spark, self.placement, positions=base.positions, firsts=firsts, plans=plans)
        self.source = self.readers[SOURCE_LABEL]

    def _run_step_increment(self, base: manifest.HandoffManifest, v: int, started: float) -> manifest.HandoffManifest:
        """An increment of a kind whose state does not merge, through its live step
        (:mod:`phases._internal.backlog.increments`): the source up to ``v``, a second input up to its head."""
        p = self.pipeline
        ends = {SOURCE_LABEL: v}
        if p.inputs.two:
            ends[RIGHT_LABEL] = self.readers[RIGHT_LABEL].head_version()
        right_base = base.right_source_version if base.right_source_version is not None else -1
        fresh = v > base.source_version or (p.inputs.two and ends[RIGHT_LABEL] > right_base)
        if not fresh and intents.open_intent(self.spark, self.placement, base.manifest_id) is None:
            return base
        plans = {label: r.plan().to_json() for label, r in self.readers.items() if isinstance(r, KafkaTopicSource)}
        intent = intents.Intent.fix(self.spark, self.placement, base.manifest_id, ends, plans)
        if intent.plans != plans:  # an earlier attempt's range: the same offsets, whatever the topic holds now
            self._continue_topics(base, intent.plans)
        logic = self.logic()
        with self._step("increment"):
            done = increments.run_through_step(
                self.spark, self.placement, self.kind, logic, self.readers, base, intent, self.timings
            )
        right = None
        if p.inputs.two:
            right = (intent.ends[RIGHT_LABEL], done.maxima[RIGHT_LABEL])
        handoff = self.write_handoff(
            done.write,
            source_version=intent.ends[SOURCE_LABEL],
            max_us=done.maxima[SOURCE_LABEL],
            started=started,
            kind="increment",
            base=base,
            right=right,
            manifest_id=intent.manifest_id,
            state_store=done.write.position,
        )
        intent.close(self.spark, self.placement)
        return handoff

    def hand_off(
        self,
        state: DataFrame,
        logic,
        source_version: int,
        max_us: int | None,
        *,
        started: float,
        kind: str,
        base: manifest.HandoffManifest | None = None,
    ) -> manifest.HandoffManifest:
        """Hands off a state merged from pieces (a catch-up increment on top of ``base``, or daily slices)."""
        write = self.kind.handoff(self.spark, self.pipeline, logic, state, max_us, base)
        return self.write_handoff(
            write, source_version=source_version, max_us=max_us, started=started, kind=kind, base=base
        )

    def write_handoff(
        self,
        write: HandoffWrite,
        *,
        source_version: int,
        max_us: int | None,
        started: float,
        kind: str,
        base: manifest.HandoffManifest | None = None,
        right: tuple[int, int | None] | None = None,
        quarantined: tuple[int, int, int] | None = None,
        manifest_id: str | None = None,
        state_store: StatePosition | None = None,
    ) -> manifest.HandoffManifest:
        """Writes the state to a fresh table, then the sink and, last, the manifest (every operator kind). The
        quarantine rows of versions 0..source_version must already be written; ``quarantined``: their (late,
        invalid, future) counts when the caller observed them (else the manifest step counts them).
        ``manifest_id``: the id an increment's intent fixed (default: a new one); ``state_store``: where the live
        phase's state starts in its store, when not at version 1."""
        manifest_id = manifest_id or uuid.uuid4().hex
        state_path = uris.join(self.placement.state_root, manifest_id)
        try:
            t = time.perf_counter()
            with self._step("state"):
                write.write_state(state_path)
            self.timings["state_s"] = time.perf_counter() - t
            t = time.perf_counter()
            with self._step("live state"):
                write.write_live_state(self.placement.state_store(manifest_id))
            self.timings["live_state_s"] = time.perf_counter() - t
            t = time.perf_counter()
            with self._step("sink"):
                write.write_sink(self.placement.sink_path)
            self.timings["sink_s"] = time.perf_counter() - t
            with self._step("manifest"):
                counts = write.counts(self.spark, state_path, self.placement.sink_path)
        finally:
            write.close()
        handoff = self._write_manifest(
            manifest_id=manifest_id,
            kind=kind,
            base=base,
            source_version=source_version,
            max_us=max_us,
            state_path=state_path,
            state_rows=counts.state_rows,
            aggregated=counts.aggregated,
            sink_rows=counts.sink_rows,
            started=started,
            right=right,
            quarantined=quarantined,
            state_store=state_store,
        )
        self._publish_handoff(handoff)
        return handoff

    def _write_manifest(
        self,
        *,
        manifest_id: str,
        kind: str,
        base: manifest.HandoffManifest | None,
        source_version: int,
        max_us: int | None,
        state_path: str,
        state_rows: int,
        aggregated: int,
        sink_rows: int,
        started: float,
        right: tuple[int, int | None] | None = None,
        quarantined: tuple[int, int, int] | None = None,
        state_store: StatePosition | None = None,
    ) -> manifest.HandoffManifest:
        """Appends the handoff manifest, last: after it, the live phase may start. ``right``: the right
        source's version and max event time (two-input operators); ``quarantined``: the (late, invalid, future)
        counts of a full run's quarantine write, observed as it wrote (else read from the table)."""
        p = self.pipeline
        with self._step("manifest"):
            late, invalid, future = quarantined or quarantine.backlog_counts(
                self.spark, self.placement.quarantine, p.name, source_version
            )
        sink_commit = table_stats.head_commit(self.spark, self.placement.sink_path)
        handoff = manifest.HandoffManifest(
            manifest_id=manifest_id,
            pipeline=p.name,
            kind=kind,
            base_manifest_id=base.manifest_id if base is not None else None,
            fingerprint=p.fingerprint(),
            state_spec=json.dumps(p.state_spec(), sort_keys=True),
            state_schema_version=STATE_SCHEMA_VERSION,
            operator_version=OPERATOR_VERSION,
            source_path=self.placement.location(p.source),
            source_version=source_version,
            source_position=self.source.position_of(source_version),
            backlog_max_event_time_us=max_us,
            final_watermark_us=watermark_after(max_us, p.delay_us),
            state_path=state_path,
            state_table_version=tables.version(self.spark, state_path),
            state_rows=state_rows,
            input_rows=aggregated + late + invalid,
            aggregated_rows=aggregated,
            late_rows=late,
            invalid_rows=invalid,
            future_rows=future,
            sink_version=tables.version(self.spark, self.placement.sink_path),
            sink_commit_ms=table_stats.commit_ms(sink_commit) if sink_commit is not None else None,
            quarantine_version=(
                tables.version(self.spark, self.placement.quarantine)
                if tables.exists(self.spark, self.placement.quarantine)
                else None
            ),
            sink_rows=sink_rows,
            right_source_version=right[0] if right else None,
            right_max_event_time_us=right[1] if right else None,
            right_source_position=self.readers[RIGHT_LABEL].position_of(right[0]) if right else None,
            state_store_layout=state_store.layout if state_store else None,
            state_store_version=state_store.version if state_store else None,
            backlog_seconds=time.perf_counter() - started,
            created_at_us=time.time_ns() // 1000,
        )
        manifest.write(self.spark, self.placement.manifests, handoff)
        self.timings["total_s"] = time.perf_counter() - started
        return handoff
