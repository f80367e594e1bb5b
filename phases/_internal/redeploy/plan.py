"""What a redeploy will do (:class:`RedeployPlan`, shown before anything runs) and what it did
(:class:`RedeployResult`), the steps it reports as it goes, and the checks a generation passes before its swap. The
redeploy itself: :mod:`phases._internal.redeploy.runner`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from phases._internal.definition import Pipeline
from phases._internal.definition.changes import DefinitionChanges, Way
from phases._internal.errors import ManifestError
from phases._internal.handoff import manifest
from phases._internal.placement import Placement
from phases._internal.sources.reader import open_inputs

# The steps a redeploy reports as it goes (``on_step``), in order; a redeploy that needs no swap reports only the
# first.
STEPS = ("planned", "backlog", "live caught up", "checked", "serving live stopped", "swapped")

# Why a redeploy asks the serving live phase to stop (its ``stopped_for``).
SWAPPED_REASON = "the sink is swapped to a redeployed definition"
AMENDED_REASON = (
    "a redeploy recorded a change that applies to records from now on (an amendment of the serving handoff); "
    "start the live phase again to take it up"
)

# A check of a generation before it is swapped in: given the session, the generation's placement and its handoff,
# the problems it found (empty: passed).
Check = Callable[[SparkSession, Placement, manifest.HandoffManifest], list[str]]


@dataclass(frozen=True)
class RedeployPlan:
    """What a redeploy will do, shown before anything runs."""

    pipeline: str
    serving: int  # the generation that serves now
    serving_manifest: str  # its newest handoff
    changes: DefinitionChanges  # the serving definition -> the new one
    target: int  # the generation that will serve after the swap (the serving one for the ways none and forward)
    reuse: bool  # the target generation has a handoff already (a rerun, or a rollback to a kept generation)
    rollback: bool = False  # the target generation served before: this redeploy swaps it back

    @property
    def way(self) -> Way:
        return self.changes.way

    def describe(self) -> str:
        head = f"pipeline {self.pipeline!r}: generation {self.serving} serves (handoff {self.serving_manifest})."
        if self.way == "backfill":
            how = (
                f"generation {self.target} served before and is kept: its live phase catches up from where it "
                "stopped serving, then it is swapped back in (a rollback)"
                if self.rollback
                else f"generation {self.target} is kept from before: its live phase catches up, then it is swapped in"
                if self.reuse
                else f"generation {self.target} is built beside it (backlog, catch-up, live), then swapped in"
            )
        elif self.way == "forward":
            how = "the change is recorded as an amendment of the serving handoff; restart the live phase to apply it"
        else:
            how = "nothing to redeploy"
        return "\n".join([head, self.changes.describe("serving", "new"), how])


@dataclass
class RedeployResult:
    """What a redeploy did. Times are wall-clock microseconds; ``timings`` seconds per step."""

    redeploy_id: str
    way: Way
    from_generation: int
    generation: int  # the generation that serves now
    swapped: bool
    manifest_id: str | None = None  # the handoff of the generation that serves (or, prepared, of the prepared one)
    prepared: int | None = None  # prepare(): the generation built and checked, not swapped in yet
    consumer_version: int | None = None  # the consumer-facing table's version made by the swap
    old_stopped_at_us: int | None = None  # the old live phase had stopped (its lease was the redeploy's)
    swapped_at_us: int | None = None  # the swap's commit was made
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def swap_gap_s(self) -> float | None:
        """From the old live phase's stop to the swap's commit: the part of the time with no fresh results that the
        redeploy itself takes (the new live phase's start on the consumer-facing table comes after)."""
        if self.old_stopped_at_us is None or self.swapped_at_us is None:
            return None
        return (self.swapped_at_us - self.old_stopped_at_us) / 1e6


def refuse_unreadable_sources(spark: SparkSession, where: Placement, serving: manifest.HandoffManifest | None) -> None:
    """Before anything runs: every input of the new definition must still hold what its backlog reads, from where the
    serving generation's backlog started (a Kafka topic whose retention deleted offsets since then is refused, naming
    the partitions and ranges: the new results would miss records the old ones hold)."""
    kinds = {i.label: i.spec.kind for i in where.definition.inputs}
    for label, reader in open_inputs(spark, where).items():
        position = serving.positions.get(label) if serving is not None else None
        if kinds[label] == "kafka" and position:
            reader.require_kept_from(  # pyright: ignore[reportAttributeAccessIssue]
                position,
                "a redeploy's backlog, from where the serving generation's backlog started,",
                "nothing was run and the serving generation goes on. Restore the missing records, or rebuild "
                "from the topic as it is now (stop the live phase, then BacklogRunner(spark, pipeline).run("
                "reset=True)), which gives up the records retention deleted",
            )
        reader.require_change_feed(reader.head_version())


def newest_manifest(spark: SparkSession, where: Placement) -> manifest.HandoffManifest | None:
    """The placed generation's newest handoff (None: none)."""
    try:
        return manifest.latest(spark, where.manifests, where.name)
    except ManifestError:
        return None


def spec_json(pipeline: Pipeline) -> str:
    """A definition's state spec as the redeploy log keeps it."""
    return json.dumps(pipeline.state_spec(), sort_keys=True)
