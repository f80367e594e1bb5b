"""The live phase's health sensor: the sink's freshness, the sources' heads, and relaunching a dead live run.

Each tick, without Spark:

* **Source observations.** Each input whose head moved (Delta version, Kafka end offsets) gets an observation
  (:mod:`phases_dagster.source`).
* **The live phase's state.** The ``live_phase_running`` check of the live asset says whether a live run runs:
  it passes while one does, fails with severity WARN while the live phase is stopped (terminated, or ended by
  ``max_runtime_seconds``) and with severity ERROR once its run failed or its process was lost. Every run that
  runs the live phase counts: the live job's, and a run of the live asset launched from its page or by
  "Materialize all" (each carries the :data:`LIVE_RUN_TAG`).
* **Freshness.** The ``sink_fresh`` check of the sink asset is evaluated from the source's head and the live
  phase's own progress log (what it applied): the sink is fresh when nothing waits, or when the oldest source
  data not applied was committed at most ``max_lag`` ago while the live phase runs. With the live phase down and
  data waiting it fails at once, saying whether the phase was stopped or lost.

Both checks are reported when their verdict differs from the latest evaluation the instance holds (whoever made
it), and ``sink_fresh`` at least every minute so that its lag stays current; the cursor holds no clock.
* **Relaunch.** A live run that failed (an error, or its process lost: run monitoring marks it failed) is
  relaunched from its checkpoint with ``take_over_dead_lease``, after a backoff that doubles per consecutive
  failure, at most ``max_relaunches`` times. An engine error that repeats (a schema the pipeline cannot take, a
  lease held by a live process, a bad definition) stops the relaunching at once: each reason is the tick's
  message. A run stopped on purpose (terminated, ``max_runtime_seconds``) is not relaunched.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg

from phases import LiveQueryStopped, PhasesError, Pipeline, Placement, inspect
from phases_dagster import source as source_assets
from phases_dagster.handoff_events import Handoff, serving_handoff
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import LiveHealth, Names, Orchestration, WhenLiveDown

RUNNING_STATUSES = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING", "MANAGED"}
REPORT_AT_LEAST_EVERY = timedelta(seconds=60)
# Carried by every run that runs a pipeline's live phase (value: the pipeline's name): the live job sets it, and the
# live asset adds it to any other run it runs in (its own "Materialize", "Materialize all").
LIVE_RUN_TAG = "phases/live"
RUN_WORKER_LOST = "RunWorkerLost"


def _engine_errors() -> set[str]:
    """Names of the engine's exception classes that are deterministic: the same cause fails the same way."""
    out, todo = set(), [PhasesError]
    while todo:
        cls = todo.pop()
        out.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return out - {LiveQueryStopped.__name__}  # the query's own failure may be transient: retried to the cap


@dataclass(frozen=True)
class LiveRunRecord:
    run_id: str
    status: str  # DagsterRunStatus value
    ended_at: datetime | None
    failure: str | None  # "ErrorClass: first line" of a failed run


@dataclass(frozen=True)
class RelaunchDecision:
    action: str  # none | wait | relaunch | give_up
    reason: str
    attempt: int = 0


def decide_relaunch(runs: list[LiveRunRecord], policy: LiveHealth, now: datetime) -> RelaunchDecision:
    """What to do about the live phase of one handoff, given its runs (newest first). A pure function."""
    if not runs:
        return RelaunchDecision("none", "no live run yet")
    latest = runs[0]
    alive = next((run for run in runs if run.status in RUNNING_STATUSES), None)
    if alive is not None:  # a second start refused by the lease of a live run that still runs: nothing to do
        return RelaunchDecision("none", f"live run {alive.run_id} is {alive.status.lower()}")
    if latest.status != "FAILURE":
        return RelaunchDecision(
            "none", f"live run {latest.run_id} was stopped ({latest.status.lower()}); not relaunched"
        )
    failures = []
    for run in runs:
        if run.status != "FAILURE":
            break
        failures.append(run)
    n, error = len(failures), latest.failure or "unknown error"
    if not policy.relaunch:
        return RelaunchDecision("give_up", f"live run {latest.run_id} failed ({error}); relaunching is off")
    if n >= 2 and failures[0].failure == failures[1].failure and error.split(":")[0] in _engine_errors():
        return RelaunchDecision(
            "give_up",
            f"live run {latest.run_id} failed with the same error as the run before it ({error}): a relaunch would "
            "fail again; not relaunching. Fix the cause, then launch the live job",
        )
    if n > policy.max_relaunches:
        return RelaunchDecision(
            "give_up",
            f"the live phase failed {n} times in a row (last: {error}); max_relaunches={policy.max_relaunches} "
            "reached, not relaunching",
        )
    wait = min(policy.backoff_seconds * 2 ** (n - 1), policy.max_backoff_seconds)
    ended = latest.ended_at or now
    left = wait - (now - ended).total_seconds()
    if left > 0:
        return RelaunchDecision("wait", f"live run {latest.run_id} failed ({error}); relaunch {n} in {left:.0f} s", n)
    return RelaunchDecision(
        "relaunch",
        f"live run {latest.run_id} failed ({error}); relaunch {n} of at most "
        f"{policy.max_relaunches} from its checkpoint",
        n,
    )


