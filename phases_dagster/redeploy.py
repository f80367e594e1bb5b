"""The redeploy job: a changed definition built beside the serving one, checked, swapped in, and its live phase run.

Deploy the changed code, then launch ``<name>_redeploy_job`` with a reason. Its steps are assets, so that both
generations show in the lineage while they coexist; the two redeploy assets are in a group of their own
(``<name>_redeploy``), so the pipeline group's "Materialize all" never runs them, and outside the redeploy job they do
nothing and say why (no materialization: nothing is shown as built or swapped):

* ``<name>_next_generation``: the diff against the serving definition (in the run's log and the materialization),
  then for a change of the state's shape the new generation's backlog, catch-up increments and live rounds on its
  own sink (:meth:`phases.Redeploy.prepare`); each step is an observation of the asset as it
  happens. Its blocking checks are the backlog's, on the new generation's handoff: a generation that fails them is
  never swapped in (the swap step does not run);
* ``<name>_swap`` (one step with the live asset, :mod:`phases_dagster.live`, so that the live asset depends on no
  asset that only a redeploy materializes: its own "Materialize" opens no warning): asks the serving live phase to
  stop (its run ends cleanly, saying why), makes the swap's commit on the consumer-facing sink and records it
  (:meth:`~phases.Redeploy.run`); a materialization of the sink says which generation it holds now.
  For a forward change it records the amendment and stops the serving live phase instead, and with no change to the
  state spec it only stops it (a restart takes the new code up);
* ``<name>_live``: the live phase of the definition, now the serving generation's, in this same run.

A **rollback** is the same job run from the previous definition's code: its generation is kept, so the job skips
its backlog and swaps it back. The run's tags say which (``phases/redeploy``: ``backfill``, ``rollback``, ``forward``
or ``none``) and why (``phases/redeploy_reason``).
"""

import dagster as dg
from pydantic import Field

from phases import ManifestError, Pipeline, Redeploy, RedeployResult, inspect
from phases_dagster import catalog
from phases_dagster.checks import CHECK_NAMES, DESCRIPTIONS, NO_FAR_FUTURE, handoff_check_results
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names, Orchestration

REDEPLOY_TAG = "phases/redeploy"
REASON_TAG = "phases/redeploy_reason"


class RedeployConfig(dg.Config):
    reason: str = Field(
        default="", description="Why the pipeline is redeployed: kept in the redeploy log and the run's tags."
    )
    take_over_dead_lease: bool = Field(
        default=False,
        description="Take leases over from holders whose process is gone (a redeploy or live run killed).",
    )
    stop_timeout_seconds: float = Field(
        default=600.0, gt=0, description="How long the swap waits for the serving live phase to stop at its request."
    )


def not_in_the_redeploy_job(context: dg.AssetExecutionContext, pipeline: Pipeline, what: str) -> str | None:
    """Why a redeploy step does nothing in this run (it is not the redeploy job's), or None."""
    names = Names(pipeline)
    if context.run.job_name == names.redeploy_job:
        return None
    reason = (
        f"not run: {what} runs only in {names.redeploy_job} (deploy the changed code, then launch that job with a "
        f"reason); run {context.run_id} is {context.run.job_name}'s. Nothing was built, stopped or swapped."
    )
    context.log.info(reason)
    return reason


def _text(value: object) -> str | int | float:
    return value if isinstance(value, int | float | str) else str(value)


def _redeploy(
    context: dg.AssetExecutionContext, pipeline: Pipeline, config: RedeployConfig, spark, storage, key: dg.AssetKey
) -> Redeploy:
    def report(step: str, detail: dict) -> None:
        context.log.info(f"redeploy of {pipeline.name!r}: {step}: " + "; ".join(f"{k}={v}" for k, v in detail.items()))
        context.log_event(
            dg.AssetObservation(asset_key=key, metadata={"step": step, **{k: _text(v) for k, v in detail.items()}})
        )

    return Redeploy.at(
        spark.session(),
        storage.placement(pipeline),
        on_step=report,
        take_over=config.take_over_dead_lease,
        stop_timeout_s=config.stop_timeout_seconds,
    )


