"""The switch sensor: hands the backlog over to the live phase exactly once per valid, caught-up handoff.

Reads only Dagster's event log and each input's position (no Spark, answers in milliseconds):

* the latest materialization of ``<name>_backlog`` and its manifest metadata;
* the blocking checks of that materialization (all must have passed in the same run);
* how far every input is after the handoff (:func:`phases.inspect.input_lags`): a Delta table's head version from its
  log folder, a Kafka topic's end offsets from the broker.

FLIP-309: the pipeline is in backlog while **any** input is. An input is caught up when it has nothing after
the handoff, when ``now - its final watermark <= lag_threshold``, or (Kafka) when at most
``max_records_behind`` records are after the handoff's end offsets. All caught up: the sensor requests the live
job with ``run_key = live:<manifest id>`` (the daemon launches a run key once) and remembers the manifest in its
cursor. Not caught up: it requests a catch-up increment (backlog job, mode ``increment``) and switches after it;
a pipeline that cannot be built from increments (end-of-stream steps, a Kafka source) switches anyway and its
live phase reads the rest.

A pipeline that reads another's results (a ``PipelineSource``) and has no handoff yet waits for that pipeline's
handoff (its backlog's materialization, checks passed), then requests its own backlog job once per upstream handoff.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg

from phases import InputLag, Pipeline, PipelineSource, Placement
from phases.inspect import input_lags, newest_handoff_row
from phases_dagster.backlog import NOT_RUN_TAG
from phases_dagster.checks import CHECK_NAMES, NO_FAR_FUTURE
from phases_dagster.handoff_events import Handoff, read_handoff
from phases_dagster.live_status import live_runs, live_status
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names, Orchestration


@dataclass(frozen=True)
class Decision:
    action: str  # skip | live | catch_up | backlog
    reason: str
    manifest_id: str | None = None  # backlog: the upstream's handoff it runs after


@dataclass(frozen=True)
class UpstreamHandoff:
    """What the event log says of the handoff of the pipeline whose results this one reads (a PipelineSource)."""

    pipeline: str
    handoff: Handoff | None
    failed_checks: list[str]


def _redeployed_past(where: Placement, handoff: Handoff | None) -> str | None:
    """Why the switch has nothing to do when a redeploy made another generation serve than the one of the backlog's
    handoff (its live phase runs from the redeploy job); None otherwise."""
    if handoff is None or not where.redeployed:
        return None
    newest = newest_handoff_row(where)  # delta-rs: no Spark here
    if newest is None or newest["manifest_id"] == handoff.manifest_id:
        return None
    return (
        f"generation {where.generation} serves since a redeploy (handoff {newest['manifest_id']}); the backlog's "
        f"handoff {handoff.manifest_id} is an earlier generation's. The redeploy job starts the serving generation's "
        "live phase; the live job resumes it"
    )


def increment_route(pipeline: Pipeline) -> str:
    """How a catch-up increment of ``pipeline`` moves its state on, for the switch's reason."""
    if pipeline.operator.takes_increments:
        return "merging the range's aggregate into the handoff's state"
    return f"the {pipeline.operator.kind} operator's live step from the handoff's state"


