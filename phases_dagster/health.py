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
  data waiting it fails at once, saying whether the phase was stopped or lost. A pipeline that reads another's
  results is as fresh as that pipeline too: its upstream's failed ``sink_fresh`` fails its own.

Both checks are reported when their verdict differs from the latest evaluation the instance holds (whoever made
it), and ``sink_fresh`` at least every minute so that its lag stays current; the cursor holds no clock.
* **Relaunch.** A live run that failed (an error, or its process lost: run monitoring marks it failed) is
  relaunched from its checkpoint with ``take_over_dead_lease``, after a backoff that doubles per consecutive
  failure, at most ``max_relaunches`` times. An engine error that repeats (a schema the pipeline cannot take, a
  lease held by a live process, a bad definition) stops the relaunching at once: each reason is the tick's
  message. A run stopped on purpose (terminated, ``max_runtime_seconds``) is not relaunched.
"""

import json
from datetime import UTC, datetime, timedelta

import dagster as dg

from phases import Pipeline, PipelineSource
from phases_dagster import source as source_assets
from phases_dagster.handoff_events import serving_handoff
from phases_dagster.live_status import (
    LIVE_RUN_TAG,
    LiveRunRecord,
    LiveStatus,
    Verdict,
    chained_freshness,
    decide_relaunch,
    live_running_verdict,
    live_runs,
    live_state_of,
    live_status,
    sink_freshness,
)
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names, Orchestration

REPORT_AT_LEAST_EVERY = timedelta(seconds=60)


def _without(runs: list[LiveRunRecord], run_id: str) -> list[LiveRunRecord]:
    return [r for r in runs if r.run_id != run_id]


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
        run_id = context.run.run_id
        # The run as stored now: the live step tags the run it runs in while it runs (``context.run`` is as launched).
        here = context.instance.get_run_by_id(run_id)
        if here is not None and here.tags.get(LIVE_RUN_TAG) == pipeline.name:
            # This run ran the live phase, and its live step ended without an error (else this check would not run).
            status = LiveStatus("stopped", run_id, f"live run {run_id} stopped")
        else:
            runs = live_runs(context.instance, pipeline.name, handoff.manifest_id)
            status = live_status(_without(runs, run_id))
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
        f = _along_the_chain(context.instance, pipeline, f)
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


def _along_the_chain(instance: dg.DagsterInstance, pipeline: Pipeline, verdict: Verdict) -> Verdict:
    """``sink_fresh`` of a pipeline that reads another's results, with that pipeline's latest ``sink_fresh``
    (:func:`phases_dagster.live_status.chained_freshness`); any other pipeline's verdict as it is."""
    for spec in (i.spec for i in pipeline.inputs if isinstance(i.spec, PipelineSource)):
        upstream = Names(spec.upstream)
        latest = _latest_evaluation(instance, dg.AssetCheckKey(dg.AssetKey(upstream.sink), upstream.fresh))
        seen = None if latest is None else (latest[0], latest[2][2], latest[1])
        verdict = chained_freshness(verdict, spec.upstream.name, seen)
    return verdict


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
            fresh = _along_the_chain(context.instance, pipeline, fresh)
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
