"""Live end-to-end latency at a steady input rate: after a small backlog, the live phase runs with its
processing-time trigger while versions arrive every ``interval_s``; each version carries a probe key of its
own. A version's latency is the time from its source commit to the first sink commit holding its probe key,
both read afterwards from the Delta logs (commit file times) and the sink's added files — no polling, no
Spark in the measurement."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks import data, variants
from phases import synthetic
from phases.backlog import BacklogRunner
from phases.live import LiveRunner

PROBE = "~probe-"


def _commits(table: str) -> list[tuple[int, float, dict]]:
    """(version, commit time, parsed actions) of every commit in the table's log."""
    out = []
    for f in sorted(Path(table, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out.append((int(f.stem), f.stat().st_mtime, actions))
    return out


def measure(
    spark, work: Path, *, keys: int = 10_000, versions: int = 30, rows_per_version: int = 2_000, interval_s: float = 1.0
) -> dict:
    base = work / "latency"
    shutil.rmtree(base, ignore_errors=True)
    source = str(base / "source")
    data.write_source(spark, source, data.keyed_reduce_batch, keys * 5, keys, 5)
    p = variants.pipeline(source, str(base / "two_phase")).model_copy(
        update={"checkpoint_interval": timedelta(milliseconds=500)}
    )
    BacklogRunner(spark, p).run()
    live = LiveRunner.from_manifest(spark, p)
    live.start()
    try:
        for i in range(versions):
            t = time.perf_counter()
            at = synthetic.BASE_TIME + timedelta(minutes=5 + i)
            probe = spark.createDataFrame([(f"{PROBE}{i:04d}", at, 1)], synthetic.EVENT_SCHEMA)
            batch = data.keyed_reduce_batch(spark, rows_per_version, keys, 5 + i).unionByName(probe)
            synthetic.append(spark, source, batch)
            time.sleep(max(0.0, interval_s - (time.perf_counter() - t)))
        deadline = time.time() + 120
        while time.time() < deadline:
            live.raise_if_failed()
            status = live.status()["tagger"]["source_version"]
            if status is not None and status >= 5 + versions:
                break
            time.sleep(0.5)
        live.process_available()
    finally:
        live.stop()
    source_times = {v: t for v, t, _ in _commits(source)}
    seen: dict[str, float] = {}
    for _, t, actions in _commits(p.sink.path):
        for a in actions:
            add = a.get("add")
            if not add:
                continue
            keys_in = pq.read_table(str(Path(p.sink.path) / add["path"]), columns=["key"]).column("key").to_pylist()
            for k in keys_in:
                if k and k.startswith(PROBE) and k not in seen:
                    seen[k] = t
    latencies = []
    for i in range(versions):
        k = f"{PROBE}{i:04d}"
        if k in seen:
            latencies.append(seen[k] - source_times[6 + i])  # versions 1..5 hold the backlog
    latencies.sort()
    if not latencies:
        return {"versions": versions, "measured": 0}

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3)

    return {
        "versions": versions,
        "measured": len(latencies),
        "rows_per_version": rows_per_version,
        "interval_s": interval_s,
        "trigger_s": 0.5,
        "p50_s": pct(0.5),
        "p99_s": pct(0.99),
        "mean_s": round(statistics.fmean(latencies), 3),
        "max_s": round(latencies[-1], 3),
    }
