"""Catch-up increments of the kinds whose state is not a mergeable aggregate: process functions, interval joins and
co-groups (an aggregation's increment merges pieces instead,
:meth:`phases._internal.backlog.runner.BacklogRunner.run_increment`).

Such a state can still move on from a version range: the live phase does exactly that, one micro-batch at a time, in
the run's state store (:class:`phases._internal.operators.base.StoreStep`). An increment of handoff B over versions
V+1..v (of each input) is that step over the whole range, as *one* micro-batch, followed by a new handoff:

1. **the intent**: ``<root>/increments/<B>.json`` records the new manifest's id and each input's end version, once
   (put-if-absent). A rerun after a crash finds it and continues with the same id and range, so every write below
   is the same again;
2. each input's new versions tagged by its W(v), continuing from B's running maximum (so the range tags exactly the
   records the live phase or one streaming job would); their quarantine rows replace the backlog rows of that range;
3. the kind's live step over the range: version 1 of the new manifest's state store is B's state, the step commits
   version 2 and appends what the range emitted (pairs, timers' and windows' outputs) to the sink, marked with the
   increment's own write id: a rerun's append is skipped;
4. the state table of the new manifest (store version 2's rows), then the manifest, which names the store position
   its live phase starts from (``state_store_layout``/``state_store_version``).

One micro-batch over many versions equals the live phase over them in any split (the live phase's invariant), and the
live phase from B equals one streaming job: so B plus the increment equals the one-pass backlog over 0..v.

Until the manifest is written, a live phase from B is refused
(:func:`phases._internal.handoff.intents.refuse_open`): the sink may already hold the increment's rows, which the live
phase would append again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import DataFrame, SparkSession

from phases._internal.definition import SOURCE_LABEL
from phases._internal.handoff.intents import Intent, write_run_name
from phases._internal.handoff.manifest import HandoffManifest
from phases._internal.lateness import watermark_after
from phases._internal.operators.base import HandoffCounts, OperatorKind, table_counts
from phases._internal.placement import Placement
from phases._internal.sources.reader import SourceReader
from phases._internal.state.keyed_store import StatePosition
from phases._internal.storage import quarantine
from phases._internal.storage.live_writes import BatchWrites
from phases._internal.tagging import TaggedRange, tag_version_range


class StepHandoff:
    """The handoff of an increment run through the live step: the state table from the store's version after the
    step; the store itself is the live phase's start (the manifest names its position) and the sink is written."""

    def __init__(
        self,
        spark: SparkSession,
        step,
        position: StatePosition,
        columns: list[str],
        base: HandoffManifest,
        taken: int,
        watermarks: dict[str, int | None],
    ):
        self.spark, self.step, self.position, self.columns = spark, step, position, columns
        self.base, self.taken, self.watermarks = base, taken, watermarks

    def write_state(self, path: str) -> None:
        rows = self.step.settled(self.step.store(self.spark).store.read(self.position.version), self.watermarks)
        # A rerun after a crash may find the table it wrote: this increment's table, replaced whole.
        rows.select(*self.columns).write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)

    def write_live_state(self, store_root: str) -> None:
        """Nothing: the store under ``store_root`` holds the state already, at the position the manifest names."""

    def write_sink(self, path: str) -> None:
        """Nothing: the step appended the range's output."""

    def counts(self, spark: SparkSession, state_path: str, sink_path: str) -> HandoffCounts:
        state = table_counts(spark, state_path)
        sink = table_counts(spark, sink_path)
        return HandoffCounts(int(state["rows"]), self.base.aggregated_rows + self.taken, int(sink["rows"]))

    def close(self) -> None:
        self.step.release()


@dataclass(frozen=True)
class StepRange:
    """What an increment through the live step did, for its manifest."""

    write: StepHandoff
    maxima: dict[str, int | None]  # each input's running max event time after the range


def run_through_step(
    spark: SparkSession,
    where: Placement,
    kind: OperatorKind,
    logic,
    readers: dict[str, SourceReader],
    base: HandoffManifest,
    intent: Intent,
    timings: dict[str, float],
) -> StepRange:
    """Steps 2 and 3 of the module's increment: the inputs' ranges tagged and quarantined, then the kind's live step
    over them as one micro-batch, from the base's state to the new manifest's store."""
    pipeline = where.definition
    los = {SOURCE_LABEL: base.source_version + 1}
    prior = {SOURCE_LABEL: base.backlog_max_event_time_us}
    if pipeline.inputs.two:
        right = pipeline.inputs.right.label
        los[right] = (base.right_source_version if base.right_source_version is not None else -1) + 1
        prior[right] = base.right_max_event_time_us
    records: dict[str, DataFrame | None] = {}
    maxima: dict[str, int | None] = {}
    taken = 0
    persisted: list[DataFrame] = []
    try:
        for inp in pipeline.inputs:
            lo, hi = los[inp.label], intent.ends[inp.label]
            if hi < lo:
                records[inp.label], maxima[inp.label] = None, prior[inp.label]
                continue
            tagged: TaggedRange = tag_version_range(
                spark, where, readers[inp.label], (lo, hi), prior[inp.label], timings, per_record_watermarks=True
            )
            rows = quarantine.of_input(tagged.quarantine, inp.label) if inp.label else tagged.quarantine
            quarantine.replace_backlog(
                spark,
                where.quarantine,
                pipeline.name,
                rows,
                (lo, hi),
                empty=not tagged.has_quarantine,
                right_input=bool(inp.label) if pipeline.inputs.two else None,
            )
            maxima[inp.label] = tagged.running_max_us
            if tagged.has_on_time:
                prepared = tagged.prepared.persist()
                persisted.append(prepared)
                taken += prepared.count()
                records[inp.label] = prepared
            else:
                records[inp.label] = None
        t = time.perf_counter()
        watermarks = {label: watermark_after(m, pipeline.delay_us) for label, m in maxima.items()}
        closing = kind.closing(watermarks)
        store_root = where.state_store(intent.manifest_id)
        step = kind.live_step(logic, base.state_path, where.sink_path, store_root)
        writes = BatchWrites(spark, pipeline.name, write_run_name(intent.manifest_id), 0, first=True)
        position = step.apply_inputs(spark, records, watermarks, closing, writes, state=None)
        if position is None:  # nothing to do: the state is still the base's, as version 1 of the new store
            version = step.start_version(spark, None)  # pyright: ignore[reportAttributeAccessIssue]
            position = StatePosition(step.store(spark).layout, version)  # pyright: ignore[reportAttributeAccessIssue]
        timings["step_s"] = time.perf_counter() - t
    finally:
        for df in persisted:
            df.unpersist()
    columns = [f.name for f in kind.state_schema(logic).fields]
    return StepRange(StepHandoff(spark, step, position, columns, base, taken, watermarks), maxima)


def increment_ends(commit_times, end_version: int, interval: timedelta) -> list[int]:
    """The last version of each increment of a backlog over 0..``end_version`` when
    ``checkpoint_interval_during_backlog`` > 0 (``interval``): greedy from version 0 over the source's ``(version,
    commit time)`` pairs, an increment takes the versions committed less than the interval after its first one.
    Appends never move an earlier boundary."""
    ends: list[int] = []
    first_at, previous = None, None
    for version, at in commit_times:
        if version > end_version:
            break
        if first_at is None:
            first_at = at
        elif at - first_at >= interval:
            ends.append(previous)  # pyright: ignore[reportArgumentType]
            first_at = at
        previous = version
    if not ends or ends[-1] != end_version:
        ends.append(end_version)
    return ends
