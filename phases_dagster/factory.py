"""Pipeline definition -> Dagster definitions, so a pipeline is added in a few lines::

defs = dg.Definitions.merge(
    pipeline_definitions(my_pipeline),
    pipeline_definitions(other, Orchestration(backfill=DailyBackfill(start_date=date(2026, 1, 1)))),
    dg.Definitions(resources=default_resources()),
)
"""

import dagster as dg

from phases import Pipeline
from phases_dagster.backlog import build_backlog_assets
from phases_dagster.checks import build_backlog_checks
from phases_dagster.health import build_freshness_check, build_health_sensor, build_live_check
from phases_dagster.live import build_live_asset, build_live_job
from phases_dagster.redeploy import build_redeploy_assets, build_redeploy_job
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names, Orchestration
from phases_dagster.source import build_source_asset
from phases_dagster.switch import build_switch_sensor


def default_resources() -> dict:
    return {"spark": SparkResource(), "storage": StorageResource()}


def pipeline_definitions(pipeline: Pipeline, settings: Orchestration | None = None) -> dg.Definitions:
    """Everything Dagster shows of one pipeline, as assets that are its tables:

    * ``<name>_source`` (and ``_right_source``): observable sources, observed by the health sensor;
    * ``<name>_backlog`` (the handoff manifest) with its blocking checks, ``_state``, ``_sink`` and
      ``_quarantine``: one multi-asset, the backlog phase (plus ``_backlog_slices`` with a daily backfill);
    * ``<name>_live``: the live phase, a long-running step, with its ``live_phase_running`` check; the sink's
      ``sink_fresh`` check;
    * ``<name>_next_generation`` (with its blocking checks) and ``<name>_swap`` (a part of the live step), in the
      group ``<name>_redeploy``: a redeploy of a changed definition beside the serving one, run only by the redeploy
      job (:mod:`phases_dagster.redeploy`);
    * jobs (backlog, live, redeploy, slices), the switch sensor, the health sensor, the daily schedule.

    Resources ``spark`` and ``storage`` are bound by the caller's Definitions (see :func:`default_resources`)."""
    settings = settings or Orchestration()
    names = Names(pipeline)
    redeploy = build_redeploy_assets(pipeline, settings)
    backlog_assets = build_backlog_assets(pipeline, settings)
    backlog_job = dg.define_asset_job(
        names.backlog_job,
        # The sink's freshness check is the health sensor's, not the backlog's.
        selection=dg.AssetSelection.assets(names.backlog, names.state, names.sink, names.quarantine)
        - dg.AssetSelection.checks(dg.AssetCheckKey(dg.AssetKey(names.sink), names.fresh)),
        executor_def=dg.in_process_executor,
        description="Backlog phase (full / increment / slices) and its blocking checks.",
    )
    live_job = build_live_job(pipeline)
    jobs: list = [backlog_job, live_job, build_redeploy_job(pipeline)]
    schedules = []
    if settings.backfill is not None:
        slices_job = dg.define_asset_job(
            names.slices_job,
            selection=dg.AssetSelection.assets(names.slices),
            executor_def=dg.in_process_executor,
            description="Backlog slices of a range of days (one run; finished days are not executed again).",
        )
        jobs.append(slices_job)
        schedules.append(
            dg.build_schedule_from_partitioned_job(
                slices_job, name=names.schedule, hour_of_day=settings.backfill.hour_of_day
            )
        )
    sources = build_source_asset(pipeline)  # none when the pipeline reads another's results only
    return dg.Definitions(
        assets=[
            *([sources] if sources is not None else []),
            *backlog_assets,
            build_live_asset(pipeline, settings),
            redeploy[0],
        ],
        asset_checks=[
            redeploy[1],
            build_backlog_checks(pipeline, settings),
            build_freshness_check(pipeline, settings),
            build_live_check(pipeline),
        ],
        jobs=jobs,
        sensors=[
            build_switch_sensor(pipeline, settings, live_job, backlog_job),  # pyright: ignore[reportArgumentType]
            build_health_sensor(pipeline, settings, live_job),
        ],
        schedules=schedules,
    )
