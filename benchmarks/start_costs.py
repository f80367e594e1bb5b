"""The engine's fixed cost per step on a tiny pipeline: what a backlog run, a live start and one micro-batch cost
when there is almost no data, in wall seconds and Spark jobs. This is what a short test, a daily increment or a
restart pays whatever the data size, and most of what the project's test suite spends.

Per operator kind (keyed aggregation with the upsert sink and with the changelog sink, tumbling window), in one
warm session: a source of 20 rows in one version, the backlog, the first live start (nothing new: the switch's
record), then one new version and a restart that applies it in one micro-batch. Each is run ``repeats`` times on
fresh folders; the first run warms the JVM and is left out of the medians.

It uses only the engine's public API and :func:`phases.spark_internals.jobs_submitted`, so the same script measures
another checkout: ``PYTHONPATH=<that tree> python -m benchmarks.start_costs``."""

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
from phases import spark_internals
from phases.backlog.runner import BacklogRunner
from phases.definition import (
    Aggregation,
    DeltaSink,
    DeltaSource,
    KeyedAggregate,
    Locations,
    Pipeline,
    Window,
    WindowedAggregate,
)
from phases.live.runner import LiveRunner
from phases.sources import synthetic

KINDS = ("keyed", "keyed_changelog", "tumbling")
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


def _timed(spark: SparkSession, step) -> tuple[float, int]:
    jobs, started = spark_internals.jobs_submitted(spark), time.perf_counter()
    step()
    return time.perf_counter() - started, spark_internals.jobs_submitted(spark) - jobs


def measure_kind(spark: SparkSession, base: Path, kind: str) -> dict:
    shutil.rmtree(base, ignore_errors=True)
    pipeline = _pipeline(kind, base)
    synthetic.create_source(spark, pipeline.source.path)
    synthetic.append(spark, pipeline.source.path, data.keyed_reduce_batch(spark, 20, 5, 0))
    backlog = _timed(spark, lambda: BacklogRunner(spark, pipeline).run())
    switch = _timed(spark, lambda: LiveRunner.from_manifest(spark, pipeline).start(available_now=True))
    synthetic.append(spark, pipeline.source.path, data.keyed_reduce_batch(spark, 20, 5, 2))
    one_batch = _timed(spark, lambda: LiveRunner.from_manifest(spark, pipeline).start(available_now=True))
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
                    "cold_seconds": round(runs[0][step][0], 2),
                }
            )
    return results


def lines(results: list[dict]) -> list[str]:
    out = ["| kind | step | s (warm median) | Spark jobs | s (first, cold JVM) |", "|---|---|---|---|---|"]
    out += [f"| {r['kind']} | {r['step']} | {r['seconds']} | {r['jobs']} | {r['cold_seconds']} |" for r in results]
    return out


def main() -> None:
    from phases.runtime.session import SparkSettings, build_session

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    spark = build_session(SparkSettings(shuffle_partitions=2, app_name="start-costs"))
    with tempfile.TemporaryDirectory(prefix="start-costs-") as work:
        results = measure(spark, Path(work), repeats=args.repeats)
    print("\n".join(lines(results)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
