"""Deterministic benchmark inputs: Delta tables with the change data feed, written in a fixed number of versions."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from phases._internal.sources import synthetic


def keyed_reduce_batch(spark: SparkSession, rows: int, keys: int, index: int) -> DataFrame:
    """FLIP-327's shape: (key, ts, value) with keys uniform over ``keys``; event time advancing per version."""
    return synthetic.event_batch(spark, rows=rows, keys=keys, batch_index=index, late_fraction=0.0, jitter_seconds=0)


def right_batch(spark: SparkSession, rows: int, keys: int, index: int) -> DataFrame:
    """The second input of the interval-join workload: the same shape and key space, other draws."""
    return synthetic.event_batch(
        spark, rows=rows, keys=keys, batch_index=index, late_fraction=0.0, jitter_seconds=0, seed=11
    )


def hourly_batch(seed: int):
    """The low-cardinality join's inputs: an hour of event time a version, so that a key's rows are spread
    thin in time (seed 7 left, 11 right)."""

    def batch(spark: SparkSession, rows: int, keys: int, index: int) -> DataFrame:
        return synthetic.event_batch(
            spark,
            rows=rows,
            keys=keys,
            batch_index=index,
            seconds_per_batch=3600,
            late_fraction=0.0,
            jitter_seconds=0,
            seed=seed,
        )

    return batch


def wordcount_batch(spark: SparkSession, rows: int, words: int, index: int) -> DataFrame:
    """WordCount's shape: string keys with a skewed (Zipf-like) frequency, value 1."""
    u = (F.abs(F.xxhash64(F.col("id"), F.lit(index), F.lit(3))) % 1_000_000 + 1) / 1_000_001.0
    rank = F.floor(F.pow(F.lit(words), u)).cast("long")  # log-uniform ranks: a few words are very frequent
    return spark.range(rows).select(
        F.concat(F.lit("w"), rank.cast("string")).alias("key"),
        F.timestamp_seconds(F.lit(int(synthetic.BASE_TIME.timestamp()) + index * 60) + F.col("id") % 60).alias("ts"),
        F.lit(1).cast("long").alias("value"),
    )


def write_source(spark: SparkSession, path: str, make_batch, rows: int, keys: int, versions: int) -> None:
    synthetic.create_source(spark, path)
    per = rows // versions
    for i in range(versions):
        synthetic.append(spark, path, make_batch(spark, per, keys, i))