def _tag_run(context: dg.AssetExecutionContext, result: RedeployResult, rollback: bool, reason: str) -> None:
    way = "rollback" if rollback else result.way
    context.instance.add_run_tags(context.run_id, {REDEPLOY_TAG: way, REASON_TAG: reason[:200] or "none given"})


def build_redeploy_assets(pipeline: Pipeline, settings: Orchestration) -> list:
    names = Names(pipeline)
    next_key = dg.AssetKey(names.next_generation)
    bound = settings.checks.max_quarantine_fraction

    @dg.asset(
        name=names.next_generation,
        deps=[names.source],
        code_version=pipeline.fingerprint(),
        output_required=False,  # outside the redeploy job it materializes nothing
        **{
            **catalog.spec_kwargs(
                pipeline,
                f"The next generation of {pipeline.name!r}: the changed definition built beside the serving one (its "
                "own state, sink and quarantine), up to the head, with its live phase caught up on its own sink. Its "
                f"blocking checks must pass before {names.swap} swaps it in. Observations show each step as it "
                f"happens. Runs only in {names.redeploy_job}; elsewhere it does nothing and says why.",
                kinds={"spark", "delta"},
            ),
            "group_name": names.redeploy_group,
        },
    )
    def next_generation(
        context: dg.AssetExecutionContext, config: RedeployConfig, spark: SparkResource, storage: StorageResource
    ):
        if not_in_the_redeploy_job(context, pipeline, "the next generation") is not None:
            return
        redeploy = _redeploy(context, pipeline, config, spark, storage, next_key)
        plan = redeploy.plan()
        context.log.info(plan.describe())
        result = redeploy.prepare(config.reason)
        rollback = plan.rollback
        _tag_run(context, result, rollback, config.reason)
        metadata = {
            "way": "rollback" if rollback else result.way,
            "serving_generation": plan.serving,
            "generation": result.prepared if result.prepared is not None else "none built",
            "diff": dg.MetadataValue.md("```\n" + plan.describe() + "\n```"),
            "reason": config.reason or "none given",
        }
        if result.prepared is not None:
            metadata["manifest_id"] = result.manifest_id
            metadata.update({k: round(v, 3) for k, v in result.timings.items()})
        yield dg.MaterializeResult(metadata=metadata)

    specs = [
        dg.AssetCheckSpec(n, asset=next_key, blocking=True, description=DESCRIPTIONS[n] + " (the next generation)")
        for n in CHECK_NAMES
    ]
    specs.append(dg.AssetCheckSpec(NO_FAR_FUTURE, asset=next_key, description=DESCRIPTIONS[NO_FAR_FUTURE]))

    @dg.multi_asset_check(specs=specs, name=names.next_generation_checks)
    def next_generation_checks(spark: SparkResource, storage: StorageResource):
        session = spark.session()
        redeploy = Redeploy.at(session, storage.placement(pipeline))
        plan = redeploy.plan()
        if plan.way != "backfill":  # nothing was built, so nothing passed: a warning, which does not block the swap
            for n in (*CHECK_NAMES, NO_FAR_FUTURE):
                yield dg.AssetCheckResult(
                    asset_key=next_key,
                    check_name=n,
                    passed=False,
                    severity=dg.AssetCheckSeverity.WARN,
                    metadata={"generation": f"none: a {plan.way!r} change builds no generation to check"},
                )
            return
        built = redeploy.as_generation(plan.target)
        try:
            handoff = inspect.latest_handoff(session, built)
        except ManifestError as exc:
            for n in (*CHECK_NAMES, NO_FAR_FUTURE):
                yield dg.AssetCheckResult(asset_key=next_key, check_name=n, passed=False, metadata={"error": str(exc)})
            return
        yield from handoff_check_results(session, built, handoff, next_key, bound)

    return [next_generation, next_generation_checks]