def failure_of(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """'ErrorClass: first line' of a failed run: its step failure's user error, else the run failure's message."""
    step = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    for record in reversed(step):
        error = record.dagster_event.step_failure_data.error
        while error is not None and error.cls_name in {"DagsterExecutionStepExecutionError"} and error.cause:
            error = error.cause
        if error is not None:
            first = (error.message or "").strip().splitlines()
            text = first[0] if first else ""
            return f"{error.cls_name}: {text.removeprefix(error.cls_name + ': ')}"[:300]
    # A run worker that was killed leaves no step failure: its code server reports the process's exit instead.
    engine = instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
    for record in reversed(engine):
        if "exit code" in (record.message or "") or "unexpectedly" in (record.message or ""):
            return f"RunWorkerLost: {record.message.splitlines()[0]}"[:300]
    run = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    if run:
        return f"RunFailure: {(run[-1].message or 'run failed').splitlines()[0]}"[:300]
    return None


def live_runs(
    instance: dg.DagsterInstance, pipeline_name: str, manifest_id: str, limit: int = 25
) -> list[LiveRunRecord]:
    """The runs of the pipeline's live phase for ``manifest_id`` (and runs launched without that tag), newest first:
    every run tagged :data:`LIVE_RUN_TAG`, whatever its job."""
    records = instance.get_run_records(dg.RunsFilter(tags={LIVE_RUN_TAG: pipeline_name}), limit=limit)
    out = []
    for rec in records:
        tag = rec.dagster_run.tags.get("phases/manifest_id")
        if tag not in (None, manifest_id):
            continue
        status = rec.dagster_run.status.value
        ended = rec.end_time
        out.append(
            LiveRunRecord(
                rec.dagster_run.run_id,
                status,
                datetime.fromtimestamp(ended, tz=UTC) if ended else None,
                failure_of(instance, rec.dagster_run.run_id) if status == "FAILURE" else None,
            )
        )
    return out


@dataclass(frozen=True)
class LiveStatus:
    """What the live phase of a handoff is doing, from its runs: ``state`` is ``not started``, ``running``,
    ``stopped`` (terminated or ended on purpose), ``failed`` (its step raised) or ``lost`` (its process died
    without a word: killed, out of memory, machine lost)."""

    state: str
    run_id: str | None = None
    detail: str = ""

    @property
    def down(self) -> bool:
        return self.state in DOWN


DOWN = ("stopped", "failed", "lost")  # live states in which nothing applies new source data


def live_status(runs: list[LiveRunRecord]) -> LiveStatus:
    """The live phase's state from its runs (newest first)."""
    if not runs:
        return LiveStatus("not started", None, "no live run yet")
    alive = next((run for run in runs if run.status in RUNNING_STATUSES), None)
    if alive is not None:
        return LiveStatus("running", alive.run_id, f"live run {alive.run_id} is {alive.status.lower()}")
    latest = runs[0]
    if latest.status != "FAILURE":
        return LiveStatus("stopped", latest.run_id, f"live run {latest.run_id} ended {latest.status.lower()}")
    failure = latest.failure or "unknown error"
    # No step failure: the run's process died without saying why (its worker was killed or lost).
    lost = failure.startswith((RUN_WORKER_LOST, "RunFailure"))
    return LiveStatus("lost" if lost else "failed", latest.run_id, f"live run {latest.run_id} failed ({failure})")


def live_state_of(runs: list[LiveRunRecord]) -> str:
    return live_status(runs).state


@dataclass(frozen=True)
class Verdict:
    """One evaluation of a check, as the health sensor reports it and the check's own function returns it."""

    passed: bool
    description: str
    metadata: dict
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR


def live_running_verdict(status: LiveStatus, live_job: str, decision: str | None = None) -> Verdict:
    """``live_phase_running`` on the live asset: passes while a live run runs; WARN while the live phase is
    stopped; ERROR once it failed or was lost (``decision``: what the health sensor does about it)."""
    meta: dict = {"live_state": status.state, "run_id": status.run_id or "none"}
    if status.state == "running":
        return Verdict(True, f"running: {status.detail}", meta)
    if status.state == "not started":
        return Verdict(
            False,
            "not started: the switch sensor launches the live phase once the backlog's handoff is valid and caught up",
            meta,
            dg.AssetCheckSeverity.WARN,
        )
    resume = f"launch {live_job} (or Materialize this asset) to resume from its checkpoint"
    if status.state == "stopped":
        return Verdict(
            False,
            f"stopped: {status.detail}; nothing applies new source data. To resume, {resume}",
            meta,
            dg.AssetCheckSeverity.WARN,
        )
    what = (
        "its process died without a word (killed, out of memory, machine lost)"
        if status.state == "lost"
        else "its step raised an error"
    )
    then = decision if decision else f"{status.detail}; {resume}"
    return Verdict(False, f"{status.state}: {what}. {then}", meta, dg.AssetCheckSeverity.ERROR)


def sink_freshness(
    where: Placement,
    handoff: Handoff,
    max_lag: timedelta,
    live_state: str,
    now: datetime,
    when_live_down: WhenLiveDown = WhenLiveDown.WARN,
) -> Verdict:
    """The sink is fresh when nothing in the source waits longer than ``max_lag`` to be applied (from the live run's
    own progress log; before the live phase's first record, from the handoff), and the live phase that owns it runs.
    With the live phase down (``stopped``, ``failed``, ``lost``): data waiting fails the check at once (ERROR);
    nothing waiting follows ``when_live_down``. ``when_live_down='pass'`` (a phase stopped on purpose) judges waiting
    data by ``max_lag`` alone."""
    applied = inspect.applied_position(where, handoff)
    applied_version, applied_offsets = applied.version, applied.offsets
    u = inspect.unapplied(where, applied)
    meta: dict = {
        "live_state": live_state,
        "behind": u.behind if u.behind is not None else dg.MetadataValue.text("unknown"),
        "behind_unit": u.unit,
        "max_lag_s": max_lag.total_seconds(),
        "applied": f"v{applied_version}" if applied_offsets is None else json.dumps(applied_offsets),
    }
    down = live_state in DOWN and when_live_down is not WhenLiveDown.PASS
    if u.behind is None:
        return Verdict(False, f"cannot tell: {u.error}", meta)
    if u.behind == 0:
        meta |= {"lag_s": 0.0}
        if down:
            severity = (
                dg.AssetCheckSeverity.WARN if when_live_down is WhenLiveDown.WARN else dg.AssetCheckSeverity.ERROR
            )
            return Verdict(
                False,
                f"the live phase is {live_state}: the sink has applied everything in {u.location} so far, but nothing "
                "applies what comes next. Start the live job again (or set health.when_live_down)",
                meta,
                severity,
            )
        return Verdict(True, f"the sink has applied everything in {u.location} (live phase {live_state})", meta)
    lag = None if u.oldest_at is None else (now - u.oldest_at).total_seconds()
    if lag is not None:
        meta |= {"lag_s": round(lag, 3), "oldest_unapplied_at": dg.MetadataValue.timestamp(u.oldest_at)}
    waited = f"the oldest waiting {lag:.0f} s" if lag is not None else "since an unknown time"
    if down:
        return Verdict(
            False,
            f"{u.amount} {u.verb} in {u.location} ({waited}) and the live phase is {live_state}: nothing applies "
            "them. Start the live job again",
            meta,
        )
    if lag is None:
        return Verdict(False, f"{u.amount} not applied, {waited} (live phase {live_state})", meta)
    verdict = "within" if lag <= max_lag.total_seconds() else "over"
    return Verdict(
        lag <= max_lag.total_seconds(),
        f"{u.amount} not applied, {waited}, {verdict} max_lag {max_lag} (live phase {live_state})",
        meta,
    )


def _without(runs: list[LiveRunRecord], run_id: str) -> list[LiveRunRecord]:
    return [run for run in runs if run.run_id != run_id]


def build_live_check(pipeline: Pipeline) -> dg.AssetChecksDefinition:
    """``live_phase_running`` on the live asset: evaluated by the health sensor whenever the live phase's state
    changes; runnable from the UI (no Spark)."""
    names = Names(pipeline)

    @dg.asset_check(
        asset=names.live_asset,
        name=names.live_running,
        description="Whether the live phase runs: passes while a live run runs; WARN while it is stopped (terminated "
        "or ended on purpose); ERROR once its run failed or its process was lost. Evaluated by the health sensor.",
    )
    def live_phase_running(context: dg.AssetCheckExecutionContext, storage: StorageResource) -> dg.AssetCheckResult:
        handoff = serving_handoff(context.instance, storage.placement(pipeline), dg.AssetKey(names.backlog))
        if handoff is None:
            return dg.AssetCheckResult(
                passed=False, description="no handoff yet: the backlog has not run", severity=dg.AssetCheckSeverity.WARN
            )
        here = context.instance.get_run_by_id(context.run_id)
        if here is not None and here.tags.get(LIVE_RUN_TAG) == pipeline.name:
            # This run ran the live phase, and its live step ended without an error (else this check would not run).
            status = LiveStatus("stopped", context.run_id, f"live run {context.run_id} stopped")
        else:
            runs = live_runs(context.instance, pipeline.name, handoff.manifest_id)
            status = live_status(_without(runs, context.run_id))
        v = live_running_verdict(status, names.live_job)
        return dg.AssetCheckResult(passed=v.passed, description=v.description, metadata=v.metadata, severity=v.severity)

    return live_phase_running


def build_freshness_check(pipeline: Pipeline, settings: Orchestration) -> dg.AssetChecksDefinition:
    """``sink_fresh``: evaluated by the health sensor on every change and at least every minute; runnable from the
    UI as well (no Spark)."""
    names = Names(pipeline)

    @dg.asset_check(
        asset=names.sink,
        name=names.fresh,
        description=f"The sink holds every source record committed more than {settings.health.max_lag} ago (the "
        "live phase's own progress against the source's head). Fails while data waits longer than that, and at once "
        "when data waits while the live phase is stopped or lost; with nothing waiting and the live phase down, warns "
        "(health.when_live_down).",
    )
    def sink_fresh(context: dg.AssetCheckExecutionContext, storage: StorageResource) -> dg.AssetCheckResult:
        where = storage.placement(pipeline)
        handoff = serving_handoff(context.instance, where, dg.AssetKey(names.backlog))
        if handoff is None:
            return dg.AssetCheckResult(passed=False, description="no handoff yet: the backlog has not run")
        state = live_state_of(live_runs(context.instance, pipeline.name, handoff.manifest_id))
        f = sink_freshness(
            where,
            handoff,
            settings.health.max_lag,
            state,
            datetime.now(UTC),
            settings.health.when_live_down,
        )
        return dg.AssetCheckResult(passed=f.passed, description=f.description, metadata=f.metadata, severity=f.severity)

    return sink_fresh


def _latest_evaluation(instance: dg.DagsterInstance, key: dg.AssetCheckKey):
    """(passed, severity, (live_state, run_id, description), timestamp) of the check's latest evaluation the instance
    holds, or None."""
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key]).get(key)
    event = record.event if record is not None else None
    evaluation = event.dagster_event.event_specific_data if event is not None and event.dagster_event else None
    if not isinstance(evaluation, dg.AssetCheckEvaluation):
        return None
    state, run = evaluation.metadata.get("live_state"), evaluation.metadata.get("run_id")
    return (
        evaluation.passed,
        evaluation.severity,
        (getattr(state, "value", state), getattr(run, "value", run), evaluation.description),
        record.create_timestamp,
    )


