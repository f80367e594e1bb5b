"""The live phase's health sensor: the sink's freshness, the sources' heads, and relaunching a dead live run.

Each tick, without Spark:

* **Source observations.** Each input whose head moved (Delta version, Kafka end offsets) gets an observation
  (:mod:`assets.source`).
* **Freshness.** The ``sink_fresh`` check of the sink asset is evaluated from the source's head and the live
  phase's own progress log (what it applied): the sink is fresh when nothing waits, or when the oldest source
  data not applied was committed at most ``max_lag`` ago. It is reported when its verdict changes and at least
  every minute, whether the live run is up or dead.
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

from assets import source as source_assets
from assets.handoff_events import Handoff, read_handoff
from assets.settings import LiveHealth, Names, Orchestration, WhenLiveDown
from phases import errors
from phases.definition import Pipeline
from phases.sources.kafka import ChunkPlan
from phases.sources.lag import unapplied
from phases.storage import progress_log
from resources.storage import StorageResource

RUNNING_STATUSES = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING", "MANAGED"}
REPORT_AT_LEAST_EVERY = timedelta(seconds=60)


def _engine_errors() -> set[str]:
    """Names of the engine's exception classes that are deterministic: the same cause fails the same way."""
    out, todo = set(), [errors.PhasesError]
    while todo:
        cls = todo.pop()
        out.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return out - {errors.LiveQueryStopped.__name__}  # the query's own failure may be transient: retried to the cap


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


def live_runs(instance: dg.DagsterInstance, job_name: str, manifest_id: str, limit: int = 25) -> list[LiveRunRecord]:
    """The live job's runs for ``manifest_id`` (and runs launched without that tag, by hand), newest first."""
    records = instance.get_run_records(dg.RunsFilter(job_name=job_name), limit=limit)
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
class Freshness:
    passed: bool
    description: str
    metadata: dict
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR


DOWN = ("stopped", "failed")  # live states in which nothing applies new source data


def sink_freshness(
    resolved: Pipeline,
    handoff: Handoff,
    max_lag: timedelta,
    live_state: str,
    now: datetime,
    when_live_down: WhenLiveDown = WhenLiveDown.WARN,
) -> Freshness:
    """The sink is fresh when nothing in the source waits longer than ``max_lag`` to be applied (from the live run's
    own progress log; before the live phase's first record, from the handoff), and the live phase that owns it runs:
    with the live phase stopped or failed and nothing waiting yet, the check follows ``when_live_down``."""
    record = progress_log.latest_without_spark(resolved.locations.live_run(handoff.manifest_id))
    if record is not None:
        applied_version = int(record[1]["complete_below"]) - 1
        offsets = record[1].get("source_offsets")
        applied_offsets = {int(p): int(o) for p, o in offsets.items()} if offsets else None
    else:
        applied_version = handoff.source_version
        applied_offsets = ChunkPlan.from_json(handoff.source_position).end if handoff.source_position else None
    u = unapplied(resolved, applied_version=applied_version, applied_offsets=applied_offsets)
    meta: dict = {
        "live_state": live_state,
        "behind": u.behind if u.behind is not None else dg.MetadataValue.text("unknown"),
        "behind_unit": u.unit,
        "max_lag_s": max_lag.total_seconds(),
        "applied": f"v{applied_version}" if applied_offsets is None else json.dumps(applied_offsets),
    }
    if u.behind is None:
        return Freshness(False, f"cannot tell: {u.error}", meta)
    if u.behind == 0:
        meta |= {"lag_s": 0.0}
        if live_state in DOWN and when_live_down is not WhenLiveDown.PASS:
            severity = (
                dg.AssetCheckSeverity.WARN if when_live_down is WhenLiveDown.WARN else dg.AssetCheckSeverity.ERROR
            )
            return Freshness(
                False,
                f"the live phase is {live_state}: the sink has applied everything in {u.location} so far, but nothing "
                "applies what comes next. Start the live job again (or set health.when_live_down)",
                meta,
                severity,
            )
        return Freshness(True, f"the sink has applied everything in {u.location} (live phase {live_state})", meta)
    if u.oldest_at is None:
        return Freshness(
            False, f"{u.behind} {u.unit} not applied, since an unknown time (live phase {live_state})", meta
        )
    lag = (now - u.oldest_at).total_seconds()
    meta |= {"lag_s": round(lag, 3), "oldest_unapplied_at": dg.MetadataValue.timestamp(u.oldest_at)}
    verdict = "within" if lag <= max_lag.total_seconds() else "over"
    return Freshness(
        lag <= max_lag.total_seconds(),
        f"{u.behind} {u.unit} not applied, the oldest waiting {lag:.0f} s, {verdict} max_lag {max_lag} "
        f"(live phase {live_state})",
        meta,
    )


