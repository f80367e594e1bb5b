"""End-to-end demo of the engine slice on embedded defaults (local Spark, local Delta tables).

Generates a synthetic keyed event table, runs the backlog as a sorted batch job, switches to the seeded
live phase, appends live data while it runs, stops it, and checks the sink against a reference computed
independently with pandas (no Spark aggregation, no engine code).
"""

from __future__ import annotations

import argparse
import shutil
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import functions as F

from phases import synthetic
from phases.backlog import BacklogRunner
from phases.definition import Aggregation, DeltaSink, DeltaSource, KeyedAggregate, Locations, Pipeline
from phases.live import LiveRunner
from phases.session import SparkSettings, build_session

DELAY = timedelta(seconds=120)


def pipeline(root: Path) -> Pipeline:
    return Pipeline(
        name="demo_events",
        source=DeltaSource(path=str(root / "source")),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=DELAY,
        operator=KeyedAggregate(
            aggregations=[
                Aggregation(name="events", kind="count"),
                Aggregation(name="total", kind="sum", column="value"),
                Aggregation(name="smallest", kind="min", column="value"),
                Aggregation(name="largest", kind="max", column="value"),
                Aggregation(name="mean", kind="avg", column="value"),
                Aggregation(name="checksum", kind="reduce", column="value", reduce="acc ^ x"),
            ]
        ),
        sink=DeltaSink(path=str(root / "sink")),
        locations=Locations(root=str(root / "pipeline")),
        checkpoint_interval=timedelta(seconds=2),
    )


def pandas_reference(changes: pd.DataFrame, delay_us: int) -> tuple[pd.DataFrame, int]:
    """Per-key results and the late count, by the version-watermark rule, in plain pandas."""
    df = changes
    vmax = df.groupby("_commit_version")["ts_us"].max().sort_index()
    prior = vmax.cummax().shift(1)  # max over earlier versions
    df["wm"] = df["_commit_version"].map(prior - delay_us)
    late = df["wm"].notna() & (df["ts_us"] <= df["wm"])
    ok = df[~late]
    g = ok.groupby("key")["value"]
    out = pd.DataFrame(
        {
            "events": g.size(),
            "total": g.sum(),
            "smallest": g.min(),
            "largest": g.max(),
            "mean": g.mean(),
            "checksum": g.agg(lambda s: np.bitwise_xor.reduce(s.to_numpy())),
        }
    )
    return out.sort_index(), int(late.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=3_000_000, help="backlog records")
    ap.add_argument("--keys", type=int, default=1_000_000, help="distinct keys")
    ap.add_argument("--backlog-versions", type=int, default=12)
    ap.add_argument("--live-versions", type=int, default=3)
    ap.add_argument("--live-rows", type=int, default=50_000, help="records per live version")
    ap.add_argument("--root", default=".data/demo")
    args = ap.parse_args()

    root = Path(args.root).resolve()
    shutil.rmtree(root, ignore_errors=True)
    p = pipeline(root)
    spark = build_session(SparkSettings())
    figures: dict[str, str] = {}

    t = time.perf_counter()
    synthetic.create_source(spark, p.source.path)
    per_version = args.rows // args.backlog_versions
    for i in range(args.backlog_versions):
        batch = synthetic.event_batch(spark, rows=per_version, keys=args.keys, batch_index=i)
        synthetic.append(spark, p.source.path, batch)
    figures["generate backlog"] = f"{time.perf_counter() - t:.1f} s ({per_version * args.backlog_versions:,} rows)"
    print(f"generated {per_version * args.backlog_versions:,} rows in {args.backlog_versions} versions")

    backlog = BacklogRunner(spark, p)
    handoff = backlog.run()
    rate = handoff.input_rows / handoff.backlog_seconds
    figures["backlog phase"] = (
        f"{handoff.backlog_seconds:.1f} s ({rate:,.0f} rows/s; "
        + ", ".join(f"{k} {v:.1f}" for k, v in backlog.timings.items() if k != "total_s")
        + ")"
    )
    print(
        f"backlog: V={handoff.source_version} keys={handoff.state_rows:,} aggregated={handoff.aggregated_rows:,} "
        f"late={handoff.late_rows:,} invalid={handoff.invalid_rows:,} final watermark={handoff.final_watermark}"
    )

    live = LiveRunner.from_manifest(spark, p)
    start = live.start()
    switch_latency = (start.first_checkpoint_at_us - handoff.created_at_us) / 1e6
    figures["switch latency"] = (
        f"{switch_latency:.1f} s (manifest committed -> first live checkpoint, {handoff.state_rows:,} keys; "
        f"queries start -> checkpoint {start.start_seconds:.1f} s)"
    )
    print(f"live: started, first checkpoint committed; watermark {live.status()['aggregate']['watermark']}")

    t = time.perf_counter()
    for i in range(args.live_versions):
        batch = synthetic.event_batch(
            spark, rows=args.live_rows, keys=args.keys, batch_index=args.backlog_versions + i, seed=11
        )
        synthetic.append(spark, p.source.path, batch)
    live.process_available()
    figures["live catch-up"] = f"{time.perf_counter() - t:.1f} s ({args.live_versions * args.live_rows:,} rows)"
    print(f"live status: {live.status()}")
    live.stop()

    t = time.perf_counter()
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(p.source.path)
        .select("key", F.unix_micros("ts").alias("ts_us"), "value", "_commit_version")
        .toPandas()
    )
    expected, expected_late = pandas_reference(changes, p.delay_us)
    actual = spark.read.format("delta").load(p.sink.path).toPandas().set_index("key").sort_index()
    late = spark.read.format("delta").load(p.locations.quarantine).filter(F.col("reason").startswith("late")).count()
    same = (
        actual.index.equals(expected.index)
        and all((actual[c] == expected[c]).all() for c in ["events", "total", "smallest", "largest", "checksum"])
        and np.allclose(actual["mean"], expected["mean"])
        and late == expected_late
    )
    figures["reference check"] = f"{time.perf_counter() - t:.1f} s"

    print("\n=== two-phase demo ===")
    for k, v in figures.items():
        print(f"{k:>18}: {v}")
    print(f"{'rows':>18}: source {len(changes):,}, sink keys {len(actual):,}, late quarantined {late:,}")
    print(f"{'equals reference':>18}: {same}")
    spark.stop()
    if not same:
        raise SystemExit("the two-phase result differs from the reference")


if __name__ == "__main__":
    main()
