"""Pipeline definition -> Dagster definitions, so a pipeline is added in a few lines::

defs = dg.Definitions.merge(
    pipeline_definitions(my_pipeline),
    pipeline_definitions(other, Orchestration(backfill=DailyBackfill(start_date=date(2026, 1, 1)))),
    dg.Definitions(resources=default_resources()),
)
"""

import dagster as dg

from assets.backlog import build_backlog_assets
from assets.checks import build_backlog_checks
from assets.live import build_live_job
from assets.settings import Names, Orchestration
from assets.switch import build_switch_sensor
from phases.definition import Pipeline
from resources.spark import SparkResource
from resources.storage import StorageResource


def default_resources() -> dict:
    return {"spark": SparkResource(), "storage": StorageResource()}


def pipeline_definitions(pipeline: Pipeline, settings: Orchestration | None = None) -> dg.Definitions:
    """The backlog asset (+ daily slices), its blocking checks, the live job, the switch sensor and, with a
    daily backfill, the backfill schedule of one pipeline. Resources ``spark`` and ``storage`` are bound
    by the caller's Definitions (see :func:`default_resources`)."""
    settings = settings or Orchestration()
    names = Names(pipeline)
    backlog_assets = build_backlog_assets(pipeline, settings)
    live_asset = dg.AssetSpec(
        names.live_asset,
        deps=[names.backlog],
        group_name=names.group,
        kinds={"spark", "delta"},
        description=f"The sink of {pipeline.name!r} as the live phase keeps it up to date (observed by the live job).",
    )
    backlog_job = dg.define_asset_job(
        names.backlog_job,
        selection=dg.AssetSelection.assets(names.backlog),
        executor_def=dg.in_process_executor,
        description="Backlog phase (full / increment / slices) and its blocking checks.",
    )
    live_job = build_live_job(pipeline, settings)
    jobs: list = [backlog_job, live_job]
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
    return dg.Definitions(
        assets=[*backlog_assets, live_asset],
        asset_checks=[build_backlog_checks(pipeline, settings)],
        jobs=jobs,
        sensors=[build_switch_sensor(pipeline, settings, live_job, backlog_job)],
        schedules=schedules,
    )
