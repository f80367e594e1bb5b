"""The four ways to process a backlog that the benchmark compares, each timed and each checked equal.

All write the same result table shape: ``key, n, total`` (count and sum per key).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from datetime import timedelta

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Aggregation, DeltaSink, DeltaSource, KeyedAggregate, Locations, Pipeline
from phases._internal.live.runner import LiveRunner


@dataclass
class Timing:
    variant: str
    seconds: float
    detail: dict


def aggregate(df: DataFrame) -> DataFrame:
    """The keyed reduce every variant computes: per key, the count of records and the sum of their values."""
    return df.groupBy("key").agg(F.count(F.lit(1)).alias("n"), F.sum("value").alias("total"))


def plain_batch(spark: SparkSession, source: str, out: str) -> Timing:
    """The limit: one batch job, no state handed on."""
    t = time.perf_counter()
    aggregate(spark.read.format("delta").load(source)).write.format("delta").mode("overwrite").save(out)
    return Timing("plain batch", time.perf_counter() - t, {})


def _merge(out: str):
    def upsert(batch: DataFrame, batch_id: int) -> None:
        DeltaTable.forPath(batch.sparkSession, out).alias("t").merge(
            batch.alias("s"), "t.key = s.key"
        ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()

    return upsert


def stream(
    spark: SparkSession,
    source: str,
    out: str,
    checkpoint: str,
    files_per_trigger: int | None,
    max_batches: int | None = None,
) -> Timing:
    """What a user runs today: one streaming aggregation over the backlog (RocksDB state, checkpoints),
    upserting into a Delta sink; ``files_per_trigger`` None = as few micro-batches as possible.
    ``max_batches``: stop after that many micro-batches (the detail then has each batch's seconds)."""
    shutil.rmtree(checkpoint, ignore_errors=True)
    spark.createDataFrame([], "key string, n long, total long").write.format("delta").mode("overwrite").save(out)
    reader = spark.readStream.format("delta")
    if files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", files_per_trigger)
    t = time.perf_counter()
    writer = aggregate(reader.load(source)).writeStream.outputMode("update").foreachBatch(_merge(out))
    writer = writer.option("checkpointLocation", checkpoint)
    if max_batches is None:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime="0 seconds").start()
        while (query.lastProgress or {}).get("batchId", -1) < max_batches - 1:
            if query.exception() is not None:
                raise query.exception()
            time.sleep(0.2)
        query.stop()
    seconds = time.perf_counter() - t
    batches = len(query.recentProgress)
    detail: dict = {"micro_batches": batches}
    if max_batches is not None:
        detail["batch_s"] = [round(p["durationMs"]["triggerExecution"] / 1000, 2) for p in query.recentProgress]
    return Timing("stream" if files_per_trigger else "stream, one batch", seconds, detail)


def pipeline(source: str, root: str) -> Pipeline:
    return Pipeline(
        name="bench",
        source=DeltaSource(path=source),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=timedelta(minutes=10),
        operator=KeyedAggregate(
            aggregations=[Aggregation(name="n", kind="count"), Aggregation(name="total", kind="sum", column="value")]
        ),
        sink=DeltaSink(path=f"{root}/sink"),
        locations=Locations(root=root),
    )


def two_phase(spark: SparkSession, source: str, root: str) -> tuple[Timing, Pipeline]:
    """This framework: backlog phase + handoff + live start (first checkpoint committed)."""
    shutil.rmtree(root, ignore_errors=True)
    p = pipeline(source, root)
    t = time.perf_counter()
    runner = BacklogRunner(spark, p)
    handoff = runner.run()
    backlog_s = time.perf_counter() - t
    live = LiveRunner.from_manifest(spark, p)
    start = live.start()
    total = time.perf_counter() - t
    live.stop()
    detail = {
        "backlog_s": round(backlog_s, 2),
        "switch_s": round(start.start_seconds, 2),
        "keys": handoff.state_rows,
        **{k: round(v, 2) for k, v in runner.timings.items()},
    }
    return Timing("two-phase", total, detail), p


def same_results(spark: SparkSession, expected: str, actual: str | DataFrame) -> bool:
    """The keyed-reduce result table ``expected`` holds the rows of ``actual`` (a Delta table or a DataFrame)."""
    a = spark.read.format("delta").load(expected).select("key", "n", "total")
    b = (spark.read.format("delta").load(actual) if isinstance(actual, str) else actual).select("key", "n", "total")
    return a.count() == b.count() and a.exceptAll(b).limit(1).count() == 0
