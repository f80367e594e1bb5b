"""``make bench``: for each workload, on the same generated data in one process, times the stream mode
(~20 micro-batches, RocksDB, checkpoints), the one-batch stream, a plain batch job and the two-phase
framework (backlog + handoff + first live checkpoint); each variant's results are checked equal to the
plain batch job's. Writes benchmarks/results/results.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delta.tables import DeltaTable

from benchmarks import (
    data,
    growth,
    join_variants,
    kafka_avro,
    kafka_backlog,
    kafka_protobuf,
    live,
    live_kinds,
    live_peers,
    live_topics,
    memory,
    process_pass,
    process_variants,
    redeploy,
    report,
    seeding,
    variants,
)
from phases._internal.runtime.session import SparkSettings, build_session

ROOT = Path(__file__).resolve().parent.parent


def _generate(spark, base: Path, make_batch, rows: int, keys: int, versions: int, name: str) -> tuple[str, int]:
    shutil.rmtree(base, ignore_errors=True)
    source = str(base / "source")
    t = time.perf_counter()
    data.write_source(spark, source, make_batch, rows, keys, versions)
    files = int(DeltaTable.forPath(spark, source).detail().collect()[0]["numFiles"])
    print(f"[{name}] generated {rows:,} rows in {versions} versions ({files} files) in {time.perf_counter() - t:.1f} s")
    return source, files


def _recorder(spark, name: str, timings: dict, same):
    """Times a variant with its peak memory; checks its results equal the plain batch job's. ``runs`` > 1: the
    variant runs that many times in a row and the fastest counts (each run's seconds in its detail)."""

    def record(run, out: str | None, runs: int = 1) -> None:
        memory.reset(spark)
        timings_of_runs = [run() for _ in range(runs)]
        timing = min(timings_of_runs, key=lambda t: t.seconds)
        if runs > 1:
            timing.detail = {**timing.detail, "runs_s": [round(t.seconds, 2) for t in timings_of_runs]}
        peaks = memory.peaks(spark)
        equal = same(out) if out is not None else True
        timings[timing.variant] = {
            "seconds": round(timing.seconds, 2),
            "equal": equal,
            "detail": timing.detail,
            "memory": peaks,
        }
        print(f"[{name}] {timing.variant}: {timing.seconds:.1f} s, equal={equal} {timing.detail} {peaks}", flush=True)
        if not equal:
            raise SystemExit(f"{name}: {timing.variant} results differ from the plain batch job's")

    return record


def run_workload(
    spark,
    name: str,
    make_batch,
    rows: int,
    keys: int,
    versions: int,
    work: Path,
    seed: bool,
    stream_batches: int = 20,
    one_batch_stream: bool = True,
    repeats: int = 2,
) -> dict:
    """``one_batch_stream=False`` leaves out the stream in one micro-batch (the same query as the stream, without
    a per-trigger limit). ``repeats``: how many times the plain batch job and the framework run (below)."""
    base = work / name
    source, files = _generate(spark, base, make_batch, rows, keys, versions, name)
    timings: dict = {}
    record = _recorder(spark, name, timings, lambda out: variants.same_results(spark, str(base / "plain"), out))
    # The plain batch job and the framework run ``repeats`` times each (twice in `make bench`), the fastest run
    # counting: the first run of a code path in the JVM pays its class loading and JIT (the framework's first backlog
    # 14 s, its second 9-10 s), and the data's generation has already warmed the plain job's writes. The streams run
    # once: their 20 micro-batches warm up.
    record(lambda: variants.plain_batch(spark, source, str(base / "plain")), None, runs=repeats)
    p = variants.pipeline(source, str(base / "two_phase"))
    record(lambda: variants.two_phase(spark, source, str(base / "two_phase"))[0], p.sink.path, runs=repeats)
    per_trigger = max(1, math.ceil(files / stream_batches))
    out = str(base / "stream")
    record(lambda: variants.stream(spark, source, out, str(base / "stream_ckpt"), per_trigger), out)
    if one_batch_stream:
        out_one = str(base / "stream_one")
        record(lambda: variants.stream(spark, source, out_one, str(base / "stream_one_ckpt"), None), out_one)
    result = {"rows": rows, "keys": keys, "versions": versions, "files": files, "timings": timings}
    if seed:
        from phases._internal.handoff import manifest

        handoff = manifest.latest(spark, p.locations.manifests, p.name)
        state = spark.read.format("delta").load(handoff.state_path)
        state.selectExpr("key", "n__n AS n", "total__sum AS total").write.format("delta").mode("overwrite").save(
            str(base / "state_plain")
        )
        seconds, seeded = seeding.seed_with_initial_state(spark, str(base / "state_plain"), str(base / "tws"))
        result["seeding"] = {
            "keys": seeded,
            "switch_s": timings["two-phase"]["detail"]["switch_s"],
            "initial_state_s": round(seconds, 2),
        }
        print(f"[{name}] initialState seeding of {seeded:,} keys: {seconds:.1f} s", flush=True)
    return result


def _per_version(files: int, versions: int, name: str) -> int:
    """Files a micro-batch for one source version a micro-batch (every version has as many files)."""
    if files % versions:
        raise SystemExit(f"{name}: {files} files in {versions} versions: a version's files differ in number")
    return files // versions


def run_process_workload(spark, rows: int, keys: int, versions: int, work: Path) -> dict:
    """The keyed process function (value state + one event-time timer per key): an independent batch
    reference, a plain ``transformWithState`` stream with one micro-batch per version, and the framework."""
    name = "keyed_process"
    base = work / name
    source, files = _generate(spark, base, data.keyed_reduce_batch, rows, keys, versions, name)
    timings: dict = {}
    plain = str(base / "plain")
    record = _recorder(spark, name, timings, lambda out: process_variants.same_outputs(spark, f"{plain}/sink", out))
    record(lambda: process_variants.plain_batch(spark, source, plain), None)
    per_trigger = _per_version(files, versions, name)
    record(lambda: process_variants.stream(spark, source, str(base / "stream"), per_trigger), f"{base}/stream/sink")
    record(lambda: process_variants.two_phase(spark, source, str(base / "two_phase")), f"{base}/two_phase/sink")
    outputs = spark.read.format("delta").load(f"{plain}/sink").count()
    notes = [
        "plain batch: an independent reference (the change feed with commit versions folded per key in one Python "
        "pass), not the framework's code; stream: a plain `transformWithState` query (row API, event-time timers, "
        "RocksDB, checkpoint, Delta append sink), one micro-batch per version. A one-micro-batch stream is not "
        "run: its single watermark fires no timer before the end, so its sessions differ from the rules'.",
    ]
    return {
        "rows": rows, "keys": keys, "versions": versions, "files": files, "outputs": outputs, "timings": timings,
        "notes": notes,
    }  # fmt: skip


def run_join_workload(
    spark, rows: int, keys: int, versions: int, work: Path, stream_batches: int = 20, one_batch_stream: bool = True
) -> dict:
    """The interval join of two sources (``rows`` each, keys uniform, 60 s of event time a version, ±30 s):
    a plain batch range join, Spark's stream-stream join in ~20 micro-batches and in one (unless
    ``one_batch_stream`` is false), and the framework."""
    name = "interval_join"
    base = work / name
    bounds = join_variants.Bounds()
    left, files = _generate(spark, base, data.keyed_reduce_batch, rows, keys, versions, name)
    right = str(base / "right")
    data.write_source(spark, right, data.right_batch, rows, keys, versions)
    timings: dict = {}
    plain = str(base / "plain")
    record = _recorder(spark, name, timings, lambda out: join_variants.same_outputs(spark, f"{plain}/sink", out))
    record(lambda: join_variants.plain_batch(spark, left, right, plain, bounds), None)
    per_trigger = max(1, math.ceil(files / stream_batches))
    stream = str(base / "stream")
    record(lambda: join_variants.stream(spark, left, right, stream, bounds, per_trigger), f"{stream}/sink")
    if one_batch_stream:
        one = str(base / "stream_one")
        record(lambda: join_variants.stream(spark, left, right, one, bounds, None), f"{one}/sink")
    record(
        lambda: join_variants.two_phase(spark, left, right, str(base / "two_phase"), bounds), f"{base}/two_phase/sink"
    )
    outputs = spark.read.format("delta").load(f"{plain}/sink").count()
    notes = [
        "plain batch: a Spark batch range join; stream: Spark's own stream-stream join of the two Delta sources "
        "(a watermark each, RocksDB, checkpoint, Delta append sink)."
    ]
    return {
        "rows": 2 * rows, "keys": keys, "versions": versions, "files": 2 * files, "outputs": outputs,
        "timings": timings, "notes": notes,
    }  # fmt: skip


def _low_card_sources(spark, base: Path, rows: int, keys: int, versions: int) -> tuple[str, str, int]:
    left, files = _generate(spark, base, data.hourly_batch(7), rows, keys, versions, "low_cardinality_join")
    right = str(base / "right")
    data.write_source(spark, right, data.hourly_batch(11), rows, keys, versions)
    return left, right, files


def stream_growth(measured: list[tuple], rows: int) -> tuple[float, float]:
    """(exponent k of seconds ∝ rows^k through the smallest and largest measured sizes, seconds at ``rows``).
    At the sizes measured Spark's join grows about linearly although it compares every pair of a key within
    a micro-batch: the fitted power is an estimate, not a bound."""
    (n1, t1, *_), (n2, t2, *_) = measured[0], measured[-1]
    exponent = math.log(t2 / t1) / math.log(n2 / n1) if n2 != n1 else 1.0
    return exponent, t2 * (rows / n2) ** exponent


def run_low_cardinality_join(
    spark, rows: int, keys: int, versions: int, work: Path, stream_rows: list[int], stream_batches: int = 20
) -> dict:
    """The interval join on a key of few values (``keys`` <= 10, an hour of event time a version, ±1 s): the
    batch join with a hand-written time-bucket key (a range join compares every pair of a key), the framework,
    and Spark's stream-stream join, which compares every pair of a key within a micro-batch: measured at
    ``stream_rows`` rows a side and extrapolated to ``rows`` with its measured growth (:func:`stream_growth`)."""
    name = "low_cardinality_join"
    base = work / name
    bounds = join_variants.Bounds(lower=timedelta(seconds=-1), upper=timedelta(seconds=1))
    left, right, files = _low_card_sources(spark, base, rows, keys, versions)
    timings: dict = {}
    plain = str(base / "plain")
    record = _recorder(spark, name, timings, lambda out: join_variants.same_outputs(spark, f"{plain}/sink", out))
    record(lambda: join_variants.plain_batch(spark, left, right, plain, bounds, bucketed=True), None)
    record(
        lambda: join_variants.two_phase(spark, left, right, str(base / "two_phase"), bounds), f"{base}/two_phase/sink"
    )
    measured = []
    for small in stream_rows:
        sbase = work / f"{name}_{small}"
        sl, sr, sfiles = _low_card_sources(spark, sbase, small, keys, versions)
        join_variants.plain_batch(spark, sl, sr, str(sbase / "plain"), bounds, bucketed=True)
        memory.reset(spark)
        timing = join_variants.stream(
            spark, sl, sr, str(sbase / "stream"), bounds, max(1, math.ceil(sfiles / stream_batches))
        )
        equal = join_variants.same_outputs(spark, f"{sbase}/plain/sink", f"{sbase}/stream/sink")
        print(f"[{name}] stream at {small:,} rows a side: {timing.seconds:.1f} s, equal={equal}", flush=True)
        if not equal:
            raise SystemExit(f"{name}: the stream's results at {small:,} rows a side differ from the batch join's")
        measured.append((small, timing.seconds, timing.detail["micro_batches"], memory.peaks(spark)))
        shutil.rmtree(sbase, ignore_errors=True)
    exponent, estimate = stream_growth(measured, rows)
    timings["stream"] = {
        "seconds": round(estimate, 1),
        "equal": True,
        "extrapolated": True,
        "detail": {
            "micro_batches": measured[-1][2],
            "measured": "; ".join(f"{n:,} rows a side {t:.1f} s" for n, t, *_ in measured),
            "model": f"seconds ∝ rows^{exponent:.2f} (fitted on the measured sizes)",
        },
        "memory": measured[-1][3],
    }
    print(f"[{name}] stream extrapolated to {rows:,} rows a side: {estimate:.0f} s", flush=True)
    outputs = spark.read.format("delta").load(f"{plain}/sink").count()
    notes = [
        "plain batch: a Spark batch join with a hand-written one-minute bucket equi-key (a plain range join compares "
        "every pair of a key: 70 s at 100,000 rows a side). stream: Spark's stream-stream join, too slow to run at "
        "this size: measured at the sizes in its detail (results equal to the batch join of the same rows) and "
        "extrapolated with the power of the rows its time grew by between them. A one-micro-batch stream would "
        "compare all pairs of a key at once: not run.",
    ]
    return {
        "rows": 2 * rows, "keys": keys, "versions": versions, "files": 2 * files, "outputs": outputs,
        "timings": timings, "notes": notes,
    }  # fmt: skip


def run_spill(spark, source: str, work: Path, driver_memory: str) -> dict:
    """The process backlog over ``source`` in a separate JVM with ``driver_memory``; expected output from a
    plain batch pass in this (large-memory) session."""
    expected = work / "spill_expected"
    process_variants.plain_batch(spark, source, str(expected))
    cmd = [
        sys.executable, "-m", "benchmarks.spill", "--source", source, "--expected", f"{expected}/sink",
        "--work", str(work / "spill"), "--driver-memory", driver_memory,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    for line in done.stdout.splitlines():
        if line.startswith("SPILL_RESULT "):
            return json.loads(line.removeprefix("SPILL_RESULT "))
    tail = [line for line in done.stderr.splitlines() if "Error" in line or "error" in line][-3:]
    return {"driver_memory": driver_memory, "failed": True, "exit_code": done.returncode, "errors": tail}


def run_live(spark, work: Path, live_keys: str | None, quick: bool) -> list[dict]:
    """The live rows: for each state size, the switch, the per-micro-batch cost and latency at
    2,000 rows/s with the changelog sink; at the first (smallest) size also latency at 20,000 rows/s and the
    drain rate, and the same with the upsert sink."""
    sizes = [int(k) for k in (live_keys or ("20000" if quick else "1000000,10000000")).split(",")]
    runs = []
    for i, keys in enumerate(sorted(sizes)):
        # At the smallest size, the changelog sink also without its background compaction: what the plain append
        # query does (it keeps no current table), beside the sink's default.
        kinds = [("changelog", None)]
        if i == 0:
            kinds += [("changelog", timedelta(0)), ("upsert", None)]
        for mode, compact_every in kinds:
            runs.append(
                live.measure(
                    spark,
                    work,
                    state_keys=keys,
                    rates=(2_000, 20_000) if i == 0 else (2_000,),
                    versions=5 if quick else 30,
                    batches=3 if quick else 5,
                    drain_rows=(100_000 if quick else 1_000_000) if i == 0 and compact_every is None else 0,
                    sink_mode=mode,
                    compact_every=compact_every,
                )
            )
    return runs


def run_live_peers(spark, work: Path, live_keys: str | None, quick: bool) -> list[dict]:
    """The hand-written plain Spark query on the same workload, at the smallest state size of the live rows: once
    with a MERGE sink, once with an append sink (:mod:`benchmarks.live_peers`), at both rates the framework's rows
    of that size run (2,000 and 20,000 rows/s)."""
    keys = min(int(k) for k in (live_keys or ("20000" if quick else "1000000")).split(","))
    return [
        live_peers.measure(
            spark,
            work,
            mode=mode,
            state_keys=keys,
            rates=(2_000, 20_000),
            versions=5 if quick else 30,
            batches=3 if quick else 5,
            drain_rows=100_000 if quick else 1_000_000,
        )
        for mode in live_peers.SINK_MODES
    ]


def run_live_kafka(spark, work: Path, live_keys: str | None, quick: bool) -> list[dict]:
    """The live rows with the input on a Kafka topic (a local KRaft broker): at the smallest state size of the
    Delta live rows, the switch, the micro-batch cost, latency at 2,000 and 20,000 rows/s and the drain."""
    keys = min(int(k) for k in (live_keys or ("20000" if quick else "1000000")).split(","))
    return [
        live.measure(
            spark,
            work,
            state_keys=keys,
            rates=(2_000, 20_000),
            versions=5 if quick else 30,
            batches=3 if quick else 5,
            drain_rows=100_000 if quick else 1_000_000,
            source_kind="kafka",
        )
    ]


PARTS = (
    "keyed reduce", "wordcount", "keyed process", "interval join", "low-cardinality join", "growth", "live",
    "live-kinds", "live-kafka", "live-topic", "kafka-backlog", "kafka-avro", "kafka-protobuf", "process-pass", "spill",
    "redeploy", "redeploy-topic",
)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small data (CI smoke run)")
    ap.add_argument("--rows", type=int, default=None, help="keyed reduce rows (default 1e7; quick 2e5)")
    ap.add_argument("--keys", type=int, default=None, help="keyed reduce keys (default 1e6; quick 2e4)")
    ap.add_argument("--scale", type=float, default=None, help="WordCount scale of 40M rows / 4M words (default 0.25)")
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--no-seeding", action="store_true", help="skip the initialState seeding comparison")
    ap.add_argument("--process-rows", type=int, default=None, help="keyed process rows (default 1e6; quick 2e4)")
    ap.add_argument("--join-rows", type=int, default=None, help="interval join rows per input (default 1e6; quick 2e4)")
    ap.add_argument("--low-card-rows", type=int, default=None, help="low-cardinality join rows a side (default 1e6)")
    ap.add_argument(
        "--low-card-stream-rows",
        default=None,
        help="rows a side the low-cardinality stream-stream join is measured at, comma-separated "
        "(default 50000,100000)",
    )
    ap.add_argument(
        "--growth-sizes",
        default=None,
        help="keyed reduce rows of the growth curve, comma-separated (default 1e6,1e7,3e7)",
    )
    ap.add_argument(
        "--growth-stream-max",
        type=int,
        default=None,
        help="largest growth size whose stream mode runs whole (default 1e7); larger ones run 4 micro-batches",
    )
    ap.add_argument(
        "--live-keys",
        default=None,
        help="keys of state of the live runs, comma-separated (default 1000000,10000000; quick 20000); the redeploy "
        "and topic rows take the smallest",
    )
    ap.add_argument("--kafka-rows", type=int, default=None, help="rows of the Kafka-vs-Delta backlog (default 1e6)")
    ap.add_argument("--spill-memory", default="512m", help="driver memory of the spill run ('' to skip it)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument(
        "--only",
        default=None,
        help=f"comma-separated parts to (re)run, merged into the existing results.json: {', '.join(PARTS)}",
    )
    args = ap.parse_args()
    only = set(PARTS) if args.only is None else {p.strip() for p in args.only.split(",")}
    unknown = sorted(only - set(PARTS))
    if unknown:
        raise SystemExit(f"--only: unknown parts {unknown}; valid: {list(PARTS)}")
    out = Path(args.out) / ("quick" if args.quick else "")
    rows = args.rows or (200_000 if args.quick else 10_000_000)
    keys = args.keys or (20_000 if args.quick else 1_000_000)
    scale = args.scale or (0.005 if args.quick else 0.25)
    work = ROOT / ".data" / "bench"
    spark = build_session(SparkSettings(shuffle_partitions=8, driver_memory="4g"))
    now = datetime.now(UTC).isoformat(timespec="seconds")
    results = {"started": now, "machine": report.machine(), "workloads": {}}
    if args.only is not None and (out / "results.json").exists():
        results = json.loads((out / "results.json").read_text())
        results.setdefault("reruns", {}).update({part: now for part in sorted(only)})
        results.pop("latency", None)  # the earlier layout's single latency row, replaced by "live"
    elif (out / "results.json").exists():
        # A whole run starts its results afresh, but keeps the Flink rows `make bench-peers` wrote before it (dated).
        peers = json.loads((out / "results.json").read_text()).get("peers")
        if peers is not None:
            results["peers"] = peers
    try:
        if "keyed reduce" in only:
            results["workloads"]["keyed reduce"] = run_workload(
                spark, "keyed_reduce", data.keyed_reduce_batch, rows, keys, args.versions, work, not args.no_seeding
            )
        if "wordcount" in only:
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
        process_rows = args.process_rows or (20_000 if args.quick else 1_000_000)
        if "keyed process" in only:
            results["workloads"]["keyed process"] = run_process_workload(
                spark, process_rows, max(1, process_rows // 10), args.versions, work
            )  # one micro-batch a version
        join_rows = args.join_rows or (20_000 if args.quick else 1_000_000)
        if "interval join" in only:
            results["workloads"]["interval join"] = run_join_workload(
                spark, join_rows, max(1, join_rows // 10), args.versions, work
            )
        low_rows = args.low_card_rows or (20_000 if args.quick else 1_000_000)
        if "low-cardinality join" in only:
            stream_rows = [
                int(r)
                for r in (args.low_card_stream_rows or ("5000,10000" if args.quick else "50000,100000")).split(",")
            ]
            results["workloads"]["low-cardinality join"] = run_low_cardinality_join(
                spark, low_rows, 10, args.versions, work, stream_rows
            )
        if "growth" in only:
            sizes = [
                int(r)
                for r in (args.growth_sizes or ("20000,60000" if args.quick else "1000000,10000000,30000000")).split(
                    ","
                )
            ]
            whole = args.growth_stream_max or (20_000 if args.quick else 10_000_000)
            results["growth"] = growth.measure(spark, work, sizes, whole)
        if "live" in only:
            results["live"] = run_live(spark, work, args.live_keys, args.quick)
            results["live_peers"] = run_live_peers(spark, work, args.live_keys, args.quick)
        if "live-kinds" in only:
            keys = min(int(k) for k in (args.live_keys or ("2000" if args.quick else "1000000")).split(","))
            results["live_kinds"] = live_kinds.measure(spark, work, keys=keys, batches=3 if args.quick else 6)
        if "live-kafka" in only:
            results["live_kafka"] = run_live_kafka(spark, work, args.live_keys, args.quick)
        if "live-topic" in only:
            keys = min(int(k) for k in (args.live_keys or ("20000" if args.quick else "1000000")).split(","))
            results["live_topic"] = live_topics.measure(
                spark, work, state_keys=keys, versions=5 if args.quick else 30, batches=3 if args.quick else 5
            )
        if "kafka-backlog" in only:
            kafka_rows = args.kafka_rows or (100_000 if args.quick else 1_000_000)
            results["kafka_backlog"] = kafka_backlog.measure(
                spark, work, kafka_rows, max(1, kafka_rows // 10), runs=2 if args.quick else 3
            )
        if "kafka-avro" in only:
            avro_rows = args.kafka_rows or (100_000 if args.quick else 1_000_000)
            results["kafka_avro"] = kafka_avro.measure(
                spark, work, avro_rows, max(1, avro_rows // 10), runs=2 if args.quick else 3
            )
        if "kafka-protobuf" in only:
            protobuf_rows = args.kafka_rows or (100_000 if args.quick else 1_000_000)
            results["kafka_protobuf"] = kafka_protobuf.measure(
                spark, work, protobuf_rows, max(1, protobuf_rows // 10), runs=2 if args.quick else 3
            )
        if "process-pass" in only:
            pass_rows = args.process_rows or (20_000 if args.quick else 1_000_000)
            results["process_pass"] = process_pass.measure(
                spark, pass_rows, max(1, pass_rows // 10), args.versions, runs=1 if args.quick else 3
            )
        if "redeploy" in only:
            redeploy_keys = min(int(k) for k in (args.live_keys or ("20000" if args.quick else "1000000")).split(","))
            results["redeploy"] = redeploy.measure(spark, work, keys=redeploy_keys)
        if "redeploy-topic" in only:
            redeploy_keys = min(int(k) for k in (args.live_keys or ("20000" if args.quick else "1000000")).split(","))
            results["redeploy_topic"] = redeploy.measure(spark, work, keys=redeploy_keys, topic=True)
        if "spill" in only and args.spill_memory:
            results["spill"] = run_spill(spark, str(work / "keyed_reduce" / "source"), work, args.spill_memory)
            print(f"[spill] {results['spill']}", flush=True)
    finally:
        spark.stop()
    js, md, png = report.write(results, out)
    print("\n" + md.read_text())
    print(f"written: {js}, {md}, {png}")


if __name__ == "__main__":
    main()
