"""The interval-join workload's variants: every (left, right) pair of one key with
``left.ts + LOWER <= right.ts <= left.ts + UPPER`` as a plain Spark batch join of the two sources, as one
streaming job (the framework's own live path from the first versions, ~20 micro-batches or one)
and as the two-phase framework. Outputs are compared as multisets."""

from __future__ import annotations

import shutil
import time
from datetime import timedelta

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks import operator_variants
from benchmarks.variants import Timing
from phases.definition import DeltaSink, DeltaSource, IntervalJoin, Locations, Pipeline

LOWER, UPPER = timedelta(seconds=-30), timedelta(seconds=30)
COLUMNS = ["key", "ts", "value", "right_ts", "right_value"]


def pipeline(left: str, right: str, root: str) -> Pipeline:
    return Pipeline(
        name="bench_join",
        source=DeltaSource(path=left),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=timedelta(minutes=1),
        operator=IntervalJoin(right=DeltaSource(path=right), lower=LOWER, upper=UPPER),
        sink=DeltaSink(path=f"{root}/sink"),
        locations=Locations(root=root),
    )


def plain_batch(spark: SparkSession, left: str, right: str, out: str) -> Timing:
    """A batch join of the two tables as they are now (the generated data has no late records)."""
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    lt = spark.read.format("delta").load(left).alias("l")
    rt = spark.read.format("delta").load(right).alias("r")
    cond = (
        (F.col("l.key") == F.col("r.key"))
        & (F.col("r.ts") >= F.col("l.ts") + F.expr(f"INTERVAL {int(LOWER.total_seconds())} SECONDS"))
        & (F.col("r.ts") <= F.col("l.ts") + F.expr(f"INTERVAL {int(UPPER.total_seconds())} SECONDS"))
    )
    pairs = lt.join(rt, cond).select(
        F.col("l.key").alias("key"),
        F.col("l.ts").alias("ts"),
        F.col("l.value").alias("value"),
        F.col("r.ts").alias("right_ts"),
        F.col("r.value").alias("right_value"),
    )
    pairs.write.format("delta").save(f"{out}/sink")
    return Timing("plain batch", time.perf_counter() - t, {})


def stream(spark: SparkSession, left: str, right: str, root: str, files_per_trigger: int | None) -> Timing:
    return operator_variants.stream(spark, pipeline(left, right, root), files_per_trigger)


def two_phase(spark: SparkSession, left: str, right: str, root: str) -> Timing:
    return operator_variants.two_phase(spark, pipeline(left, right, root))


def same_outputs(spark: SparkSession, expected: str, actual: str) -> bool:
    return operator_variants.same_outputs(spark, expected, actual, COLUMNS)
