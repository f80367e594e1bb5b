"""Cost growth of the keyed reduce with the input size (``make bench`` part ``growth``): at each size (keys
scaled with the rows), the plain batch job, the two-phase framework (backlog, switch) and the stream mode
in 20 micro-batches, with the peak memory of each. A stream mode too long to run whole runs its first
micro-batches and is extrapolated from their per-batch time (said in the results)."""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

from delta.tables import DeltaTable

from benchmarks import data, memory, variants

VERSIONS = 20
STREAM_BATCHES = 20


def _timed(spark, run):
    memory.reset(spark)
    timing = run()
    return timing, memory.peaks(spark)


def measure_size(
    spark, work: Path, rows: int, stream_whole_max_rows: int, partial_batches: int, versions: int = VERSIONS
) -> dict:
    keys = max(1, rows // 10)
    base = work / f"growth_{rows}"
    shutil.rmtree(base, ignore_errors=True)
    source = str(base / "source")
    t = time.perf_counter()
    data.write_source(spark, source, data.keyed_reduce_batch, rows, keys, versions)
    files = int(DeltaTable.forPath(spark, source).detail().collect()[0]["numFiles"])
    print(f"[growth] {rows:,} rows / {keys:,} keys generated in {time.perf_counter() - t:.1f} s", flush=True)
    plain, plain_mem = _timed(spark, lambda: variants.plain_batch(spark, source, str(base / "plain")))
    (two, p), two_mem = _timed(spark, lambda: variants.two_phase(spark, source, str(base / "two_phase")))
    if not variants.same_results(spark, str(base / "plain"), p.sink.path):
        raise SystemExit(f"growth: two-phase results at {rows:,} rows differ from the plain batch job's")
    per_trigger = max(1, math.ceil(files / STREAM_BATCHES))
    batches = math.ceil(files / per_trigger)
    whole = rows <= stream_whole_max_rows or batches <= partial_batches
    out, ckpt = str(base / "stream"), str(base / "stream_ckpt")
    stream, stream_mem = _timed(
        spark,
        lambda: variants.stream(spark, source, out, ckpt, per_trigger, None if whole else partial_batches),
    )
    row = {
        "rows": rows,
        "keys": keys,
        "files": files,
        "plain_s": round(plain.seconds, 2),
        "two_phase_s": round(two.seconds, 2),
        "backlog_s": two.detail["backlog_s"],
        "switch_s": two.detail["switch_s"],
        "backlog_over_plain": round(two.detail["backlog_s"] / plain.seconds, 2),
        "memory": {"plain batch": plain_mem, "two-phase": two_mem, "stream": stream_mem},
        "stream_batches": batches,
    }
    if whole:
        if not variants.same_results(spark, str(base / "plain"), out):
            raise SystemExit(f"growth: stream results at {rows:,} rows differ from the plain batch job's")
        row["stream_s"] = round(stream.seconds, 2)
        row["stream_extrapolated"] = False
    else:
        measured = stream.detail["batch_s"]
        steady = measured[1:] or measured
        estimate = stream.seconds + sum(steady) / len(steady) * (batches - len(measured))
        row["stream_s"] = round(estimate, 1)
        row["stream_extrapolated"] = True
        row["stream_measured"] = {"batches": len(measured), "seconds": round(stream.seconds, 2), "batch_s": measured}
    print(f"[growth] {row}", flush=True)
    shutil.rmtree(base, ignore_errors=True)
    return row


def measure(
    spark, work: Path, sizes: list[int], stream_whole_max_rows: int, partial_batches: int = 4, versions: int = VERSIONS
) -> list[dict]:
    return [measure_size(spark, work, rows, stream_whole_max_rows, partial_batches, versions) for rows in sorted(sizes)]


def lines(rows: list[dict]) -> list[str]:
    out = [
        "### cost growth (keyed reduce, keys = rows / 10, 20 versions)",
        "",
        "| rows | plain batch s | backlog s | backlog ÷ plain | switch s | two-phase s | stream s | stream ÷ "
        "two-phase | peak JVM MiB (plain / two-phase / stream) | peak Python driver MiB (two-phase) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mem = r["memory"]
        stream = f"{r['stream_s']:.1f}" + (" (extrapolated)" if r["stream_extrapolated"] else "")
        out.append(
            f"| {r['rows']:,} | {r['plain_s']:.1f} | {r['backlog_s']:.1f} | {r['backlog_over_plain']:.2f}× | "
            f"{r['switch_s']:.1f} | {r['two_phase_s']:.1f} | {stream} | {r['stream_s'] / r['two_phase_s']:.1f}× | "
            f"{mem['plain batch']['jvm_peak_mib']} / {mem['two-phase']['jvm_peak_mib']} / "
            f"{mem['stream']['jvm_peak_mib']} | {mem['two-phase'].get('python_driver_peak_mib', '–')} |"
        )
    extrapolated = [r for r in rows if r["stream_extrapolated"]]
    for r in extrapolated:
        m = r["stream_measured"]
        out += [
            "",
            f"Stream mode at {r['rows']:,} rows: {m['batches']} of {r['stream_batches']} micro-batches run "
            f"({m['seconds']:.1f} s, per batch {m['batch_s']} s); the rest extrapolated at the mean of the batches "
            "after the first.",
        ]
    out.append("")
    return out


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["rows"] for r in rows]
    fig, (times, mem) = plt.subplots(1, 2, figsize=(12, 4.2))
    for label, key, color in (
        ("plain batch", "plain_s", "#888"),
        ("backlog", "backlog_s", "#4a4"),
        ("switch", "switch_s", "#58a"),
        ("stream (20 micro-batches)", "stream_s", "#c55"),
    ):
        times.plot(sizes, [r[key] for r in rows], marker="o", label=label, color=color)
    times.set_xscale("log")
    times.set_yscale("log")
    times.set_xlabel("input rows (keys = rows / 10)")
    times.set_ylabel("seconds")
    times.set_title("keyed reduce: time against input size")
    times.legend()
    for label, variant, color in (("plain batch", "plain batch", "#888"), ("two-phase", "two-phase", "#4a4"),
                                  ("stream", "stream", "#c55")):  # fmt: skip
        mem.plot(sizes, [r["memory"][variant]["jvm_peak_mib"] for r in rows], marker="o", label=f"JVM, {label}",
                 color=color)  # fmt: skip
    mem.plot(
        sizes, [r["memory"]["two-phase"].get("python_driver_peak_mib", 0) for r in rows], marker="s",
        label="Python driver, two-phase", color="#a5a", linestyle="--",
    )  # fmt: skip
    mem.set_xscale("log")
    mem.set_xlabel("input rows")
    mem.set_ylabel("peak RSS MiB")
    mem.set_title("peak memory against input size")
    mem.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
