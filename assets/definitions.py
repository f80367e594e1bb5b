"""The Definitions object workspace.yaml loads: the demo pipeline's backlog phase as an asset.

The engine slice keeps this thin; the Dagster orchestration issue adds the switch sensor, the live job,
partitioned backfills and asset checks.
"""

import os
from pathlib import Path

import dagster as dg

from phases.backlog import BacklogRunner
from resources.spark import SparkResource
from scripts.demo import pipeline

DATA_ROOT = Path(os.environ.get("PHASES_DATA_ROOT", Path(__file__).resolve().parent.parent / ".data" / "dagster"))
DEMO = pipeline(DATA_ROOT)


@dg.asset(name=f"{DEMO.name}_backlog", kinds={"spark", "delta"}, description="Backlog phase + handoff manifest.")
def demo_backlog(context: dg.AssetExecutionContext, spark: SparkResource) -> dg.MaterializeResult:
    handoff = BacklogRunner(spark.session(), DEMO).run()
    return dg.MaterializeResult(
        metadata={
            "manifest_id": handoff.manifest_id,
            "source_version": handoff.source_version,
            "input_rows": handoff.input_rows,
            "keys": handoff.state_rows,
            "late_rows": handoff.late_rows,
            "invalid_rows": handoff.invalid_rows,
            "final_watermark": str(handoff.final_watermark),
            "duration_s": handoff.backlog_seconds,
        }
    )


defs = dg.Definitions(
    assets=[demo_backlog],
    resources={"spark": SparkResource()},
    executor=dg.in_process_executor,
)
