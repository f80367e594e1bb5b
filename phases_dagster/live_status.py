"""The live phase's runs as the Dagster instance records them, and the verdicts the health sensor and the checks
report: which live runs a pipeline has (:func:`live_runs`), the state of its live phase (:func:`live_status`), whether
to relaunch a dead one (:func:`decide_relaunch`), and whether the sink is fresh (:func:`sink_freshness`). Plain
functions over these figures; the sensor and the checks that report them: :mod:`phases_dagster.health`."""

import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg

from phases import LiveQueryStopped, PhasesError, Placement, inspect
from phases_dagster.handoff_events import Handoff
from phases_dagster.settings import LiveHealth, WhenLiveDown

RUNNING_STATUSES = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING", "MANAGED"}
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
    applied = inspect.applied_position(where, handoff)  # pyright: ignore[reportArgumentType]
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
        meta |= {"lag_s": round(lag, 3), "oldest_unapplied_at": dg.MetadataValue.timestamp(u.oldest_at)}  # pyright: ignore[reportArgumentType]
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


def chained_freshness(own: Verdict, upstream: str, upstream_latest: tuple[bool, str | None, object] | None) -> Verdict:
    """``sink_fresh`` of a pipeline that reads another's results (``upstream``), given the upstream's latest
    ``sink_fresh`` evaluation ((passed, description, severity), None: none yet): a chain is as fresh as its stalest
    stage. A failed upstream fails this check too, with the upstream's severity, unless this sink's own verdict is
    already an ERROR (it says what is wrong here; the upstream's state is in its metadata)."""
    if upstream_latest is None:
        return dataclasses.replace(own, metadata={**own.metadata, "upstream_fresh": "not evaluated yet"})
    passed, description, severity = upstream_latest
    metadata = {**own.metadata, "upstream_fresh": passed}
    if passed or (not own.passed and own.severity == dg.AssetCheckSeverity.ERROR):
        return dataclasses.replace(own, metadata=metadata)
    return Verdict(
        False,
        f"the results this pipeline reads are not fresh: sink_fresh of pipeline {upstream!r} failed ({description}). "
        f"This sink has {'applied what it wrote' if own.passed else 'its own lag too: ' + own.description}",
        metadata,
        severity if isinstance(severity, dg.AssetCheckSeverity) else dg.AssetCheckSeverity.ERROR,
    )
