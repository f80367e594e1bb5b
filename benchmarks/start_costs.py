"""The engine's fixed cost per step on a tiny pipeline: what a backlog run, a live start and one micro-batch cost
when there is almost no data, in wall seconds and Spark jobs. This is what a short test, a daily increment or a
restart pays whatever the data size, and most of what the project's test suite spends. Each step also counts the
generated classes Spark compiled and the file-system processes the JVM started (``chmod``, ``readlink``, ...: see
``--hadoop-file-systems``).

Per operator kind (keyed aggregation with the upsert sink and with the changelog sink, tumbling window), in one
warm session: a source of 20 rows in one version, the backlog, the first live start (nothing new: the switch's
record), then one new version and a restart that applies it in one micro-batch. Each is run ``repeats`` times on
fresh folders; the first run warms the JVM and is left out of the medians.

It uses only the engine's public API and :func:`phases._internal.spark_internals.jobs_submitted`, so the same script
measures another checkout: ``PYTHONPATH=<that tree> python -m benchmarks.start_costs``."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from pyspark.sql import SparkSession

from benchmarks import data
from phases._internal import spark_internals
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import (
    Aggregation,
    DeltaSink,
    DeltaSource,
    KeyedAggregate,
    Locations,
    Pipeline,
    Window,
    WindowedAggregate,
)
from phases._internal.live.runner import LiveRunner
from phases._internal.sources import synthetic

KINDS = ("keyed", "keyed_changelog", "tumbling")
# What Hadoop's local file system runs without its native library (permissions, link status, file status).
FILE_SYSTEM_COMMANDS = {"chmod", "readlink", "stat", "ls"}
AGGS = [Aggregation(name="n", kind="count"), Aggregation(name="total", kind="sum", column="value")]


def _pipeline(kind: str, base: Path) -> Pipeline:
    operator = KeyedAggregate(aggregations=AGGS)
    if kind == "tumbling":
        operator = WindowedAggregate(window=Window(size=timedelta(minutes=1)), aggregations=AGGS)
    return Pipeline(
        name=f"start_{kind}",
        source=DeltaSource(path=str(base / "source")),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=timedelta(seconds=30),
        operator=operator,
        sink=DeltaSink(path=str(base / "sink"), mode="changelog" if kind == "keyed_changelog" else "upsert"),
        locations=Locations(root=str(base / "run")),
    )


def _timed(spark: SparkSession, step, folder: Path) -> tuple[float, int, int, int]:
    """(seconds, Spark jobs, generated classes compiled, file-system processes the JVM started) of ``step()``."""
    jobs, compiled = spark_internals.jobs_submitted(spark), spark_internals.codegen_compilations(spark)
    with spark_internals.processes_started(spark, folder) as processes:
        started = time.perf_counter()
        step()
        seconds = time.perf_counter() - started
    jobs, compiled = (
        spark_internals.jobs_submitted(spark) - jobs,
        spark_internals.codegen_compilations(spark) - compiled,
    )
    return seconds, jobs, compiled, sum(1 for p in processes if p.split(" ", 1)[0] in FILE_SYSTEM_COMMANDS)


def measure_kind(spark: SparkSession, base: Path, kind: str) -> dict:
    shutil.rmtree(base, ignore_errors=True)
    pipeline = _pipeline(kind, base)
    synthetic.create_source(spark, pipeline.source.path)
    synthetic.append(spark, pipeline.source.path, data.keyed_reduce_batch(spark, 20, 5, 0))
    backlog = _timed(spark, lambda: BacklogRunner(spark, pipeline).run(), base)
    switch = _timed(spark, lambda: LiveRunner.from_manifest(spark, pipeline).start(available_now=True), base)
    synthetic.append(spark, pipeline.source.path, data.keyed_reduce_batch(spark, 20, 5, 2))
    one_batch = _timed(spark, lambda: LiveRunner.from_manifest(spark, pipeline).start(available_now=True), base)
    return {"backlog": backlog, "live start": switch, "live start + 1 micro-batch": one_batch}


def measure(spark: SparkSession, work: Path, kinds=KINDS, repeats: int = 4) -> list[dict]:
    results = []
    for kind in kinds:
        runs = [measure_kind(spark, Path(work) / f"start_{kind}_{i}", kind) for i in range(repeats)]
        warm = runs[1:] or runs
        for step in runs[0]:
            results.append(
                {
                    "kind": kind,
                    "step": step,
                    "seconds": round(statistics.median(r[step][0] for r in warm), 2),
                    "jobs": int(statistics.median(r[step][1] for r in warm)),
                    "compiled_classes": int(statistics.median(r[step][2] for r in warm)),
                    "processes": int(statistics.median(r[step][3] for r in warm)),
                    "cold_seconds": round(runs[0][step][0], 2),
                }
            )
    return results


def lines(results: list[dict]) -> list[str]:
    out = [
        "| kind | step | s (warm median) | Spark jobs | classes compiled | fs processes | s (first, cold JVM) |",
        "|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {r['kind']} | {r['step']} | {r['seconds']} | {r['jobs']} | {r['compiled_classes']} | {r['processes']} "
        f"| {r['cold_seconds']} |"
        for r in results
    ]
    return out


def main() -> None:
    from phases._internal.runtime.session import HADOOP_FILE_SYSTEMS, SparkSettings, build_session

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--codegen-cache", type=int, default=None, help="SparkSettings.codegen_cache_entries")
    parser.add_argument(
        "--hadoop-file-systems",
        action="store_true",
        help="Hadoop's own local file systems instead of the engine's (a process per chmod and readlink)",
    )
    args = parser.parse_args()
    settings = SparkSettings(shuffle_partitions=2, app_name="start-costs")
    if args.codegen_cache:
        settings = settings.model_copy(update={"codegen_cache_entries": args.codegen_cache})
    if args.hadoop_file_systems:
        settings = settings.model_copy(update={"extra_conf": {**settings.extra_conf, **HADOOP_FILE_SYSTEMS}})
    spark = build_session(settings)
    with tempfile.TemporaryDirectory(prefix="start-costs-") as work:
        results = measure(spark, Path(work), repeats=args.repeats)
    print("\n".join(lines(results)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