def decide(
    *,
    handoff: Handoff | None,
    fingerprint: str,
    failed_checks: list[str],
    lags: list[InputLag],
    now: datetime,
    lag_threshold: timedelta,
    launched_manifest: str | None,
    no_increments_because: str | None = None,
    increment_route: str = "merging the range's aggregate into the handoff's state",
    max_records_behind: int = 0,
    running_live_run: str | None = None,
    upstream: UpstreamHandoff | None = None,
) -> Decision:
    """The switch rule, as a pure function of what the sensor read (``running_live_run``: a run of the live phase
    that runs now, whatever launched it; ``no_increments_because``: why the pipeline takes no catch-up increment, None
    when it does, by ``increment_route``; ``upstream``: the handoff of the pipeline whose results this one reads).

    A pipeline that reads another's results starts its backlog itself, once that pipeline has handed off with its
    checks passed (``backlog``, once per upstream handoff)."""
    if handoff is None and upstream is not None:
        return _after_upstream(upstream)
    if handoff is None:
        return Decision("skip", "no backlog materialization with a handoff manifest yet")
    mid = handoff.manifest_id
    if handoff.fingerprint != fingerprint:
        return Decision(
            "skip",
            f"manifest {mid} was made by pipeline fingerprint {handoff.fingerprint}, the definition now has "
            f"{fingerprint}: the code changed. A pipeline that runs takes a changed definition with its redeploy job "
            "(built beside the serving one, then swapped in; the live phase keeps serving meanwhile); before the "
            "switch, materialize the backlog again",
            mid,
        )
    if failed_checks and all(c.endswith("(planned)") for c in failed_checks):
        return Decision(
            "skip", f"manifest {mid}: its checks are planned in its run and not evaluated yet; waiting for them", mid
        )
    if failed_checks:
        return Decision("skip", f"manifest {mid} is invalid: checks not passed: {', '.join(failed_checks)}", mid)
    if launched_manifest == mid:
        return Decision("skip", f"live phase already launched for manifest {mid}", mid)
    if running_live_run is not None:
        return Decision("skip", f"the live phase of manifest {mid} already runs (run {running_live_run})", mid)
    unknown = [lag for lag in lags if lag.behind is None]
    if unknown:
        return Decision("skip", "; ".join(lag.describe() for lag in unknown), mid)
    caught_up, behind = [], []
    for lag in lags:
        state = _caught_up(lag, now, lag_threshold, max_records_behind)
        (caught_up if state[0] else behind).append(f"{lag.label}: {state[1]}")
    if not behind:
        return Decision("live", f"caught up ({'; '.join(caught_up)})", mid)
    what = "; ".join(behind)
    if no_increments_because is not None:
        return Decision(
            "live",
            f"switching although not caught up ({what}): this pipeline takes no catch-up increment "
            f"({no_increments_because}); the live phase reads the rest",
            mid,
        )
    ranges = [_range(lags[0], handoff.source_version)]
    if len(lags) > 1 and lags[1].behind:
        right = handoff.right_source_version if handoff.right_source_version is not None else -1
        ranges.append(_range(lags[1], right))
    return Decision(
        "catch_up",
        f"catch-up increment by {increment_route}, of {' and '.join(r for r in ranges if r)}: not caught up ({what})",
        mid,
    )


def _after_upstream(upstream: UpstreamHandoff) -> Decision:
    name, handoff = upstream.pipeline, upstream.handoff
    if handoff is None:
        return Decision(
            "skip",
            f"waiting for pipeline {name!r}, whose results this pipeline reads, to hand off (materialize its "
            "backlog); this pipeline's backlog starts after it",
        )
    mid = handoff.manifest_id
    if upstream.failed_checks:
        return Decision(
            "skip",
            f"waiting for pipeline {name!r}: its handoff {mid} has not passed its checks "
            f"({', '.join(upstream.failed_checks)}); this pipeline's backlog starts after a handoff that passed them",
        )
    return Decision(
        "backlog", f"pipeline {name!r} handed off (manifest {mid}): this pipeline's backlog reads its results", mid
    )


def _range(lag: InputLag, handoff_version: int) -> str:
    """What an increment takes of one input: its versions after the handoff's, or its records after the handoff's
    end offsets."""
    if not lag.behind:
        return ""
    if lag.unit == "records":
        return f"the {lag.label}'s {lag.behind} records after the handoff's end offsets"
    return f"{lag.label} versions {handoff_version + 1}..{handoff_version + lag.behind}"


