"""A backfill run in its own process (``python -m tests.phases_dagster.backfill_child ROOT FIRST_DAY LAST_DAY``),
so that a test can kill it mid-way like a crashed machine. Runs persist in ``$DAGSTER_HOME``."""

from __future__ import annotations

import sys
from datetime import date

import dagster as dg

from phases_dagster.factory import pipeline_definitions
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import CheckPolicy, DailyBackfill, Names, Orchestration
from tests.phases_dagster.conftest import relative_pipeline

START = date(2026, 3, 1)
PIPELINE = relative_pipeline(delay_s=5)
SETTINGS = Orchestration(backfill=DailyBackfill(start_date=START), checks=CheckPolicy(max_quarantine_fraction=0.5))


def definitions(root: str, spark_resource: SparkResource) -> dg.Definitions:
    resources = {"spark": spark_resource, "storage": StorageResource(root=root)}
    return dg.Definitions.merge(
        pipeline_definitions(PIPELINE, SETTINGS), dg.Definitions(resources=resources, executor=dg.in_process_executor)
    )


def range_tags(first: str, last: str) -> dict[str, str]:
    return {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}


def main() -> None:
    root, first, last = sys.argv[1:4]
    defs = definitions(root, SparkResource(shuffle_partitions=2))
    job = defs.resolve_job_def(Names(PIPELINE).slices_job)
    with dg.DagsterInstance.get() as instance:
        result = job.execute_in_process(instance=instance, tags=range_tags(first, last))
    sys.exit(0 if result.success else 1)


if __name__ == "__main__":
    main()
