"""The backlog phase: a bounded, blocking Spark batch job over the source snapshot at version V.

Records are validated, tagged late by the version watermark (:mod:`phases.lateness`), repartitioned by
key and sorted by key and event time, lifted into aggregation buffers and merged per key. No streaming
checkpoint is taken (FLIP-327 with ``checkpoint_interval_during_backlog == 0``). Writes, in order:

1. the quarantined records (replacing this pipeline's earlier backlog rows of the same versions);
2. the per-key state to a fresh Delta table ``state/<manifest_id>`` (one commit);
3. the results to the sink (overwrite: a re-run replaces, never duplicates);
4. last, the handoff manifest (one atomic Delta append).

Every aggregation is a monoid, so the state of versions 0..V can also be built from pieces: a catch-up
increment merges versions V+1..V' into the last handoff's state (:meth:`BacklogRunner.run_increment`),
and daily slices merge their partial states (:mod:`phases.slices`).

A crash before step 4 leaves no manifest; the live phase cannot start, and a re-run starts over
idempotently. An orphaned ``state/<id>`` table of a crashed run is never referenced.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePosixPath

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from phases import fs, lateness, leases, maintenance, manifest, quarantine, tables
from phases.definition import OPERATOR_VERSION, STATE_SCHEMA_VERSION, WINDOW_END, Pipeline, ProcessOperator
from phases.delta_source import DeltaTableSource
from phases.end_of_stream import EndOfStreamRunner, prepare, prepared_schema
from phases.errors import ManifestError, PhaseStateError, SourceError
from phases.keyed_aggregate import ROWS, KeyedAggregationLogic, WindowedAggregationLogic, logic_for
from phases.process_operator import ROWS as PROCESS_ROWS
from phases.process_operator import ProcessLogic
from phases.records import REASON, with_reason
from phases.two_input import two_input_logic_for


def live_checkpoint_root(pipeline: Pipeline, run_name: str) -> str:
    return str(PurePosixPath(pipeline.locations.checkpoints) / run_name)


def live_started(spark: SparkSession, pipeline: Pipeline, manifest_id: str) -> bool:
    """True once the live phase of ``manifest_id`` has committed its first checkpoint (its first progress row;
    for process and two-input operators, the operator query's first commit)."""
    return tables.exists(spark, f"{pipeline.locations.live_run(manifest_id)}/progress") or fs.exists(
        spark, f"{live_checkpoint_root(pipeline, manifest_id)}/aggregate/commits/0"
    )


@dataclass(frozen=True)
class Partial:
    """What a version range lo..hi contributes: per-key merged buffers, quarantine rows, maxima."""

    buffers: DataFrame  # keys + buffer columns, one row per key
    quarantine: DataFrame
    range_max_us: int | None  # max event time of the range's valid records
    running_max_us: int | None  # max event time of all valid records in versions 0..hi
    has_quarantine: bool = True  # whether ``quarantine`` can hold any row


def version_range_partial(
    spark: SparkSession,
    pipeline: Pipeline,
    source: DeltaTableSource,
    logic: KeyedAggregationLogic,
    versions: tuple[int, int],
    prior_max_us: int | None,
    timings: dict[str, float] | None = None,
) -> Partial:
    """Validates, tags late records and merges per key the changes of versions lo..hi (inclusive).

    ``prior_max_us`` is the max event time of the valid records of all versions before ``lo``: it
    continues the version watermark, so a range's late records are the same whether it runs alone, as a
    slice, as a catch-up increment or as part of one backlog job.
    """
    tagged = tag_version_range(spark, pipeline, source, versions, prior_max_us, timings)
    buffers = logic.merge(logic.lift(sorted_backlog_input(spark, pipeline, tagged.prepared)))
    return Partial(
        buffers, tagged.quarantine, tagged.range_max_us, tagged.running_max_us, has_quarantine=tagged.has_quarantine
    )


@dataclass(frozen=True)
class TaggedRange:
    """Versions lo..hi validated and tagged: on-time records as the operator sees them (with their
    version and its watermark W(v)), quarantine rows, event-time maxima, and whether there is anything
    on time or to quarantine at all (from the per-version statistics, without another pass)."""

    prepared: DataFrame
    quarantine: DataFrame
    range_max_us: int | None
    running_max_us: int | None
    has_on_time: bool = True
    has_quarantine: bool = True


def tag_version_range(
    spark: SparkSession,
    pipeline: Pipeline,
    source: DeltaTableSource,
    versions: tuple[int, int],
    prior_max_us: int | None,
    timings: dict[str, float] | None = None,
) -> TaggedRange:
    lo, hi = versions
    return tag_changes(spark, pipeline, source.read_backlog(hi, lo), prior_max_us, timings, phase="backlog")


def tag_changes(
    spark: SparkSession,
    pipeline: Pipeline,
    changes: DataFrame,
    prior_max_us: int | None,
    timings: dict[str, float] | None = None,
    *,
    phase: str,
    batch_id: int | None = None,
) -> TaggedRange:
    """Validates and tags change-feed rows of *complete* versions under the version watermark W(v),
    continuing from ``prior_max_us`` (the max valid event time of every earlier version). The backlog,
    catch-up increments, slices and every live micro-batch tag through here."""
    timings = {} if timings is None else timings
    tagged = with_reason(changes, pipeline)
    is_valid = F.col(REASON).isNull()
    valid, invalid = tagged.filter(is_valid).drop(REASON), tagged.filter(~is_valid)
    t = time.perf_counter()
    stats = lateness.version_stats(tagged, is_valid, pipeline.event_time)
    maxima = [(s.version, s.max_us) for s in stats if s.max_us is not None]
    marks, running = lateness.version_watermarks(maxima, prior_max_us, pipeline.delay_us)
    on_time, late = lateness.split_late(spark, valid, marks, pipeline.event_time)
    timings["watermarks_s"] = timings.get("watermarks_s", 0.0) + time.perf_counter() - t
    # The quarantine reads only the versions that can hold such rows (a literal false prunes the scan).
    late_versions = lateness.late_candidates(stats, marks)
    invalid_versions = [s.version for s in stats if s.invalid]
    late = late.filter(_in_versions(late_versions))
    invalid = invalid.filter(_in_versions(invalid_versions))
    q_rows = quarantine.invalid_and_late(
        invalid, late, pipeline=pipeline.name, phase=phase, event_time=pipeline.event_time, batch_id=batch_id
    )
    range_max = max((m for _, m in maxima), default=None)
    # A version holds an on-time record iff its greatest valid event time is above its watermark.
    has_on_time = any(s.max_us is not None and (s.version not in marks or s.max_us > marks[s.version]) for s in stats)
    return TaggedRange(
        prepare(on_time, pipeline, spark),
        q_rows,
        range_max,
        running,
        has_on_time=has_on_time,
        has_quarantine=bool(late_versions or invalid_versions),
    )


def _in_versions(versions: list[int]) -> Column:
    return F.col(lateness.VERSION).isin(versions) if versions else F.lit(False)


class BacklogRunner:
    """Runs the backlog phase and writes the handoff: whole (:meth:`run`), as a catch-up increment on top
    of the last handoff (:meth:`run_increment`), or from daily slices (:mod:`phases.slices`)."""

    def __init__(self, spark: SparkSession, pipeline: Pipeline, *, take_over: bool = False):
        """``take_over``: take the pipeline's backlog lease over from a holder whose process is gone."""
        self.spark = spark
        self.pipeline = pipeline
        self.source = DeltaTableSource(spark, pipeline.source)
        self.timings: dict[str, float] = {}
        self.holder = f"backlog run {uuid.uuid4().hex[:12]}"
        self.take_over = take_over
        self.removed_orphans: list[str] = []  # state tables of crashed runs this run removed

    def lease(self) -> leases.hold:
        """The pipeline's backlog lease for this runner (re-entrant): one backlog at a time."""
        return leases.hold(self.spark, self.pipeline, "backlog", self.holder, take_over=self.take_over)

    def refuse_after_switch(self, reset: bool) -> None:
        """Raises PhaseStateError once the live phase of the latest manifest has started (unless reset)."""
        p = self.pipeline
        try:
            current = manifest.latest(self.spark, p.locations.manifests, p.name)
        except ManifestError:
            return
        if not live_started(self.spark, p, current.manifest_id):
            return
        if not reset:
            raise PhaseStateError(
                f"pipeline {p.name!r} already switched to live from manifest {current.manifest_id} "
                f"(checkpoint {live_checkpoint_root(p, current.manifest_id)}); running the backlog again "
                "would rewrite the sink under a running live phase. Stop the live phase and pass reset=True "
                "to start over from a new backlog."
            )
        if tables.exists(self.spark, p.locations.quarantine):
            self.spark.sql(
                f"DELETE FROM delta.`{p.locations.quarantine}` WHERE pipeline = '{p.name}' AND phase = 'live'"
            )

    def logic(self) -> KeyedAggregationLogic:
        """The operator logic over the records as the operator sees them (after steps and enrichment)."""
        return logic_for(self.pipeline, prepared_schema(self.spark, self.pipeline, self.source.schema()))

    def refuse_pieces(self, what: str) -> None:
        if isinstance(self.pipeline.operator, ProcessOperator):
            raise PhaseStateError(
                f"{what} is not available for pipeline {self.pipeline.name!r}: its process operator "
                f"({self.pipeline.operator.function}) keeps arbitrary per-key state that is not a mergeable "
                "aggregate; run the full backlog instead"
            )
        if self.pipeline.right_source is not None:
            raise PhaseStateError(
                f"{what} is not available for pipeline {self.pipeline.name!r}: its {self.pipeline.operator.kind} "
                "operator reads two sources whose versions are not cut together; run the full backlog instead"
            )
        if self.pipeline.end_of_stream:
            raise PhaseStateError(
                f"{what} is not available for pipeline {self.pipeline.name!r}: its end_of_stream steps "
                f"({[s.name for s in self.pipeline.end_of_stream]}) consume the whole backlog 0..V in one run; "
                "run the full backlog instead"
            )

    def _end_version(self, end_version: int | None) -> int:
        head = self.source.head_version()
        v = head if end_version is None else end_version
        if not 0 <= v <= head:
            raise SourceError(f"end_version {end_version} is outside the source's versions 0..{head}")
        return v

    def run(self, end_version: int | None = None, *, reset: bool = False) -> manifest.HandoffManifest:
        """Runs the backlog over versions 0..end_version (default: the head now) and hands off."""
        with self.lease():
            return self._run(end_version, reset)

    def _run(self, end_version: int | None, reset: bool) -> manifest.HandoffManifest:
        started = time.perf_counter()
        self.refuse_after_switch(reset)
        self.removed_orphans = maintenance.remove_orphan_state(self.spark, self.pipeline)
        v = self._end_version(end_version)
        if self.pipeline.checkpoint_interval_during_backlog > timedelta(0):
            return self._run_in_increments(v, reset, started)
        return self._run_full(v, started)

    def increment_ends(self, end_version: int) -> list[int]:
        """The last version of each increment of a backlog over 0..``end_version`` when
        ``checkpoint_interval_during_backlog`` > 0: greedy from version 0, an increment takes the versions
        committed less than the interval after its first one. Appends never move an earlier boundary."""
        interval = self.pipeline.checkpoint_interval_during_backlog
        ends: list[int] = []
        first_at, previous = None, None
        for version, at in self.source.commit_times():
            if version > end_version:
                break
            if first_at is None:
                first_at = at
            elif at - first_at >= interval:
                ends.append(previous)
                first_at = at
            previous = version
        if not ends or ends[-1] != end_version:
            ends.append(end_version)
        return ends

    def _run_in_increments(self, v: int, reset: bool, started: float) -> manifest.HandoffManifest:
        """FLIP-309's checkpoint interval during backlog, for a batch backlog (FLIP-383's recovery): the
        backlog commits a handoff after each increment, so a crash re-runs at most the increment it was in.
        A re-run continues from the newest handoff of this definition that ends an increment."""
        p = self.pipeline
        ends = self.increment_ends(v)
        done = None
        if not reset:
            try:
                newest = manifest.latest(self.spark, p.locations.manifests, p.name)
            except ManifestError:
                newest = None
            if newest is not None and newest.fingerprint == p.fingerprint() and newest.source_version in ends:
                done = newest
        if done is None:
            done = self._run_full(ends[0], started)
        for end in ends:
            if end > done.source_version:
                done = self._run_increment(end)
        self.timings["increments"] = float(len(ends))
        return done

    def _run_full(self, v: int, started: float) -> manifest.HandoffManifest:
        if self.pipeline.end_of_stream:
            t = time.perf_counter()
            EndOfStreamRunner(self.spark, self.pipeline).run_all(v)  # blocking, before the stream operator
            self.timings["end_of_stream_s"] = time.perf_counter() - t
        if isinstance(self.pipeline.operator, ProcessOperator):
            return self._run_process(v, started)
        if self.pipeline.right_source is not None:
            return self._run_two_input(v, started)
        logic = self.logic()
        part = version_range_partial(self.spark, self.pipeline, self.source, logic, (0, v), None, self.timings)
        t = time.perf_counter()
        quarantine.replace_backlog(
            self.spark,
            self.pipeline.locations.quarantine,
            self.pipeline.name,
            part.quarantine,
            empty=not part.has_quarantine,
        )
        self.timings["quarantine_s"] = time.perf_counter() - t
        return self.hand_off(part.buffers, logic, v, part.running_max_us, started=started, kind="full")

    def run_increment(self, end_version: int | None = None) -> manifest.HandoffManifest:
        """Catch-up: merges versions V+1..end_version (default: the head) into the last handoff's state and
        hands off again, without re-reading versions 0..V. Returns the last handoff when nothing is new."""
        with self.lease():
            return self._run_increment(end_version)

    def _run_increment(self, end_version: int | None) -> manifest.HandoffManifest:
        self.refuse_pieces("a catch-up increment")
        started = time.perf_counter()
        p = self.pipeline
        base = manifest.latest(self.spark, p.locations.manifests, p.name)
        manifest.check_matches(self.spark, base, p)
        if live_started(self.spark, p, base.manifest_id):
            raise PhaseStateError(
                f"pipeline {p.name!r} already switched to live from manifest {base.manifest_id}; the live phase "
                "reads every version after it, a catch-up increment would count them twice"
            )
        v = self._end_version(end_version)
        if v <= base.source_version:
            return base
        logic = self.logic()
        lo = base.source_version + 1
        part = version_range_partial(
            self.spark, p, self.source, logic, (lo, v), base.backlog_max_event_time_us, self.timings
        )
        t = time.perf_counter()
        quarantine.replace_backlog(
            self.spark, p.locations.quarantine, p.name, part.quarantine, (lo, v), empty=not part.has_quarantine
        )
        self.timings["quarantine_s"] = time.perf_counter() - t
        previous = self.spark.read.format("delta").load(base.state_path).select(*part.buffers.columns)
        state = logic.merge_partials(previous.unionByName(part.buffers))
        return self.hand_off(state, logic, v, part.running_max_us, started=started, kind="increment", base=base)

    def hand_off(
        self,
        state: DataFrame,
        logic: KeyedAggregationLogic,
        source_version: int,
        max_us: int | None,
        *,
        started: float,
        kind: str,
        base: manifest.HandoffManifest | None = None,
    ) -> manifest.HandoffManifest:
        """Writes the state to a fresh table, the sink and, last, the manifest.

        Keyed aggregation: the state is every key's buffers; the sink is overwritten with all keys.
        Windowed aggregation: windows whose end is <= the final watermark are emitted to the sink (an
        increment replaces just the windows that closed since ``base``, so a re-run never duplicates) and
        only the open windows are handed over. The quarantine rows of versions 0..source_version must already
        be written.
        """
        p = self.pipeline
        manifest_id = uuid.uuid4().hex
        state_path = str(PurePosixPath(p.locations.state_root) / manifest_id)
        watermark = None if max_us is None else max_us - p.delay_us
        windowed = isinstance(logic, WindowedAggregationLogic)
        t = time.perf_counter()
        merged = state.persist() if windowed else state
        try:
            rows_merged, writer = 0, None
            if windowed:
                rows_merged = int(merged.agg(F.sum(ROWS)).collect()[0][0] or 0)
                merged = merged.filter(~logic.closed(merged, watermark))
            merged.write.format("delta").mode("errorifexists").save(state_path)
            self.timings["state_s"] = time.perf_counter() - t

            t = time.perf_counter()
            state_table = self.spark.read.format("delta").load(state_path)
            stats = state_table.agg(F.count(F.lit(1)).alias("keys"), F.sum(ROWS).alias("rows")).collect()[0]
            if not windowed:
                rows_merged = int(stats["rows"] or 0)
                out = logic.finalize(state_table)
            else:
                out = logic.finalize(state.filter(logic.closed(state, watermark)))
                lower = base.final_watermark_us if (kind == "increment" and base is not None) else None
                if lower is not None:
                    where = f"{WINDOW_END} > timestamp_micros({lower})"
                    where += f" AND {WINDOW_END} <= timestamp_micros({watermark})" if watermark is not None else ""
                    tables.ensure(self.spark, p.sink.path, logic.output_schema)
                    writer = out.write.format("delta").mode("overwrite").option("replaceWhere", where)
            if writer is None:
                writer = out.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
            writer.save(p.sink.path)
        finally:
            if windowed:
                state.unpersist()
        self.timings["sink_s"] = time.perf_counter() - t
        # Keyed: the sink was overwritten with one row per state key. Windowed: count the emitted windows.
        sink_rows = self.spark.read.format("delta").load(p.sink.path).count() if windowed else int(stats["keys"])

        # Rows aggregated: a record counts once per window it falls into.
        before_rows, before_state_rows = 0, 0
        if kind == "increment" and base is not None:
            before_rows = base.aggregated_rows
            base_state = self.spark.read.format("delta").load(base.state_path)
            before_state_rows = int(base_state.agg(F.sum(ROWS)).collect()[0][0] or 0)
        aggregated = before_rows + (rows_merged - before_state_rows) // logic.windows_per_record
        return self._write_manifest(
            manifest_id=manifest_id,
            kind=kind,
            base=base,
            source_version=source_version,
            max_us=max_us,
            state_path=state_path,
            state_rows=int(stats["keys"]),
            aggregated=aggregated,
            sink_rows=sink_rows,
            started=started,
        )

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
    ) -> manifest.HandoffManifest:
        """Appends the handoff manifest, last: after it, the live phase may start. ``right``: the right
        source's version and max event time (two-input operators)."""
        p = self.pipeline
        late, invalid = quarantine.backlog_counts(self.spark, p.locations.quarantine, p.name, source_version)
        handoff = manifest.HandoffManifest(
            manifest_id=manifest_id,
            pipeline=p.name,
            kind=kind,
            base_manifest_id=base.manifest_id if base is not None else None,
            fingerprint=p.fingerprint(),
            state_spec=json.dumps(p.state_spec(), sort_keys=True),
            state_schema_version=STATE_SCHEMA_VERSION,
            operator_version=OPERATOR_VERSION,
            source_path=p.source.path,
            source_version=source_version,
            backlog_max_event_time_us=max_us,
            final_watermark_us=None if max_us is None else max_us - p.delay_us,
            state_path=state_path,
            state_table_version=tables.version(self.spark, state_path),
            state_rows=state_rows,
            input_rows=aggregated + late + invalid,
            aggregated_rows=aggregated,
            late_rows=late,
            invalid_rows=invalid,
            sink_version=tables.version(self.spark, p.sink.path),
            sink_rows=sink_rows,
            right_source_version=right[0] if right else None,
            right_max_event_time_us=right[1] if right else None,
            backlog_seconds=time.perf_counter() - started,
            created_at_us=time.time_ns() // 1000,
        )
        manifest.write(self.spark, p.locations.manifests, handoff)
        self.timings["total_s"] = time.perf_counter() - started
        return handoff

    def _run_two_input(self, v: int, started: float) -> manifest.HandoffManifest:
        """The backlog of an interval join or co-group: both inputs tagged by their own versions, the
        operator's batch plan (:mod:`phases.two_input`), its output and the rows/windows still open."""
        p, spark = self.pipeline, self.spark
        right_source = DeltaTableSource(spark, p.right_source)
        v_right = right_source.head_version()
        left = tag_version_range(spark, p, self.source, (0, v), None, self.timings)
        right = tag_version_range(spark, p, right_source, (0, v_right), None, self.timings)
        logic = two_input_logic_for(p, left.prepared.schema, right.prepared.schema)
        right_q = right.quarantine.withColumn("reason", F.concat(F.lit(quarantine.RIGHT_INPUT_REASON), F.col("reason")))
        t = time.perf_counter()
        empty = not (left.has_quarantine or right.has_quarantine)
        quarantine.replace_backlog(
            spark, p.locations.quarantine, p.name, left.quarantine.unionByName(right_q), empty=empty
        )
        self.timings["quarantine_s"] = time.perf_counter() - t
        wm = [None if m is None else m - p.delay_us for m in (left.running_max_us, right.running_max_us)]
        out, state = logic.backlog(left.prepared, right.prepared, wm[0], wm[1])
        manifest_id = uuid.uuid4().hex
        state_path = str(PurePosixPath(p.locations.state_root) / manifest_id)
        t = time.perf_counter()
        try:
            state.write.format("delta").mode("errorifexists").save(state_path)
            self.timings["state_s"] = time.perf_counter() - t
            t = time.perf_counter()
            out.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(p.sink.path)
            self.timings["sink_s"] = time.perf_counter() - t
        finally:
            spark.catalog.clearCache()
        on_time = left.prepared.count() + right.prepared.count()
        return self._write_manifest(
            manifest_id=manifest_id,
            kind="full",
            base=None,
            source_version=v,
            max_us=left.running_max_us,
            state_path=state_path,
            state_rows=spark.read.format("delta").load(state_path).count(),
            aggregated=on_time,
            sink_rows=spark.read.format("delta").load(p.sink.path).count(),
            started=started,
            right=(v_right, right.running_max_us),
        )

    def _run_process(self, v: int, started: float) -> manifest.HandoffManifest:
        """The backlog of a process operator: one sorted pass (:mod:`phases.process_operator`) writes the
        per-key state (JSON + pending timers) and the output rows; then the manifest."""
        p, spark = self.pipeline, self.spark
        tagged = tag_version_range(spark, p, self.source, (0, v), None, self.timings)
        logic = ProcessLogic(spark, p, tagged.prepared.schema)
        final_wm = None if tagged.running_max_us is None else tagged.running_max_us - p.delay_us
        t = time.perf_counter()
        quarantine.replace_backlog(
            spark, p.locations.quarantine, p.name, tagged.quarantine, empty=not tagged.has_quarantine
        )
        self.timings["quarantine_s"] = time.perf_counter() - t
        manifest_id = uuid.uuid4().hex
        state_path = str(PurePosixPath(p.locations.state_root) / manifest_id)
        t = time.perf_counter()
        passed = logic.backlog_pass(tagged.prepared, final_wm).persist(StorageLevel.DISK_ONLY)
        try:
            logic.states(passed).write.format("delta").mode("errorifexists").save(state_path)
            self.timings["state_s"] = time.perf_counter() - t
            t = time.perf_counter()
            out = logic.outputs(passed)
            out.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(p.sink.path)
            self.timings["sink_s"] = time.perf_counter() - t
        finally:
            passed.unpersist()
        stats = (
            spark.read.format("delta")
            .load(state_path)
            .agg(F.count(F.lit(1)).alias("keys"), F.sum(PROCESS_ROWS).alias("rows"))
            .collect()[0]
        )
        return self._write_manifest(
            manifest_id=manifest_id,
            kind="full",
            base=None,
            source_version=v,
            max_us=tagged.running_max_us,
            state_path=state_path,
            state_rows=int(stats["keys"]),
            aggregated=int(stats["rows"] or 0),
            sink_rows=spark.read.format("delta").load(p.sink.path).count(),
            started=started,
        )


def sorted_backlog_input(spark: SparkSession, pipeline: Pipeline, on_time: DataFrame) -> DataFrame:
    """The backlog's input layout: hash-partitioned by key, sorted by key then event time."""
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    return on_time.repartition(partitions, *pipeline.key_columns).sortWithinPartitions(
        *pipeline.key_columns, pipeline.event_time
    )