def _due(
    instance: dg.DagsterInstance,
    key: dg.AssetCheckKey,
    verdict: Verdict,
    now: datetime,
    every=None,
    *,
    words: bool = False,
) -> bool:
    """Whether ``verdict`` says something the check's latest evaluation does not (another state, or the same state of
    another live run: a redeploy's run takes over from the run it stopped; with ``words``, any other description: a
    queued run that started, a relaunch's countdown) or, with ``every``, is older."""
    latest = _latest_evaluation(instance, key)
    if latest is None:
        return True
    passed, severity, (state, run, description), at = latest
    if words and description != verdict.description:
        return True
    if (passed, state) != (verdict.passed, verdict.metadata.get("live_state")):
        return True
    if "run_id" in verdict.metadata and run != verdict.metadata["run_id"]:
        return True
    if not passed and severity != verdict.severity:
        return True
    return every is not None and now.timestamp() - at >= every.total_seconds()


def check_evaluation(asset: dg.AssetKey, check: str, verdict: Verdict) -> dg.AssetCheckEvaluation:
    """A verdict as an evaluation of the check (the health sensor reports it; the live step too, with each sink
    materialization it makes, so that the check is evaluated for the sink's latest materialization)."""
    return dg.AssetCheckEvaluation(
        asset_key=asset,
        check_name=check,
        passed=verdict.passed,
        description=verdict.description,
        metadata=verdict.metadata,
        severity=verdict.severity,
    )