def live_state_of(runs: list[LiveRunRecord]) -> str:
    if not runs:
        return "not started"
    if any(run.status in RUNNING_STATUSES for run in runs):
        return "running"
    return "failed" if runs[0].status == "FAILURE" else "stopped"


def build_freshness_check(pipeline: Pipeline, settings: Orchestration) -> dg.AssetChecksDefinition:
    """``sink_fresh``: evaluated by the health sensor on every change and at least every minute; runnable from the
    UI as well (no Spark)."""
    names = Names(pipeline)

    @dg.asset_check(
        asset=names.sink,
        name=names.fresh,
        description=f"The sink holds every source record committed more than {settings.health.max_lag} ago (the "
        "live phase's own progress against the source's head). Fails while data waits longer than that; while the "
        "live phase is stopped or failed, warns (health.when_live_down) even when nothing waits yet.",
    )
    def sink_fresh(context: dg.AssetCheckExecutionContext, storage: StorageResource) -> dg.AssetCheckResult:
        handoff = read_handoff(context.instance, dg.AssetKey(names.backlog))
        if handoff is None:
            return dg.AssetCheckResult(passed=False, description="no handoff yet: the backlog has not run")
        state = live_state_of(live_runs(context.instance, names.live_job, handoff.manifest_id))
        f = sink_freshness(
            storage.resolve(pipeline),
            handoff,
            settings.health.max_lag,
            state,
            datetime.now(UTC),
            settings.health.when_live_down,
        )
        return dg.AssetCheckResult(passed=f.passed, description=f.description, metadata=f.metadata, severity=f.severity)

    return sink_fresh


def build_health_sensor(pipeline: Pipeline, settings: Orchestration, live_job) -> dg.SensorDefinition:
    names = Names(pipeline)
    policy = settings.health
    live_key, sink_key = dg.AssetKey(names.live_asset), dg.AssetKey(names.sink)

    @dg.sensor(
        name=names.health,
        job=live_job,
        minimum_interval_seconds=policy.minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING if policy.running_by_default else dg.DefaultSensorStatus.STOPPED,
        description=f"Health of {pipeline.name!r}'s live phase: observes the sources, evaluates the sink's freshness "
        "check and relaunches a failed live run from its checkpoint (with backoff and a cap).",
    )
    def health(context: dg.SensorEvaluationContext, storage: StorageResource):
        resolved = storage.resolve(pipeline)
        cursor = json.loads(context.cursor) if context.cursor else {}
        now = datetime.now(UTC)
        events: list = []

        heads = cursor.get("heads", {})
        for obs in source_assets.observations(resolved):
            position = (obs.tags or {}).get("dagster/data_version", "")
            key = obs.asset_key.to_user_string()
            if position and heads.get(key) != position:
                heads[key] = position
                events.append(obs)
        cursor["heads"] = heads

        handoff = read_handoff(context.instance, dg.AssetKey(names.backlog))
        if handoff is None:
            context.update_cursor(json.dumps(cursor))
            return dg.SensorResult(skip_reason="no handoff yet: the backlog has not run", asset_events=events)
        runs = live_runs(context.instance, names.live_job, handoff.manifest_id)
        state = live_state_of(runs)

        # A run that ended without the live asset saying so (its process was killed): say it on the asset.
        reported = cursor.get("reported", [])
        # (A run that ended successfully said "stopped" itself.)
        if runs and state != "running" and runs[0].status != "SUCCESS" and runs[0].run_id not in reported:
            reported = [*reported[-20:], runs[0].run_id]
            events.append(
                dg.AssetObservation(
                    asset_key=live_key,
                    metadata={
                        "state": state,
                        "run_id": runs[0].run_id,
                        "reason": runs[0].failure or f"run {runs[0].status.lower()}",
                        "manifest_id": handoff.manifest_id,
                    },
                )
            )
        cursor["reported"] = reported

        if runs:  # freshness concerns a sink the live phase owns
            fresh = sink_freshness(resolved, handoff, policy.max_lag, state, now, policy.when_live_down)
            last = cursor.get("fresh", {})
            due = now.timestamp() - last.get("at", 0) >= REPORT_AT_LEAST_EVERY.total_seconds()
            if due or last.get("passed") != fresh.passed or last.get("state") != state:
                cursor["fresh"] = {"passed": fresh.passed, "state": state, "at": now.timestamp()}
                events.append(
                    dg.AssetCheckEvaluation(
                        asset_key=sink_key,
                        check_name=names.fresh,
                        passed=fresh.passed,
                        description=fresh.description,
                        metadata=fresh.metadata,
                        severity=fresh.severity,
                    )
                )

        decision = decide_relaunch(runs, policy, now)
        context.log.info(decision.reason)
        context.update_cursor(json.dumps(cursor))
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
