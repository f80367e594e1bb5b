"""A long backlog's progress as Dagster log events: the step, Spark stage, tasks and rows every few seconds."""

import contextlib
from collections.abc import Iterator

import dagster as dg
from pyspark.sql import SparkSession

from phases import inspect

REPORT_EVERY_S = 5.0


@contextlib.contextmanager
def reporting(
    context: dg.AssetExecutionContext, spark: SparkSession, every_s: float = REPORT_EVERY_S
) -> Iterator[None]:
    """Logs a progress line every few seconds while the block runs Spark jobs (nothing while Spark is idle):
    the step the runner is in, its Spark stage, tasks done/total, input rows read and the stage's time left."""

    def log(snap: inspect.BacklogProgress) -> None:
        context.log.info(f"progress: {snap.describe()}")

    with inspect.reporting_progress(spark, log, every_s):
        yield
