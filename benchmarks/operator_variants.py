"""Stream-mode and two-phase variants of any pipeline through the framework's own runners (used by the
keyed-process and interval-join workloads), and a multiset comparison of two output tables."""

from __future__ import annotations

import shutil
import time

from pyspark.sql import DataFrame, SparkSession

from benchmarks.variants import Timing
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Pipeline
from phases._internal.live.runner import LiveRunner


def stream(spark: SparkSession, p: Pipeline, files_per_trigger: int | None) -> Timing:
    """One streaming job over every version, reading ``files_per_trigger`` source files a micro-batch (None:
    one micro-batch)."""
    shutil.rmtree(p.locations.root, ignore_errors=True)
    t = time.perf_counter()
    live = LiveRunner.streaming_only(spark, p, max_files_per_trigger=files_per_trigger)
    live.start(available_now=True)
    batches = len(live.query.recentProgress)
    return Timing(
        "stream" if files_per_trigger else "stream, one batch", time.perf_counter() - t, {"micro_batches": batches}
    )


def append_to_delta(outputs: DataFrame, root: str) -> tuple[float, int]:
    """Runs a plain streaming query the way a user writes one: appending to the Delta table ``root/sink`` with
    its checkpoint under ``root``, over everything available. (seconds, micro-batches that read rows)."""
    t = time.perf_counter()
    query = (
        outputs.writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", f"{root}/checkpoint")
        .trigger(availableNow=True)
        .start(f"{root}/sink")
    )
    query.awaitTermination()
    return time.perf_counter() - t, sum(1 for p in query.recentProgress if p["numInputRows"] > 0)


def two_phase(spark: SparkSession, p: Pipeline) -> Timing:
    """Backlog phase + handoff + live start up to its first checkpoint."""
    shutil.rmtree(p.locations.root, ignore_errors=True)
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
        "state_rows": handoff.state_rows,
        **{k: round(v, 2) for k, v in runner.timings.items()},
    }
    return Timing("two-phase", total, detail)


def same_outputs(spark: SparkSession, expected: str, actual: str, columns: list[str]) -> bool:
    """The two Delta tables hold the same multiset of rows over ``columns``."""
    a = spark.read.format("delta").load(expected).select(*columns)
    b = spark.read.format("delta").load(actual).select(*columns)
    return a.count() == b.count() and a.exceptAll(b).limit(1).count() == 0 and b.exceptAll(a).limit(1).count() == 0
