"""The process pass's own cost per record: what the framework adds around a user's process function.

Over the same records (key, event time, value, their source version and its watermark W(v), cached before any
timing), three passes are timed, each written to Spark's ``noop`` sink:

* **Spark alone**: the pass's shuffle by key, its sort and the Arrow transfer to a Python worker and back, the worker
  doing nothing per record (it returns no rows);
* **do-nothing function**: the framework's pass (``ProcessLogic.backlog_pass``) with a process function that keeps
  no state, sets no timer and yields nothing: what is left is the framework's own work per record and per key
  (decoding, grouping by key and version, the user's row dicts, state and timer handling, the state rows);
* **IdleTotals**: the keyed-process workload's function (value state and an idle timer per key).

µs per record = (pass - Spark alone) / records, each the median of ``runs``. Run alone with
``python -m benchmarks.process_pass`` or as the ``process-pass`` part of ``make bench``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from datetime import timedelta

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from phases._internal.definition import DeltaSink, DeltaSource, Locations, Pipeline, ProcessOperator
from phases._internal.lateness import VERSION, WATERMARK_US
from phases._internal.operators.process_pass import ProcessLogic

_START_S = 1_767_225_600  # 2026-01-01 UTC, the first record's event time
FUNCTIONS = {
    "do-nothing function": "benchmarks.functions:DoNothing",
    "IdleTotals": "benchmarks.functions:IdleTotals",
}


def records(spark: SparkSession, rows: int, keys: int, versions: int) -> DataFrame:
    """``rows`` records over ``keys`` keys in ``versions`` versions, event time advancing with the version (a second
    a record within it), W(v) a minute behind the version's start; cached and counted."""
    per_version = max(1, rows // versions)
    version = (F.col("id") / per_version).cast("long")
    frame = spark.range(rows).select(
        F.concat(F.lit("k"), F.lpad((F.abs(F.xxhash64("id")) % keys).cast("string"), 7, "0")).alias("key"),
        F.timestamp_seconds(F.lit(_START_S) + F.col("id")).alias("ts"),
        (F.col("id") % 100).alias("value"),
        version.alias(VERSION),
        ((F.lit(_START_S) + version * per_version - 60) * 1_000_000).alias(WATERMARK_US),
    )
    frame = frame.persist()
    frame.count()
    return frame


def _pipeline(function: str) -> Pipeline:
    return Pipeline(
        name="process_pass_cost",
        source=DeltaSource(path="unused"),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=timedelta(minutes=1),
        operator=ProcessOperator(function=function),
        sink=DeltaSink(path="unused"),
        locations=Locations(root="unused"),
    )


def _timed(write) -> float:
    t = time.perf_counter()
    write()
    return time.perf_counter() - t


def spark_alone(frame: DataFrame, partitions: int) -> DataFrame:
    """The pass's shuffle, sort and Arrow round trip, with nothing done per record in Python."""

    def nothing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield batch.slice(0, 0)

    ordered = frame.repartition(partitions, "key").sortWithinPartitions("key", VERSION, "ts")
    return ordered.mapInArrow(nothing, frame.schema)


def measure(spark: SparkSession, rows: int, keys: int, versions: int, runs: int = 3) -> dict:
    frame = records(spark, rows, keys, versions)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    schema = frame.drop(VERSION, WATERMARK_US).schema
    final_us = (_START_S + rows - 60) * 1_000_000  # the final watermark: timers still due fire at the end
    seconds: dict[str, list[float]] = {"Spark alone": []}
    passes = {name: ProcessLogic(spark, _pipeline(path), schema) for name, path in FUNCTIONS.items()}
    seconds.update({name: [] for name in passes})
    # Interleaved, so that a slower moment of the machine touches every variant; the first round warms the Python
    # workers and the JIT and is not counted.
    for round_ in range(runs + 1):
        alone = _timed(lambda: spark_alone(frame, partitions).write.format("noop").mode("overwrite").save())
        timed = {"Spark alone": alone}
        for name, logic in passes.items():
            passed = logic.backlog_pass(frame, final_us)
            timed[name] = _timed(lambda p=passed: p.write.format("noop").mode("overwrite").save())
        if round_:
            for name, s in timed.items():
                seconds[name].append(s)
    frame.unpersist()
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    base = medians["Spark alone"]
    result = {
        "rows": rows,
        "keys": keys,
        "versions": versions,
        "runs": runs,
        "seconds": {name: round(m, 2) for name, m in medians.items()},
        "us_per_record": {name: round((medians[name] - base) / rows * 1e6, 2) for name in passes},
    }
    return result


def lines(result: dict) -> list[str]:
    """The report's table: each pass's seconds and its cost per record beyond Spark's own."""
    out = [
        "",
        f"#### the process pass's own cost ({result['rows']:,} records, {result['keys']:,} keys, "
        f"{result['versions']} versions; median of {result['runs']})",
        "",
        "| pass | seconds | µs per record beyond Spark alone |",
        "|---|---|---|",
    ]
    for name, seconds in result["seconds"].items():
        cost = result["us_per_record"].get(name)
        out.append(f"| {name} | {seconds} | {'' if cost is None else cost} |")
    return out


def main() -> None:
    from phases._internal.runtime.session import SparkSettings, build_session

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    spark = build_session(SparkSettings(shuffle_partitions=8, driver_memory="4g"))
    try:
        print(measure(spark, args.rows, args.keys, args.versions, args.runs))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
