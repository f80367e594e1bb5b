"""The interval-join workloads' variants: every (left, right) pair of one key with
``left.ts + lower <= right.ts <= left.ts + upper``.

* plain batch: a Spark batch join of the two tables (the generated data has no late records), written to Delta;
* stream: what a user would run instead of this framework, a plain Spark stream-stream join of the two Delta
  sources with a watermark on each, RocksDB state, a checkpoint, appending to a Delta table, in the same
  number of micro-batches as the other stream modes (or one);
* two-phase: this framework (backlog, handoff, live start).

Outputs are compared as multisets."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks import operator_variants
from benchmarks.variants import Timing
from phases._internal.definition import DeltaSink, DeltaSource, IntervalJoin, Locations, Pipeline

COLUMNS = ["key", "ts", "value", "right_ts", "right_value"]
DELAY = timedelta(minutes=1)


@dataclass(frozen=True)
class Bounds:
    """The join's interval, and the framework's bucket (None: its default)."""

    lower: timedelta = timedelta(seconds=-30)
    upper: timedelta = timedelta(seconds=30)
    bucket: timedelta | None = None


def pipeline(left: str, right: str, root: str, bounds: Bounds) -> Pipeline:
    return Pipeline(
        name="bench_join",
        source=DeltaSource(path=left),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=DELAY,
        operator=IntervalJoin(
            right=DeltaSource(path=right), lower=bounds.lower, upper=bounds.upper, bucket=bounds.bucket
        ),
        sink=DeltaSink(path=f"{root}/sink"),
        locations=Locations(root=root),
    )


def _condition(bounds: Bounds) -> Column:
    lower, upper = (int(b / timedelta(milliseconds=1)) for b in (bounds.lower, bounds.upper))
    return (
        (F.col("l.key") == F.col("r.key"))
        & (F.col("r.ts") >= F.col("l.ts") + F.expr(f"INTERVAL {lower} MILLISECONDS"))
        & (F.col("r.ts") <= F.col("l.ts") + F.expr(f"INTERVAL {upper} MILLISECONDS"))
    )


def _output(left: DataFrame, right: DataFrame, condition: Column) -> DataFrame:
    return (
        left.alias("l")
        .join(right.alias("r"), condition)
        .select(
            F.col("l.key").alias("key"),
            F.col("l.ts").alias("ts"),
            F.col("l.value").alias("value"),
            F.col("r.ts").alias("right_ts"),
            F.col("r.value").alias("right_value"),
        )
    )


def _pairs(left: DataFrame, right: DataFrame, bounds: Bounds) -> DataFrame:
    return _output(left, right, _condition(bounds))


HAND_BUCKET = timedelta(minutes=1)


def _hand_bucketed_pairs(left: DataFrame, right: DataFrame, bounds: Bounds) -> DataFrame:
    """What a user writes when a key has few values: a bucket equi-key, each left row repeated for every
    bucket its interval touches (written here, independent of the framework's bucketing)."""
    width = HAND_BUCKET // timedelta(microseconds=1)
    lower, upper = (b // timedelta(microseconds=1) for b in (bounds.lower, bounds.upper))
    us = F.unix_micros(F.col("ts"))
    lb = left.withColumn("bucket", F.explode(F.sequence(F.floor((us + lower) / width), F.floor((us + upper) / width))))
    rb = right.withColumn("bucket", F.floor(us / width))
    return _output(lb, rb, _condition(bounds) & (F.col("l.bucket") == F.col("r.bucket")))


def plain_batch(spark: SparkSession, left: str, right: str, out: str, bounds: Bounds, bucketed: bool = False) -> Timing:
    """A batch join of the two tables as they are now, written to a Delta table: a range join, or with a
    hand-written bucket key (``bucketed``)."""
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    lt, rt = (spark.read.format("delta").load(p) for p in (left, right))
    pairs = _hand_bucketed_pairs(lt, rt, bounds) if bucketed else _pairs(lt, rt, bounds)
    pairs.write.format("delta").save(f"{out}/sink")
    join = f"bucket key ({HAND_BUCKET.total_seconds():.0f} s)" if bucketed else "range join"
    return Timing("plain batch", time.perf_counter() - t, {"join": join})


def stream(
    spark: SparkSession, left: str, right: str, root: str, bounds: Bounds, files_per_trigger: int | None
) -> Timing:
    """Spark's own stream-stream join over both sources from their first version: ``files_per_trigger``
    files of each a micro-batch (None: one micro-batch)."""
    shutil.rmtree(root, ignore_errors=True)

    def read(path: str) -> DataFrame:
        reader = spark.readStream.format("delta")
        if files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", files_per_trigger)
        return reader.load(path).withWatermark("ts", f"{int(DELAY.total_seconds())} seconds")

    seconds, batches = operator_variants.append_to_delta(_pairs(read(left), read(right), bounds), root)
    return Timing("stream" if files_per_trigger else "stream, one batch", seconds, {"micro_batches": batches})


def two_phase(spark: SparkSession, left: str, right: str, root: str, bounds: Bounds) -> Timing:
    p = pipeline(left, right, root, bounds)
    timing = operator_variants.two_phase(spark, p)
    timing.detail["bucket_s"] = p.operator.bucket_width.total_seconds()
    return timing


def same_outputs(spark: SparkSession, expected: str, actual: str) -> bool:
    return operator_variants.same_outputs(spark, expected, actual, COLUMNS)