def swap_spec(pipeline: Pipeline) -> dg.AssetSpec:
    """The swap, an asset of the live step (:func:`phases_dagster.live.build_live_asset`) in the redeploy's group."""
    names = Names(pipeline)
    downstream = (
        "follows the swap: it reads these results as changes (the old rows taken back, the new ones added)"
        if pipeline.operator.upserts
        else "stops at the swap's commit, naming it: run its backlog again with reset"
    )
    kwargs = catalog.spec_kwargs(
        pipeline,
        f"The swap of {pipeline.name!r}: the serving live phase is asked to stop, then one commit makes the sink "
        "consumers read hold the next generation's results; the previous generation is kept for a rollback (run "
        "this job from the previous definition's code). A forward change is recorded instead, and the live phase "
        f"restarted. Runs only in {names.redeploy_job}, in the live step's process (its live phase then starts "
        "there); elsewhere it does nothing and says why. A pipeline that reads these results (a PipelineSource: "
        f"downstream of {names.sink} in the lineage) {downstream}.",
        kinds={"delta"},
    )
    kwargs["group_name"] = names.redeploy_group
    return dg.AssetSpec(
        names.swap, deps=[names.next_generation], code_version=pipeline.fingerprint(), skippable=True, **kwargs
    )


def run_swap(
    context: dg.AssetExecutionContext,
    pipeline: Pipeline,
    config: RedeployConfig,
    spark: SparkResource,
    storage: StorageResource,
) -> dg.MaterializeResult:
    """The swap step of the redeploy job (module docstring): the swap asset's materialization."""
    names = Names(pipeline)
    swap_key, sink_key = dg.AssetKey(names.swap), dg.AssetKey(names.sink)
    redeploy = _redeploy(context, pipeline, config, spark, storage, swap_key)
    plan = redeploy.plan()
    result = redeploy.run(config.reason)
    if result.way == "none":  # the live step of this run restarts the live phase: it takes the new code up
        redeploy.stop_serving_live(result.generation)
    rollback = result.swapped and plan.rollback
    _tag_run(context, result, rollback, config.reason)
    metadata = {
        "way": "rollback" if rollback else result.way,
        "from_generation": result.from_generation,
        "generation": result.generation,
        "swapped": result.swapped,
        "reason": config.reason or "none given",
    }
    if result.swapped:
        gap = result.swap_gap_s
        metadata.update(
            consumer_version=result.consumer_version,
            seconds_from_stop_to_swap=round(gap, 3) if gap is not None else -1,
            manifest_id=result.manifest_id,
        )
        if result.old_stopped_at_us is not None:  # when the sink stopped taking the old generation's results
            metadata["serving_live_stopped_at"] = dg.MetadataValue.timestamp(result.old_stopped_at_us / 1e6)
        if result.swapped_at_us is not None:
            metadata["swapped_at"] = dg.MetadataValue.timestamp(result.swapped_at_us / 1e6)
        # where the swap's step spent its time: the last round, the swap's commit, keeping the old results
        metadata.update({k: round(v, 3) for k, v in result.timings.items() if k.endswith("_s")})
        where = storage.placement(pipeline)
        context.log_event(
            dg.AssetMaterialization(
                asset_key=sink_key,
                metadata={
                    "written_by": "swap",
                    "generation": result.generation,
                    **catalog.table_metadata(pipeline, where.sink_path, "sink"),
                },
            )
        )
    return dg.MaterializeResult(asset_key=swap_key, metadata=metadata)


def build_redeploy_job(pipeline: Pipeline):
    names = Names(pipeline)
    return dg.define_asset_job(
        names.redeploy_job,
        selection=dg.AssetSelection.assets(names.next_generation, names.swap, names.live_asset)
        - dg.AssetSelection.checks(dg.AssetCheckKey(dg.AssetKey(names.live_asset), names.live_running)),
        executor_def=dg.in_process_executor,
        description=f"Redeploy {pipeline.name!r}: the changed definition beside the serving one, its checks, the swap, "
        "then its live phase (long-running). Run it from the previous definition's code to roll back.",
        tags={"phases/pipeline": pipeline.name},
    )