def _caught_up(lag: InputLag, now: datetime, threshold: timedelta, max_records: int) -> tuple[bool, str]:
    """Whether one input is out of its backlog, and why (FLIP-309 / FLIP-328: nothing after the handoff, the
    watermark lag, or few enough records behind)."""
    if lag.behind == 0:
        return True, f"nothing after the handoff in {lag.location}"
    if lag.unit == "records" and lag.behind <= max_records:
        return True, f"{lag.behind} records behind <= {max_records}"
    if lag.watermark_us is None:
        return False, f"{lag.behind} {lag.unit} behind, no watermark yet"
    wm_lag = now - datetime.fromtimestamp(lag.watermark_us / 1e6, tz=UTC)
    if wm_lag <= threshold:
        return True, f"watermark lag {wm_lag} <= {threshold}"
    return False, f"{lag.behind} {lag.unit} behind, watermark lag {wm_lag} > {threshold}"


def _lags(where: Placement, handoff: Handoff) -> list[InputLag]:
    return input_lags(
        where,
        source_version=handoff.source_version,
        source_position=handoff.source_position,
        watermark_us=handoff.final_watermark_us,
        right_source_version=handoff.right_source_version,
        right_watermark_us=handoff.right_watermark_us,
        right_source_position=handoff.right_source_position,
    )


def failed_checks(instance: dg.DagsterInstance, key: dg.AssetKey, run_id: str, history: int = 50) -> list[str]:
    """Blocking checks that did not pass in the materialization's own run (not run, planned or failed). A later run
    that planned the checks without evaluating them (a backlog refused in "Materialize all") does not change the
    verdict on this materialization."""
    out = []
    for name in CHECK_NAMES:
        check_key = dg.AssetCheckKey(key, name)
        records = instance.event_log_storage.get_asset_check_execution_history(check_key, limit=history)
        rec = next((r for r in records if r.run_id == run_id), None)
        if rec is None:
            out.append(f"{name} (not evaluated for this materialization)")
        elif rec.status.value != "SUCCEEDED":
            out.append(f"{name} ({rec.status.value.lower()})")
    return out


def restated_checks(instance: dg.DagsterInstance, key: dg.AssetKey, run_id: str) -> list[dg.AssetCheckEvaluation]:
    """The backlog checks whose latest execution is a plan that a finished run never carried out because its backlog
    step did nothing (tagged :data:`phases_dagster.backlog.NOT_RUN_TAG`: a backlog asked for after the switch, e.g. by
    "Materialize all"), restated as the handoff's own run evaluated them, for the same materialization. Without this
    the UI shows the handoff's checks as skipped (0 of 6 passed) though they passed for the manifest in use."""
    out = []
    for name in (*CHECK_NAMES, NO_FAR_FUTURE):
        check_key = dg.AssetCheckKey(key, name)
        latest = instance.event_log_storage.get_latest_asset_check_execution_by_key([check_key]).get(check_key)
        if latest is None or latest.run_id == run_id or latest.status.value != "PLANNED":
            continue
        planner = instance.get_run_by_id(latest.run_id)
        if planner is None or not planner.is_finished or NOT_RUN_TAG not in planner.tags:
            continue
        history = instance.event_log_storage.get_asset_check_execution_history(check_key, limit=50)
        own = next((r for r in history if r.run_id == run_id and r.event is not None), None)
        evaluation = (
            own.event.dagster_event.event_specific_data if own is not None and own.event.dagster_event else None
        )
        if not isinstance(evaluation, dg.AssetCheckEvaluation):
            continue
        out.append(
            dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=name,
                passed=evaluation.passed,
                metadata={**evaluation.metadata, "evaluated_by_run": run_id},
                target_materialization_data=evaluation.target_materialization_data,
                severity=evaluation.severity,
                description=f"as evaluated for this manifest by run {run_id} (run {latest.run_id} planned this check "
                "but its backlog did not run: the pipeline is live)",
            )
        )
    return out


def _upstream(instance: dg.DagsterInstance, pipeline: Pipeline) -> UpstreamHandoff | None:
    """The handoff of a pipeline whose results ``pipeline`` reads, from its backlog's materializations: the first one
    that has not handed off with its checks passed, else the last one's; None when it reads none."""
    found = None
    for spec in (i.spec for i in pipeline.inputs if isinstance(i.spec, PipelineSource)):
        key = dg.AssetKey(Names(spec.upstream).backlog)
        handoff = read_handoff(instance, key)
        failed = failed_checks(instance, key, handoff.run_id) if handoff is not None else []
        found = UpstreamHandoff(spec.upstream.name, handoff, failed)
        if handoff is None or failed:
            return found
    return found


