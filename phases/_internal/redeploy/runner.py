"""Redeploying a changed definition under a running pipeline's name, without taking its results down.

:class:`Redeploy` compares the definition with the one the serving generation runs
(:mod:`phases._internal.definition.changes`) and takes the way the differences need:

* **none**: nothing to rebuild;
* **forward** (``max_future``, ``min_event_time``): an amendment of the serving handoff is recorded in the redeploy
  log; the live phase, restarted with the new definition, goes on from its state;
* **backfill** (anything that shapes the state): a new generation (:mod:`phases._internal.deployment.generations`)
beside the one
  that serves, which keeps serving and keeps its live lease meanwhile:

  1. the new generation's backlog into its own state, sink and quarantine, up to the head now, then catch-up
     increments where its kind takes them;
  2. its live phase from its handoff, on its own sink, in rounds that process what is available, until what waits
     is at most ``max_lag`` or the rounds are used up;
  3. its checks: the handoff matches the definition, and the ``checks`` the caller gives (a Dagster job passes its
     blocking asset checks); a generation whose checks fail is never swapped in;
  4. the swap: the serving generation's live phase is asked to stop at a micro-batch boundary
     (:func:`phases._internal.coordination.leases.request_stop`), and the redeploy holds its live lease from then on. A
     ``swapping`` row goes into the redeploy log; the consumer-facing table is overwritten with the new generation's
     rows as its last catch-up round left them (one commit, :mod:`phases._internal.redeploy.swap`); a ``swapped`` row
     says the new generation serves.

  The caller then starts the live phase of the definition (``LiveRunner.from_manifest(spark, pipeline)`` binds it to
  the serving generation): it resumes from the generation's progress log on the consumer-facing table. Once its first
  micro-batch is recorded, the start keeps the table's version before the swap's commit as the old generation's own
  sink (:mod:`phases._internal.deployment.kept`); a redeploy, or the maintenance, makes that copy first when it is
  still missing.

**Rollback** is a redeploy of the previous definition: it finds that definition's generation still kept, skips its
backlog, and brings its live phase up from where it stopped serving, then swaps back.

**Crashes.** Until the ``swapping`` row the old generation serves and a rerun continues the new generation where its
backlog, increments and live progress stand. After it, every live start of the pipeline is refused until a rerun
finishes the swap: it makes the swap's commit unless the consumer-facing table already holds it, then writes the
``swapped`` row.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from pyspark.sql import SparkSession

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.coordination import leases
from phases._internal.definition import Pipeline
from phases._internal.definition.changes import DefinitionChanges
from phases._internal.deployment import generations
from phases._internal.deployment.kept import keep_previous
from phases._internal.errors import LeaseHeld, ManifestError, PhaseStateError
from phases._internal.handoff import manifest
from phases._internal.handoff.live_folders import live_started
from phases._internal.live.runner import LiveRunner
from phases._internal.placement import Placement
from phases._internal.redeploy import swap
from phases._internal.redeploy.plan import (
    AMENDED_REASON,
    SWAPPED_REASON,
    Check,
    RedeployPlan,
    RedeployResult,
    newest_manifest,
    refuse_unreadable_sources,
    spec_json,
)

log = logging.getLogger(__name__)


class Redeploy:
    """Redeploys ``pipeline`` (the changed definition, under the running pipeline's name and locations)."""

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        *,
        checks: list[Check] | None = None,
        max_lag: int = 1,
        live_rounds: int = 5,
        stop_timeout_s: float = 600.0,
        take_over: bool = False,
        on_step: Callable[[str, dict], None] | None = None,
    ):
        """``checks``: more checks the new generation must pass before the swap. ``max_lag``: the new generation's
        live phase is caught up when at most this many source versions (records, for Kafka) wait after a round.
        ``stop_timeout_s``: how long to wait for the serving live phase to stop. ``take_over``: take leases over
        from holders whose process is gone (a redeploy or live phase that was killed). ``on_step(step, detail)``
        is called after each step (:data:`STEPS`), for progress reports."""
        self._start(spark, Placement(pipeline), checks, max_lag, live_rounds, stop_timeout_s, take_over, on_step)

    @classmethod
    def at(
        cls,
        spark: SparkSession,
        where: Placement,
        *,
        checks: list[Check] | None = None,
        max_lag: int = 1,
        live_rounds: int = 5,
        stop_timeout_s: float = 600.0,
        take_over: bool = False,
        on_step: Callable[[str, dict], None] | None = None,
    ) -> Redeploy:
        """The redeploy of ``where.definition`` where ``where`` places it (a storage root, the environment's brokers;
        its generation is the redeploy's to choose). The other arguments: as for the constructor."""
        redeploy = cls.__new__(cls)
        redeploy._start(spark, where, checks, max_lag, live_rounds, stop_timeout_s, take_over, on_step)
        return redeploy

    def _start(
        self,
        spark: SparkSession,
        where: Placement,
        checks: list[Check] | None,
        max_lag: int,
        live_rounds: int,
        stop_timeout_s: float,
        take_over: bool,
        on_step: Callable[[str, dict], None] | None,
    ) -> None:
        self.spark = spark
        self.placement = where.at(0, serving=True)  # generation 0's place: it holds the log and the redeploy lease
        self.pipeline = where.definition  # as declared
        self.checks = list(checks or [])
        self.max_lag = max_lag
        self.live_rounds = live_rounds
        self.stop_timeout_s = stop_timeout_s
        self.take_over = take_over
        self.holder = f"redeploy {uuid.uuid4().hex[:12]}"
        self._serving_lease: leases.Lease | None = None
        self.on_step = on_step

    def _done(self, step: str, **detail) -> None:
        log.info("redeploy of %r: %s %s", self.pipeline.name, step, detail or "")
        if self.on_step is not None:
            self.on_step(step, detail)

    def as_generation(self, n: int, *, serving: bool = False) -> Placement:
        """Generation ``n`` of this definition: its tables under the generation's folder, writing its own sink (the
        consumer-facing table when ``serving``). What a caller checks of a generation a redeploy builds."""
        return self.placement.at(n, serving=serving)

    # --- the plan ----------------------------------------------------------------------------------
    def _newest_manifest(self, n: int) -> manifest.HandoffManifest | None:
        return newest_manifest(self.spark, self.placement.at(n, serving=True))

    def plan(self, gens: generations.Generations | None = None) -> RedeployPlan:
        """The differences between the serving definition and this one, and the way they need. Raises
        ManifestError when the serving generation has no handoff (run its backlog first)."""
        gens = gens if gens is not None else generations.read(self.spark, self.placement)
        serving = gens.serving
        handoff = self._newest_manifest(serving)
        if handoff is None:
            raise ManifestError(
                f"pipeline {self.pipeline.name!r}: its serving generation {serving} has no handoff manifest, so there "
                "is nothing running to redeploy beside; run its backlog (BacklogRunner(spark, pipeline).run())"
            )
        spec = handoff.state_spec
        for row in gens.rows:  # the newest amendment of the serving handoff is what serves
            if row.kind == "amended" and row.manifest_id == handoff.manifest_id and row.state_spec:
                spec = row.state_spec
        changes = DefinitionChanges.between(spec, self.pipeline.state_spec())
        target, reuse = serving, False
        if changes.way == "backfill":
            # A kept generation of this definition (a rollback, or a rerun after a crash) is taken up where it is.
            kept = [
                n
                for n in gens.retained()
                if n != serving and self.placement.is_fingerprint(self._fingerprint_of(gens, n))
            ]
            target = max(kept) if kept else max(gens.numbers) + 1
            reuse = bool(kept) and self._newest_manifest(target) is not None
        rollback = changes.way == "backfill" and gens.served(target)
        return RedeployPlan(self.pipeline.name, serving, handoff.manifest_id, changes, target, reuse, rollback)

    def _fingerprint_of(self, gens: generations.Generations, n: int) -> str | None:
        if n in gens.fingerprints:
            return gens.fingerprints[n]
        handoff = self._newest_manifest(n)
        return handoff.fingerprint if handoff is not None else None

    # --- the run -----------------------------------------------------------------------------------
    def prepare(self, reason: str = "") -> RedeployResult:
        """Everything before the serving generation is touched: the plan, then for a backfill the new generation's
        backlog, catch-up and checks (``prepared`` in the result). Raises PhaseStateError when its checks fail."""
        return self._run(reason, swap=False)

    def run(self, reason: str = "") -> RedeployResult:
        """The whole redeploy (module docstring) under the pipeline's redeploy lease; ``reason`` goes into the log. A
        forward change is recorded and the serving live phase stopped, for its restart to take the change up."""
        return self._run(reason, swap=True)

    def _run(self, reason: str, *, swap: bool) -> RedeployResult:
        with leases.hold(self.spark, self.placement, "redeploy", self.holder, take_over=self.take_over):
            gens = self._log_caught_up_with_the_table(generations.read(self.spark, self.placement))
            if gens.swap_under_way is not None:
                if not swap:
                    step = gens.swap_under_way
                    raise PhaseStateError(
                        f"pipeline {self.pipeline.name!r}: the swap to generation {step.generation} of redeploy "
                        f"{step.redeploy_id} is under way; run the redeploy to finish it"
                    )
                return self._finish_swap(gens.swap_under_way, reason)
            # The previous swap's old results, if the new live phase has not kept them yet: a rollback swaps them back.
            kept = keep_previous(self.spark, self.placement, self.holder, gens)
            if kept is not None:
                self._done("kept", generation=kept.generation, seconds=round(kept.seconds, 2))
            plan = self.plan(gens)
            self._done("planned", way=plan.way, serving=plan.serving, target=plan.target, diff=plan.describe())
            redeploy_id = uuid.uuid4().hex
            if plan.way == "none":
                return RedeployResult(redeploy_id, "none", plan.serving, plan.serving, False, plan.serving_manifest)
            if plan.way == "forward":
                if not swap:
                    return RedeployResult(
                        redeploy_id, "forward", plan.serving, plan.serving, False, plan.serving_manifest
                    )
                return self._amend(plan, redeploy_id, reason)
            return self._backfill_and_swap(gens, plan, redeploy_id, reason, swap=swap)

    def _log_caught_up_with_the_table(self, gens: generations.Generations) -> generations.Generations:
        """The redeploy log, with a swap the consumer-facing table holds but the log does not record (its newest
        commits removed, or restored from an older backup) recorded again as under way, from the swap's mark: the
        swap is then finished from the table's history (:meth:`_finish_swap`), which copies nothing."""
        found = generations.unrecorded_swap(self.spark, self.placement, gens)
        if found is None:
            return gens
        under_way = gens.swap_under_way
        log.warning(
            "redeploy of %r: the redeploy log %s does not record the swap of redeploy %s to generation %s that the "
            "table %s holds at version %s: recording it from the table's history",
            self.pipeline.name,
            self.placement.redeploy_log,
            found.redeploy_id,
            found.generation,
            self.placement.consumer_sink,
            found.version,
        )
        if under_way is not None and under_way.redeploy_id == found.redeploy_id:
            return gens
        manifest_id = found.manifest_id
        if manifest_id is None:
            handoff = self._newest_manifest(found.generation)
            manifest_id = handoff.manifest_id if handoff is not None else None
        generations.write(
            self.spark,
            self.placement,
            "swapping",
            found.generation,
            found.redeploy_id,
            from_generation=found.from_generation,
            manifest_id=manifest_id,
            reason="recorded again from the sink's history (the redeploy log was behind it)",
        )
        return generations.read(self.spark, self.placement)

    def _amend(self, plan: RedeployPlan, redeploy_id: str, reason: str) -> RedeployResult:
        generations.write(
            self.spark,
            self.placement,
            "amended",
            plan.serving,
            redeploy_id,
            fingerprint=self.pipeline.fingerprint(),
            state_spec=spec_json(self.pipeline),
            manifest_id=plan.serving_manifest,
            reason=reason or None,
            detail=plan.changes.describe("serving", "new"),
        )
        # Its restart takes the amended definition up.
        stopped_at = self.stop_serving_live(plan.serving, reason=AMENDED_REASON)
        return RedeployResult(
            redeploy_id,
            "forward",
            plan.serving,
            plan.serving,
            False,
            plan.serving_manifest,
            old_stopped_at_us=stopped_at,
        )

    def _backfill_and_swap(
        self, gens: generations.Generations, plan: RedeployPlan, redeploy_id: str, reason: str, *, swap: bool
    ) -> RedeployResult:
        n, timings = plan.target, {}
        new = self.placement.at(n, serving=False, redeploys=gens)
        if not plan.reuse:
            refuse_unreadable_sources(self.spark, self.placement, self._newest_manifest(plan.serving))
            if n not in gens.fingerprints or not self.placement.is_fingerprint(gens.fingerprints[n]):
                generations.write(
                    self.spark,
                    self.placement,
                    "started",
                    n,
                    redeploy_id,
                    from_generation=plan.serving,
                    fingerprint=self.pipeline.fingerprint(),
                    state_spec=spec_json(self.pipeline),
                    reason=reason or None,
                    detail=plan.changes.describe("serving", "new"),
                )
        handoff = self._backfill(new, timings)
        self._done("backlog", generation=n, manifest_id=handoff.manifest_id, source_version=handoff.source_version)
        self._catch_up_live(new, handoff, timings)
        self._done("live caught up", generation=n, rounds=int(timings.get("live_rounds", 0)))
        self._check(new, handoff)
        self._done("checked", generation=n)
        if not swap:
            return RedeployResult(
                redeploy_id,
                "backfill",
                plan.serving,
                plan.serving,
                False,
                handoff.manifest_id,
                prepared=n,
                timings=timings,
            )
        return self._swap(plan.serving, n, handoff.manifest_id, redeploy_id, reason, timings)

    def _backfill(self, new: Placement, timings: dict[str, float]) -> manifest.HandoffManifest:
        """The new generation's handoff: its backlog (unless a handoff of this definition is there), then catch-up
        increments up to the head where its kind takes them (until its live phase has started)."""
        handoff = newest_manifest(self.spark, new)
        if handoff is not None and not new.is_fingerprint(handoff.fingerprint):
            handoff = None  # an earlier redeploy's definition under this number: start it over
        started = live_started(self.spark, new, handoff.manifest_id) if handoff is not None else False
        t = time.perf_counter()
        runner = BacklogRunner.at(self.spark, new, take_over=self.take_over)
        if handoff is None:
            handoff = runner.run()
            timings["backlog_s"] = time.perf_counter() - t
        elif not started and new.definition.supports_increments:
            handoff = runner.run_increment()
            timings["increment_s"] = time.perf_counter() - t
        return handoff

    def _catch_up_live(self, new: Placement, handoff: manifest.HandoffManifest, timings: dict[str, float]) -> None:
        """Rounds of the new generation's live phase on its own sink, each processing what is available, until what
        waits of each input after a round is at most ``max_lag`` (or ``live_rounds`` rounds ran)."""
        t = time.perf_counter()
        for round_ in range(1, self.live_rounds + 1):
            runner = LiveRunner.at(self.spark, new, handoff.manifest_id, take_over=self.take_over)
            runner.start(available_now=True)
            behind = [lag.behind for lag in runner.lags()]
            timings["live_rounds"] = float(round_)
            if all(b is not None and b <= self.max_lag for b in behind):
                break
        timings["live_catch_up_s"] = time.perf_counter() - t

    def _check(self, new: Placement, handoff: manifest.HandoffManifest) -> None:
        problems: list[str] = []
        try:
            manifest.check_matches(self.spark, handoff, new, new.redeploys.amended)
        except ManifestError as exc:
            problems.append(str(exc))
        problems += swap.topic_schema_problems(self.spark, new)
        for check in self.checks:
            problems += check(self.spark, new, handoff)
        if problems:
            raise PhaseStateError(
                f"pipeline {self.pipeline.name!r}: generation {new.generation} failed its checks and is not "
                "swapped in; the serving generation goes on. " + "; ".join(problems)
            )

    # --- the swap ----------------------------------------------------------------------------------
    def _swap(
        self, old: int, new: int, manifest_id: str, redeploy_id: str, reason: str, timings: dict[str, float]
    ) -> RedeployResult:
        stopped_at = self._stop_serving_live(old)
        self._done("serving live stopped", generation=old)
        try:
            step = generations.write(
                self.spark,
                self.placement,
                "swapping",
                new,
                redeploy_id,
                from_generation=old,
                manifest_id=manifest_id,
                reason=reason or None,
            )
            return self._make_swap(step, reason, timings, stopped_at)
        finally:
            self._release_serving_lease()

    def _finish_swap(self, step: generations.LogRow, reason: str) -> RedeployResult:
        """A rerun after a crash past the ``swapping`` row: the swap is made (again) unless its commit is there."""
        what = (self.pipeline.name, step.from_generation, step.generation, step.redeploy_id)
        log.warning("redeploy of %r: finishing the swap from generation %s to %s of redeploy %s", *what)
        assert step.from_generation is not None, "a swapping row names the generation it swaps from"
        stopped_at = self._stop_serving_live(step.from_generation)
        try:
            return self._make_swap(step, reason, {}, stopped_at)
        finally:
            self._release_serving_lease()

    def _make_swap(
        self, step: generations.LogRow, reason: str, timings: dict[str, float], stopped_at: int
    ) -> RedeployResult:
        assert step.from_generation is not None, "a swapping row names the generation it swaps from"
        old, new, spark = step.from_generation, step.generation, self.spark
        target = self.placement.at(new, serving=False)
        consumer = self.placement.consumer_sink
        mark = {
            "redeploy": step.redeploy_id,
            "generation": new,
            "from_generation": old,
            "manifest_id": step.manifest_id,
        }
        # Looked for down the table's history, not on its newest commit: the new live phase may have written after it.
        made = generations.newest_swap(spark, consumer, redeploy_id=step.redeploy_id)
        if made is None:
            # The new generation's own sink as its last catch-up round left it (its live phase is stopped: the sink
            # matches its progress log). What arrived since, its live phase applies first thing on the
            # consumer-facing table: one query start in the time without fresh results, not two.
            t = time.perf_counter()
            swap.copy_sink(spark, target.sink_path, consumer, swap=mark)
            timings["swap_commit_s"] = time.perf_counter() - t
            # The copy's own commit (an auto compaction may commit after it).
            made = generations.newest_swap(spark, consumer, redeploy_id=step.redeploy_id)
        version = made.version
        swapped_at = time.time_ns() // 1000
        # The old generation's results, for a rollback (the table at version - 1: nothing wrote it between the serving
        # live phase's stop and the commit), are copied after the new live phase's start, outside the time without
        # fresh results (phases._internal.deployment.kept); a rollback makes the copy first if it is still missing.
        t = time.perf_counter()  # a topic sink: the swap in its one topic, before the row that says it is made
        swap.publish_to_topic(spark, self.placement, step, version)
        timings["topic_swap_s"] = time.perf_counter() - t
        generations.write(
            spark,
            self.placement,
            "swapped",
            new,
            step.redeploy_id,
            from_generation=old,
            manifest_id=step.manifest_id,
            consumer_version=version,
            reason=reason or step.reason,
        )
        leases.clear_stop_request(spark, self.placement.at(old, serving=True), "live")
        self._done("swapped", generation=new, from_generation=old)
        return RedeployResult(
            step.redeploy_id,
            "backfill",
            old,
            new,
            True,
            step.manifest_id,
            consumer_version=version,
            old_stopped_at_us=stopped_at,
            swapped_at_us=swapped_at,
            timings=timings,
        )

    # --- the serving live phase ----------------------------------------------------------------------
    def stop_serving_live(self, generation: int | None = None, *, reason: str = SWAPPED_REASON) -> int:
        """Stops the serving generation's live phase (if one runs) for a restart of the deployed definition: asks it
        to stop at a micro-batch boundary, waits for its lease, and frees the lease again. Returns when it had
        stopped (µs)."""
        n = generation if generation is not None else generations.read(self.spark, self.placement).serving
        try:
            return self._stop_serving_live(n, reason)
        finally:
            self._release_serving_lease()
            leases.clear_stop_request(self.spark, self.placement.at(n, serving=True), "live")

    def _stop_serving_live(self, old: int, reason: str = SWAPPED_REASON) -> int:
        """Asks the serving generation's live phase to stop and takes its live lease as soon as it is free, so that
        nothing writes the consumer-facing table until the swap is made. Returns when it had stopped (µs)."""
        serving = self.placement.at(old, serving=True)
        held = leases.holder(self.spark, serving, "live")
        if held is not None and held[1]:
            leases.request_stop(self.spark, serving, "live", self.holder, reason)
        deadline = time.monotonic() + self.stop_timeout_s
        while True:
            try:
                self._serving_lease = leases.acquire(self.spark, serving, "live", self.holder, take_over=self.take_over)
                return time.time_ns() // 1000
            except LeaseHeld as exc:
                if time.monotonic() >= deadline:
                    raise PhaseStateError(
                        f"pipeline {self.pipeline.name!r}: its serving live phase (generation {old}) did not stop "
                        f"within {self.stop_timeout_s:g} s of the redeploy's request ({exc}). Nothing was swapped; "
                        "the serving generation goes on. Stop it (terminate its run), then run the redeploy again."
                    ) from exc
                time.sleep(0.2)

    def _release_serving_lease(self) -> None:
        lease, self._serving_lease = self._serving_lease, None
        if lease is not None:
            leases.release(self.spark, lease)
