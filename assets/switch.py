"""The switch sensor: hands the backlog over to the live phase exactly once per valid, caught-up handoff.

Reads only Dagster's event log and the source's Delta log folder (no Spark, answers in milliseconds):

* the latest materialization of ``<name>_backlog`` and its manifest metadata;
* the blocking checks of that materialization (all must have passed in the same run);
* the source's head version.

Caught up (FLIP-309's watermark-lag rule): ``now - final watermark <= lag_threshold``, or the source has
no version after the handoff's ``V``. Then it requests the live job with ``run_key = live:<manifest id>``
(the daemon launches a run key once) and remembers the manifest in its cursor. Not caught up: it requests a
catch-up increment (backlog job, mode ``increment``, versions V+1..head) and switches after it.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg

from assets.checks import CHECK_NAMES
from assets.handoff_events import Handoff, read_handoff
from assets.settings import Names, Orchestration
from phases import delta_log
from phases.definition import Pipeline
from resources.storage import StorageResource


@dataclass(frozen=True)
class Decision:
    action: str  # skip | live | catch_up
    reason: str
    manifest_id: str | None = None


def decide(
    *,
    handoff: Handoff | None,
    fingerprint: str,
    failed_checks: list[str],
    source_head: int | None,
    now: datetime,
    lag_threshold: timedelta,
    launched_manifest: str | None,
    can_catch_up: bool = True,
) -> Decision:
    """The switch rule, as a pure function of what the sensor read."""
    if handoff is None:
        return Decision("skip", "no backlog materialization with a handoff manifest yet")
    mid = handoff.manifest_id
    if handoff.fingerprint != fingerprint:
        return Decision(
            "skip",
            f"manifest {mid} is invalid: made by pipeline fingerprint {handoff.fingerprint}, the definition now has "
            f"{fingerprint}; materialize the backlog again",
            mid,
        )
    if failed_checks:
        return Decision("skip", f"manifest {mid} is invalid: checks not passed: {', '.join(failed_checks)}", mid)
    if launched_manifest == mid:
        return Decision("skip", f"live phase already launched for manifest {mid}", mid)
    if source_head is None:
        return Decision("skip", "the source table has no Delta log (moved or deleted?)", mid)
    if source_head <= handoff.source_version:
        return Decision("live", f"caught up: the source has no version after {handoff.source_version}", mid)
    if handoff.final_watermark_us is not None:
        lag = now - datetime.fromtimestamp(handoff.final_watermark_us / 1e6, tz=UTC)
        if lag <= lag_threshold:
            return Decision("live", f"caught up: watermark lag {lag} <= {lag_threshold}", mid)
        lag_text = f"watermark lag {lag} > {lag_threshold}"
    else:
        lag_text = "no watermark yet"
    if not can_catch_up:
        return Decision(
            "live",
            f"switching although not caught up ({lag_text}): the pipeline's end-of-stream steps rule out catch-up "
            f"increments; the live phase reads versions {handoff.source_version + 1}..{source_head}",
            mid,
        )
    return Decision(
        "catch_up",
        f"not caught up ({lag_text}; source head {source_head} > handoff version {handoff.source_version}): "
        f"catch-up increment of versions {handoff.source_version + 1}..{source_head}",
        mid,
    )


def failed_checks(instance: dg.DagsterInstance, key: dg.AssetKey, run_id: str) -> list[str]:
    """Blocking checks that did not pass in the materialization's run (not run, planned or failed)."""
    check_keys = [dg.AssetCheckKey(key, n) for n in CHECK_NAMES]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(check_keys)
    out = []
    for ck in check_keys:
        rec = latest.get(ck)
        if rec is None or rec.run_id != run_id:
            out.append(f"{ck.name} (not evaluated for this materialization)")
        elif rec.status.value != "SUCCEEDED":
            out.append(f"{ck.name} ({rec.status.value.lower()})")
    return out


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
        "handoff manifest; requests a catch-up increment while the backlog lags.",
    )
    def switch(context: dg.SensorEvaluationContext, storage: StorageResource):
        p = storage.resolve(pipeline)
        handoff = read_handoff(context.instance, key)
        cursor = json.loads(context.cursor) if context.cursor else {}
        decision = decide(
            handoff=handoff,
            fingerprint=p.fingerprint(),
            failed_checks=failed_checks(context.instance, key, handoff.run_id) if handoff else [],
            source_head=delta_log.head_version(p.source.path),
            now=datetime.now(UTC),
            lag_threshold=policy.lag_threshold,
            launched_manifest=cursor.get("launched"),
            can_catch_up=pipeline.supports_increments,
        )
        context.log.info(decision.reason)
        if decision.action == "skip":
            return dg.SkipReason(decision.reason)
        if decision.action == "live":
            context.update_cursor(json.dumps({**cursor, "launched": decision.manifest_id}))
            return dg.RunRequest(
                run_key=f"live:{decision.manifest_id}",
                job_name=names.live_job,
                run_config={"ops": {names.live_op: {"config": {"manifest_id": decision.manifest_id}}}},
                tags={"phases/manifest_id": decision.manifest_id, "phases/switch_reason": decision.reason[:200]},
            )
        return dg.RunRequest(
            run_key=f"catch-up:{decision.manifest_id}",
            job_name=names.backlog_job,
            run_config={"ops": {names.backlog: {"config": {"mode": "increment"}}}},
            tags={"phases/base_manifest_id": decision.manifest_id, "phases/switch_reason": decision.reason[:200]},
        )

    return switch
