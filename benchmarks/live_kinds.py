"""The live phase's cost per micro-batch for every operator kind, with a large state (every kind keeps its live
state in Spark's state store).

Per kind, a backlog leaves ``state_keys`` keys of state open (one record per key, all within the first hour of event
time: each key's open window, open session, process state with a pending timer, held join rows, open co-group
window); the live phase then applies ``batches`` versions of ``batch_rows`` rows on random keys of the same key
space, one version per micro-batch, and the median trigger time of those micro-batches (Spark's progress) is the
kind's figure. Windows and sessions stay open during the run (an hour's window, a 30-minute gap), so the figure is
the cost of updating a large state, not of emitting.

It uses only the engine's public API, so the same script measures another checkout of the engine on the same
workload: ``PYTHONPATH=<that tree> python -m benchmarks.live_kinds`` (how the Delta-state rows of
``docs/benchmarks.md`` were measured, on the last commit before the move)."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from datetime import timedelta
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks import data
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import (
    Aggregation,
    CoGroup,
    DeltaSink,
    DeltaSource,
    IntervalJoin,
    Locations,
    Pipeline,
    ProcessOperator,
    SessionAggregate,
    Window,
    WindowedAggregate,
)
from phases._internal.live.runner import LiveRunner
from phases._internal.sources import synthetic

KINDS = ("tumbling", "session", "process", "interval_join", "co_group")
AGGS = [Aggregation(name="n", kind="count"), Aggregation(name="total", kind="sum", column="value")]
DELAY = timedelta(minutes=10)
SEED_VERSIONS = 4


def _operator(kind: str, right: str):
    if kind == "tumbling":
        return WindowedAggregate(window=Window(size=timedelta(hours=1)), aggregations=AGGS)
    if kind == "session":
        return SessionAggregate(gap=timedelta(minutes=30), aggregations=AGGS)
    if kind == "process":
        return ProcessOperator(function="benchmarks.functions:DayIdleTotals")
    if kind == "interval_join":
        return IntervalJoin(right=DeltaSource(path=right), lower=timedelta(hours=-1), upper=timedelta(hours=1))
    return CoGroup(
        right=DeltaSource(path=right),
        window=Window(size=timedelta(hours=1)),
        function="benchmarks.functions:window_counts",
        output_schema="left_n long, right_n long",
    )


def _seed(spark: SparkSession, source: str, keys: int, offset_s: int = 0) -> None:
    """``keys`` distinct keys, one record each, over the first minutes of event time, in SEED_VERSIONS versions."""
    synthetic.create_source(spark, source)
    per = -(-keys // SEED_VERSIONS)
    base = int(synthetic.BASE_TIME.timestamp()) + offset_s
    for i in range(SEED_VERSIONS):
        ids = spark.range(i * per, min(keys, (i + 1) * per))
        synthetic.append(
            spark,
            source,
            ids.select(
                F.concat(F.lit("k"), F.lpad(F.col("id").cast("string"), 7, "0")).alias("key"),
                F.timestamp_seconds(F.lit(base + i * 60) + F.col("id") % 60).alias("ts"),
                (F.col("id") % 1000).alias("value"),
            ),
        )


def measure_kind(
    spark: SparkSession,
    base: Path,
    kind: str,
    keys: int,
    batches: int,
    rows: int,
    interval: timedelta = timedelta(seconds=5),
) -> dict:
    """One kind; ``interval``: the live phase's trigger interval (the micro-batch's cost does not depend on it: a
    shorter one only waits less for each trigger)."""
    source, right = str(base / "source"), str(base / "right")
    _seed(spark, source, keys)
    if kind in ("interval_join", "co_group"):
        _seed(spark, right, keys, offset_s=30)
    pipeline = Pipeline(
        name=f"live_{kind}",
        source=DeltaSource(path=source),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=DELAY,
        operator=_operator(kind, right),
        sink=DeltaSink(path=str(base / "sink")),
        locations=Locations(root=str(base / "run")),
        checkpoint_interval=interval,
    )
    started = time.perf_counter()
    backlog = BacklogRunner(spark, pipeline)
    backlog.run()
    backlog_s = time.perf_counter() - started
    live = LiveRunner.from_manifest(spark, pipeline)
    started = time.perf_counter()
    live.start()
    switch_s = time.perf_counter() - started
    costs = []
    try:
        for index in range(SEED_VERSIONS, SEED_VERSIONS + batches):
            synthetic.append(spark, source, data.keyed_reduce_batch(spark, rows, keys, index))
            live.process_available()
            progress = [p for p in live.query.recentProgress if p["numInputRows"] > 0]
            costs.append(progress[-1]["durationMs"]["triggerExecution"] / 1000)
    finally:
        live.stop()
    warm = costs[1:] or costs
    return {
        "kind": kind,
        "state_keys": keys,
        "batch_rows": rows,
        "backlog_s": round(backlog_s, 2),
        # Of the backlog: writing the store's version 1 (the live phase's starting state).
        "store_write_s": round(backlog.timings.get("live_state_s", 0.0), 2),
        "switch_s": round(switch_s, 2),
        "micro_batch_s": round(statistics.median(warm), 2),
        "micro_batches_s": [round(c, 2) for c in costs],
    }


def measure(
    spark: SparkSession,
    work: Path,
    kinds=KINDS,
    keys: int = 1_000_000,
    batches: int = 6,
    rows: int = 2_000,
    interval: timedelta = timedelta(seconds=5),
) -> list[dict]:
    """Every kind in ``kinds`` in turn (its folder removed afterwards)."""
    results = []
    for kind in kinds:
        base = Path(work) / f"live_kind_{kind}"
        shutil.rmtree(base, ignore_errors=True)
        result = measure_kind(spark, base, kind, keys, batches, rows, interval)
        print(f"[live-kinds] {json.dumps(result)}", flush=True)
        results.append(result)
        shutil.rmtree(base, ignore_errors=True)
    return results


def lines(results: list[dict]) -> list[str]:
    """The report's table: per kind, the micro-batch cost with its state size."""
    first = results[0]
    out = [
        f"### live phase per operator kind ({first['state_keys']:,} keys of state, {first['batch_rows']:,}-row "
        "micro-batches, state in the run's state store)",
        "",
        "| kind | backlog s | of it: store version 1 s | switch s | micro-batch s (median) |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| {r['kind']} | {r['backlog_s']} | {r.get('store_write_s', '')} | {r['switch_s']} | {r['micro_batch_s']} |"
        for r in results
    ]
    return [*out, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {list(KINDS)}")
    parser.add_argument("--work", default="/tmp/live-kinds")
    parser.add_argument("--out", default=None, help="a JSON file for the results")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit(f"unknown kinds {unknown}; valid: {list(KINDS)}")
    from phases._internal.runtime.session import SparkSettings, build_session

    spark = build_session(SparkSettings(shuffle_partitions=8, driver_memory="4g", app_name="live-kinds"))
    results = measure(spark, Path(args.work), kinds, args.keys, args.batches, args.rows)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
