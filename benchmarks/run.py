"""``make bench``: for each workload, on the same generated data in one process, times the stream mode
(~20 micro-batches, RocksDB, checkpoints), the one-batch stream, a plain batch job and the two-phase
framework (backlog + handoff + first live checkpoint); each variant's results are checked equal to the
plain batch job's. Writes benchmarks/results/results.{json,md,png}."""

from __future__ import annotations

import argparse
import math
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from delta.tables import DeltaTable

from benchmarks import data, report, seeding, variants
from phases.session import SparkSettings, build_session

ROOT = Path(__file__).resolve().parent.parent


def run_workload(spark, name: str, make_batch, rows: int, keys: int, versions: int, work: Path, seed: bool) -> dict:
    base = work / name
    shutil.rmtree(base, ignore_errors=True)
    source = str(base / "source")
    t = time.perf_counter()
    data.write_source(spark, source, make_batch, rows, keys, versions)
    files = int(DeltaTable.forPath(spark, source).detail().collect()[0]["numFiles"])
    print(f"[{name}] generated {rows:,} rows in {versions} versions ({files} files) in {time.perf_counter() - t:.1f} s")
    timings: dict = {}

    def record(timing, out: str) -> None:
        equal = variants.same_results(spark, str(base / "plain"), out) if timing.variant != "plain batch" else True
        timings[timing.variant] = {"seconds": round(timing.seconds, 2), "equal": equal, "detail": timing.detail}
        print(f"[{name}] {timing.variant}: {timing.seconds:.1f} s, equal={equal} {timing.detail}", flush=True)
        if not equal:
            raise SystemExit(f"{name}: {timing.variant} results differ from the plain batch job's")

    record(variants.plain_batch(spark, source, str(base / "plain")), str(base / "plain"))
    per_trigger = max(1, math.ceil(files / 20))
    out = str(base / "stream")
    record(variants.stream(spark, source, out, str(base / "stream_ckpt"), per_trigger), out)
    out = str(base / "stream_one")
    record(variants.stream(spark, source, out, str(base / "stream_one_ckpt"), None), out)
    timing, p = variants.two_phase(spark, source, str(base / "two_phase"))
    record(timing, p.sink.path)
    result = {"rows": rows, "keys": keys, "versions": versions, "files": files, "timings": timings}
    if seed:
        from phases import manifest

        handoff = manifest.latest(spark, p.locations.manifests, p.name)
        state = spark.read.format("delta").load(handoff.state_path)
        state.selectExpr("key", "n__n AS n", "total__sum AS total").write.format("delta").mode("overwrite").save(
            str(base / "state_plain")
        )
        seconds, seeded = seeding.seed_with_initial_state(spark, str(base / "state_plain"), str(base / "tws"))
        result["seeding"] = {
            "keys": seeded,
            "native_s": timings["two-phase"]["detail"]["switch_s"],
            "initial_state_s": round(seconds, 2),
        }
        print(f"[{name}] initialState seeding of {seeded:,} keys: {seconds:.1f} s", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small data (CI smoke run)")
    ap.add_argument("--rows", type=int, default=None, help="keyed reduce rows (default 1e7; quick 2e5)")
    ap.add_argument("--keys", type=int, default=None, help="keyed reduce keys (default 1e6; quick 2e4)")
    ap.add_argument("--scale", type=float, default=None, help="WordCount scale of 40M rows / 4M words (default 0.25)")
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--no-seeding", action="store_true", help="skip the initialState seeding comparison")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    rows = args.rows or (200_000 if args.quick else 10_000_000)
    keys = args.keys or (20_000 if args.quick else 1_000_000)
    scale = args.scale or (0.005 if args.quick else 0.25)
    work = ROOT / ".data" / "bench"
    spark = build_session(SparkSettings(shuffle_partitions=8, driver_memory="4g"))
    results = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "machine": report.machine(), "workloads": {}}
    try:
        results["workloads"]["keyed reduce"] = run_workload(
            spark, "keyed_reduce", data.keyed_reduce_batch, rows, keys, args.versions, work, not args.no_seeding
        )
        results["workloads"]["wordcount"] = run_workload(
            spark,
            "wordcount",
            data.wordcount_batch,
            int(40_000_000 * scale),
            int(4_000_000 * scale),
            args.versions,
            work,
            False,
        )
    finally:
        spark.stop()
    out = Path(args.out) / ("quick" if args.quick else "")
    js, md, png = report.write(results, out)
    print("\n" + md.read_text())
    print(f"written: {js}, {md}, {png}")


if __name__ == "__main__":
    main()