def build_health_sensor(pipeline: Pipeline, settings: Orchestration, live_job) -> dg.SensorDefinition:
    names = Names(pipeline)
    policy = settings.health
    live_key, sink_key = dg.AssetKey(names.live_asset), dg.AssetKey(names.sink)
    fresh_key = dg.AssetCheckKey(sink_key, names.fresh)
    running_key = dg.AssetCheckKey(live_key, names.live_running)

    @dg.sensor(
        name=names.health,
        job=live_job,
        minimum_interval_seconds=policy.minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING if policy.running_by_default else dg.DefaultSensorStatus.STOPPED,
        description=f"Health of the live phase of {pipeline.name!r}: observes the sources, evaluates the live asset's "
        "live_phase_running and the sink's sink_fresh checks, and relaunches a failed live run from its checkpoint "
        "(with backoff and a cap).",
    )
    def health(context: dg.SensorEvaluationContext, storage: StorageResource):
        where = storage.placement(pipeline)
        cursor = json.loads(context.cursor) if context.cursor else {}
        now = datetime.now(UTC)
        events: list = []

        heads = cursor.get("heads", {})
        for obs in source_assets.observations(where):
            position = (obs.metadata or {}).get("position")
            position = getattr(position, "value", position)
            key = obs.asset_key.to_user_string()
            if position and heads.get(key) != position:
                heads[key] = position
                events.append(obs)
        cursor["heads"] = heads

        handoff = serving_handoff(context.instance, where, dg.AssetKey(names.backlog))
        if handoff is None:
            context.update_cursor(json.dumps(cursor, sort_keys=True))
            return dg.SensorResult(skip_reason="no handoff yet: the backlog has not run", asset_events=events)
        runs = live_runs(context.instance, pipeline.name, handoff.manifest_id)
        status = live_status(runs)
        decision = decide_relaunch(runs, policy, now)

        # A run that ended without the live asset saying so (its process was killed): say it on the asset.
        reported = cursor.get("reported", [])
        # (A run that ended successfully said "stopped" itself.)
        if runs and status.state != "running" and runs[0].status != "SUCCESS" and runs[0].run_id not in reported:
            reported = [*reported[-20:], runs[0].run_id]
            events.append(
                dg.AssetObservation(
                    asset_key=live_key,
                    metadata={
                        "state": status.state,
                        "run_id": runs[0].run_id,
                        "reason": runs[0].failure or f"run {runs[0].status.lower()}",
                        "manifest_id": handoff.manifest_id,
                    },
                )
            )
        cursor["reported"] = reported

        if runs:  # the live phase owns the sink once it has run
            running = live_running_verdict(status, names.live_job, decision.reason if status.down else None)
            if _due(context.instance, running_key, running, now, words=True):
                events.append(check_evaluation(live_key, names.live_running, running))
            fresh = sink_freshness(where, handoff, policy.max_lag, status.state, now, policy.when_live_down)
            if _due(context.instance, fresh_key, fresh, now, REPORT_AT_LEAST_EVERY):
                events.append(check_evaluation(sink_key, names.fresh, fresh))

        context.update_cursor(json.dumps(cursor, sort_keys=True))
        context.log.info(decision.reason)  # each tick's decision in its logs, not only the tooltip of its status
        if decision.action != "relaunch":
            return dg.SensorResult(skip_reason=decision.reason, asset_events=events)
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"live:{handoff.manifest_id}:relaunch:{decision.attempt}:{runs[0].run_id}",
                    run_config={
                        "ops": {
                            names.live_asset: {
                                "config": {"manifest_id": handoff.manifest_id, "take_over_dead_lease": True}
                            }
                        }
                    },
                    tags={
                        "phases/manifest_id": handoff.manifest_id,
                        "phases/relaunch": str(decision.attempt),
                        "phases/relaunch_of": runs[0].run_id,
                        "phases/relaunch_reason": decision.reason[:200],
                    },
                )
            ],
            asset_events=events,
        )

    return health
