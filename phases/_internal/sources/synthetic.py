"""Synthetic keyed event tables for the demo, the tests and the benchmarks (deterministic by seed)."""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from phases._internal.sources.feed import EVENT_SCHEMA, create_source  # noqa: F401  (the tests and benchmarks use them here)

BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


def append(spark: SparkSession, path: str, df: DataFrame) -> None:
    df.write.format("delta").mode("append").save(path)


def event_batch(
    spark: SparkSession,
    *,
    rows: int,
    keys: int,
    batch_index: int,
    seconds_per_batch: int = 60,
    jitter_seconds: int = 30,
    late_fraction: float = 0.001,
    late_seconds: int = 600,
    seed: int = 7,
) -> DataFrame:
    """One arrival batch: event times advance ``seconds_per_batch`` per batch with jitter; a fraction of
    the records is ``late_seconds`` older (late when that exceeds the watermark delay)."""
    start = int(BASE_TIME.timestamp()) + batch_index * seconds_per_batch
    h = F.xxhash64(F.col("id"), F.lit(batch_index), F.lit(seed))
    u = (F.abs(h) % 1_000_000) / 1_000_000.0
    key_hash = F.xxhash64(F.col("id"), F.lit(batch_index), F.lit(seed + 1))
    key = F.concat(F.lit("k"), F.lpad((F.abs(key_hash) % keys).cast("string"), 7, "0"))
    offset = F.floor(F.rand(seed + batch_index) * seconds_per_batch) - F.floor(u * jitter_seconds)
    late = F.when(u < late_fraction, F.lit(late_seconds)).otherwise(F.lit(0))
    ts = F.timestamp_seconds(F.lit(start) + offset - late)
    value = (F.abs(h) % 1000).cast("long")
    return spark.range(rows).select(key.alias("key"), ts.alias("ts"), value.alias("value"))
