"""Testing a pipeline's Dagster assets in pytest: materialize its backlog asset with its checks on a
throwaway Dagster instance, with the test's SparkSession and a scratch storage root.

Next to :mod:`phases.testing` (the Spark-level pytest kit, which never imports Dagster)::

    from phases_dagster.testing import materialize_backlog

    def test_my_pipeline_hands_off_with_passing_checks(phases_spark, delta_source, tmp_path):
        ...
        result = materialize_backlog(phases_spark, my_pipeline, root=tmp_path)
        assert result.success and all(result.checks.values()), result.checks
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pyspark.sql import SparkSession

from phases import Pipeline
from phases_dagster.factory import pipeline_definitions
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names, Orchestration


@dataclass(frozen=True)
class BacklogMaterialization:
    success: bool
    checks: dict[str, bool]  # check name -> passed (a WARN check that did not pass is False too)
    metadata: dict[str, object]  # the backlog materialization's metadata values
    result: dg.ExecuteInProcessResult


def materialize_backlog(
    spark: SparkSession,
    pipeline: Pipeline,
    *,
    root: str | Path,
    settings: Orchestration | None = None,
    instance: dg.DagsterInstance | None = None,
) -> BacklogMaterialization:
    """Runs the pipeline's backlog job (its asset and checks) in process. Relative paths of ``pipeline``
    resolve under ``root`` (as :class:`resources.storage.StorageResource` does); the run uses ``spark`` and
    leaves it running. Without ``instance``, a throwaway SQLite instance."""
    # build_session in a process that already has a session returns that one (getOrCreate); the run
    # leaves it running.
    shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))  # pyright: ignore[reportArgumentType]
    resources = {
        "spark": SparkResource(shuffle_partitions=shuffle, stop_after_run=False),
        "storage": StorageResource(root=str(root)),
    }
    defs = dg.Definitions.merge(
        pipeline_definitions(pipeline, settings),
        dg.Definitions(resources=resources, executor=dg.in_process_executor),
    )
    job = defs.resolve_job_def(Names(pipeline).backlog_job)
    if instance is None:
        with dg.instance_for_test() as throwaway:
            return _run(job, throwaway, pipeline)
    return _run(job, instance, pipeline)


def _run(job: dg.JobDefinition, instance: dg.DagsterInstance, pipeline: Pipeline) -> BacklogMaterialization:
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    metadata: dict[str, object] = {}
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        if materialization.asset_key == dg.AssetKey(Names(pipeline).backlog):
            metadata = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    return BacklogMaterialization(result.success, checks, metadata, result)