def build_switch_sensor(
    pipeline: Pipeline,
    settings: Orchestration,
    live_job: dg.JobDefinition,
    backlog_job,
) -> dg.SensorDefinition:
    names = Names(pipeline)
    key = dg.AssetKey(names.backlog)
    policy = settings.switch

    @dg.sensor(
        name=names.switch,
        jobs=[live_job, backlog_job],
        minimum_interval_seconds=policy.minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING if policy.running_by_default else dg.DefaultSensorStatus.STOPPED,
        description=f"Backlog -> live switch of {pipeline.name!r}: launches the live job once per valid, caught-up "
        "handoff manifest; requests a catch-up increment while the backlog lags; a pipeline that reads another's "
        "results: requests its backlog once that pipeline handed off.",
    )
    def switch(context: dg.SensorEvaluationContext, storage: StorageResource):
        where = storage.placement(pipeline)
        handoff = read_handoff(context.instance, key)
        upstream = _upstream(context.instance, pipeline) if handoff is None else None
        redeployed = _redeployed_past(where, handoff)
        if redeployed is not None:
            return dg.SensorResult(skip_reason=redeployed)
        cursor = json.loads(context.cursor) if context.cursor else {}
        status = live_status(live_runs(context.instance, pipeline.name, handoff.manifest_id)) if handoff else None
        decision = decide(
            handoff=handoff,
            # A handoff written before placements named the definition with its paths resolved: the same one.
            fingerprint=handoff.fingerprint
            if handoff and where.is_fingerprint(handoff.fingerprint)
            else where.fingerprint(),
            failed_checks=failed_checks(context.instance, key, handoff.run_id) if handoff else [],
            lags=_lags(where, handoff) if handoff else [],
            now=datetime.now(UTC),
            lag_threshold=policy.lag_threshold,
            launched_manifest=cursor.get("launched"),
            no_increments_because=pipeline.no_increments_because,
            increment_route=increment_route(pipeline),
            max_records_behind=policy.max_records_behind,
            running_live_run=status.run_id if status is not None and status.state == "running" else None,
            upstream=upstream,
        )
        restated = restated_checks(context.instance, key, handoff.run_id) if handoff else []
        context.log.info(decision.reason)  # each tick's decision in its logs, not only the tooltip of its status
        if decision.action == "skip":
            return dg.SensorResult(skip_reason=decision.reason, asset_events=restated)
        if decision.action == "live":
            context.update_cursor(json.dumps({**cursor, "launched": decision.manifest_id}))
            request = dg.RunRequest(
                run_key=f"live:{decision.manifest_id}",
                job_name=names.live_job,
                run_config={"ops": {names.live_asset: {"config": {"manifest_id": decision.manifest_id}}}},
                tags={"phases/manifest_id": decision.manifest_id, "phases/switch_reason": decision.reason[:200]},
            )
            return dg.SensorResult(run_requests=[request], asset_events=restated)
        if decision.action == "backlog":
            request = dg.RunRequest(
                run_key=f"after:{decision.manifest_id}",  # once per upstream handoff
                job_name=names.backlog_job,
                tags={
                    "phases/upstream_manifest_id": decision.manifest_id,
                    "phases/switch_reason": decision.reason[:200],
                },
            )
            return dg.SensorResult(run_requests=[request], asset_events=restated)
        request = dg.RunRequest(
            run_key=f"catch-up:{decision.manifest_id}",
            job_name=names.backlog_job,
            run_config={"ops": {names.backlog_op: {"config": {"mode": "increment"}}}},
            tags={"phases/base_manifest_id": decision.manifest_id, "phases/switch_reason": decision.reason[:200]},
        )
        return dg.SensorResult(run_requests=[request], asset_events=restated)

    return switch
