"""Benchmark output: JSON, a Markdown table with ratios, and a PNG chart, side by side per workload."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import pyspark


def machine() -> dict:
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    except (OSError, IndexError):
        java = "unknown"
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "java": java,
    }


def markdown(results: dict) -> str:
    lines = [
        f"Machine: {results['machine']['cpus']} CPUs, {results['machine']['memory_gib']} GiB, "
        f"{results['machine']['java']}, pyspark {results['machine']['pyspark']}; {results['started']}",
        "",
    ]
    if results.get("reruns"):
        reruns = ", ".join(f"{part} at {at}" for part, at in results["reruns"].items())
        lines += [f"Re-run in a later process on the same machine (`--only`): {reruns}.", ""]
    for name, w in results["workloads"].items():
        outputs = f", {w['outputs']:,} output rows" if "outputs" in w else ""
        lines += [f"### {name} ({w['rows']:,} rows, {w['keys']:,} keys, {w['versions']} versions{outputs})", ""]
        lines += [
            "| variant | seconds | × plain batch | stream mode ÷ variant | results equal | peak JVM / Python MiB "
            "| detail |",
            "|---|---|---|---|---|---|---|",
        ]
        plain = w["timings"]["plain batch"]["seconds"]
        stream = w["timings"].get("stream", {}).get("seconds")
        for variant, t in w["timings"].items():
            ratio = t["seconds"] / plain if plain else float("nan")
            speed = f"{stream / t['seconds']:.1f}×" if stream else "–"
            detail = ", ".join(f"{k} {v}" for k, v in t.get("detail", {}).items())
            mem = t.get("memory") or {}
            peak = f"{mem.get('jvm_peak_mib', '–')} / {mem.get('python_worker_peak_mib', '–')}"
            if t.get("extrapolated"):
                variant = f"{variant} (extrapolated)"
            lines.append(
                f"| {variant} | {t['seconds']:.1f} | {ratio:.2f}× | {speed} | {t['equal']} | {peak} | {detail} |"
            )
        for note in w.get("notes", []):
            lines += ["", note]
        if "seeding" in w:
            s = w["seeding"]
            s.setdefault("switch_s", s.get("native_s"))  # results written before the one-query live phase
            lines += [
                "",
                f"Switch with {s['keys']:,} keys of state: the framework's live start up to its first checkpoint "
                f"{s['switch_s']:.1f} s vs seeding `transformWithState(initialState)` {s['initial_state_s']:.1f} s "
                f"({s['initial_state_s'] / s['switch_s']:.1f}× slower).",
            ]
        lines.append("")
    if results.get("peers"):
        lines += peer_lines(results["peers"])
    if results.get("growth"):
        from benchmarks import growth

        lines += growth.lines(results["growth"])
    if results.get("live"):
        lines += _live_lines(results["live"])
    if results.get("live") and results.get("live_peers"):
        lines += _live_peer_lines(results["live"], results["live_peers"])
    if results.get("live_kinds"):
        from benchmarks import live_kinds

        lines += live_kinds.lines(results["live_kinds"])
    if results.get("live_kafka"):
        lines += _live_lines(results["live_kafka"], "Kafka topic (3 partitions, JSON); Kafka timestamp → sink commit")
    if results.get("live_topic"):
        from benchmarks import live_topics

        lines += live_topics.lines(results["live_topic"])
    if results.get("kafka_backlog"):
        from benchmarks import kafka_backlog

        lines += kafka_backlog.lines(results["kafka_backlog"])
    if results.get("kafka_avro"):
        from benchmarks import kafka_avro

        lines += kafka_avro.lines(results["kafka_avro"])
    if results.get("kafka_protobuf"):
        from benchmarks import kafka_protobuf

        lines += kafka_protobuf.lines(results["kafka_protobuf"])
    if results.get("redeploy"):
        from benchmarks import redeploy

        lines += redeploy.lines(results["redeploy"])
    if results.get("redeploy_topic"):
        from benchmarks import redeploy

        lines += redeploy.lines(results["redeploy_topic"])
    if results.get("process_pass"):
        from benchmarks import process_pass

        lines += process_pass.lines(results["process_pass"])
    if "spill" in results:
        sp = results["spill"]
        if sp.get("failed"):
            lines.append(
                f"Spill run (driver memory {sp['driver_memory']}): FAILED, exit {sp['exit_code']}: {sp['errors']}"
            )
        else:
            lines.append(
                f"Spill run: process-function backlog of {sp['rows']:,} rows / {sp['keys']:,} keys with "
                f"{sp['driver_memory']} driver memory (execution memory ≈{sp['execution_memory_mib']} MiB, "
                f"{sp['shuffle_partitions']} partitions, shuffle {sp['shuffle_write_mib']} MiB): {sp['backlog_s']} s, "
                f"spilled {sp['memory_spilled_mib']} MiB from memory ({sp['disk_spilled_mib']} MiB on disk), "
                f"output equal: {sp['equal']}."
            )
        lines.append("")
    return "\n".join(lines)


def peer_lines(peers: dict) -> list[str]:
    """The keyed reduce through Apache Flink beside this framework (``make bench-peers``), one run."""
    ours = peers["ours"]
    two, plain = ours["two-phase"], ours["plain batch (Spark)"]
    out = [
        f"### keyed reduce beside Apache Flink ({peers['rows']:,} rows, {peers['keys']:,} keys, same Parquet files; "
        f"{peers['at']})",
        "",
        "| run | seconds | two-phase time ÷ this run's | results equal | detail |",
        "|---|---|---|---|---|",
        f"| two-phase (this framework) | {two:.1f} | 1.00× | True | backlog {ours['backlog']:.1f} s |",
        f"| plain batch (Spark) | {plain:.1f} | {two / plain:.2f}× | True | |",
    ]
    for f in peers["flink"]:
        label = "Flink batch" if f["mode"] == "batch" else f"Flink streaming, {f['state_backend']} state"
        out.append(
            f"| {label} | {f['job_s']:.1f} | {two / f['job_s']:.2f}× | {f['equal']} | job only; with JVM and "
            f"planner start {f['with_startup_s']:.1f} s, output {f['output_format']} |"
        )
    out.append("")
    return out


def sink_label(run: dict) -> str:
    """A live run's sink as the reports name it: its mode and, for a changelog, its background compaction."""
    mode = run.get("sink_mode", "upsert")
    every = run.get("compact_every_s")
    if mode != "changelog" or every is None:
        return mode
    return f"{mode}, compaction off" if every == 0 else f"{mode}, compaction every {every:g} s"


def _live_lines(runs: list[dict], source: str = "Delta source; source commit → sink commit") -> list[str]:
    lines = [
        f"### live phase (keyed reduce; {source}; trigger 0.5 s)",
        "",
        "| keys of state | sink | switch s | micro-batch s (rows) | rate rows/s (offered) | p50 s | p99 s | max s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        batch = f"{r['batch']['median_s']} ({r['batch']['rows']:,})"
        for lat in r["latency"]:
            lines.append(
                f"| {r['state_keys']:,} | {sink_label(r)} | {r['switch_s']} | {batch} | "
                f"{lat['rate_rows_per_s']:,} ({lat['offered_rows_per_s']:,}) | {lat['p50_s']} | {lat['p99_s']} | "
                f"{lat['max_s']} |"
            )
    lines.append("")
    for r in runs:
        if "drain" in r:
            d = r["drain"]
            lines.append(
                f"Drain with {r['state_keys']:,} keys of state ({r.get('sink_mode', 'upsert')} sink): {d['rows']:,} "
                f"rows appended while stopped, applied by a restart in {d['seconds']} s: **{d['rows_per_s']:,} "
                "rows/s** (the most the live path sustains)." + _store_profile_text(d.get("store_update"))
            )
    same_mode = [r for r in runs if r.get("sink_mode", "upsert") == runs[0].get("sink_mode", "upsert")]
    if len({r["state_keys"] for r in same_mode}) > 1:
        small, large = same_mode[0], same_mode[-1]
        growth = large["batch"]["median_s"] / small["batch"]["median_s"]
        lines.append(
            f"Per-micro-batch cost growth from {small['state_keys']:,} to {large['state_keys']:,} keys of state "
            f"({small.get('sink_mode', 'upsert')} sink): {growth:.2f}×."
        )
    lines.append("")
    return lines


def _store_profile_text(p: dict | None) -> str:
    """A drain's state store update in words (task time summed over the store's tasks), or nothing."""
    if not p:
        return ""
    return (
        f" Its state store update, task time over {p.get('tasks', 0)} tasks: {p.get('rows_ms', 0):,} ms in its rows "
        f"({p.get('gets', 0):,} gets {p.get('get_ms', 0):,} ms, {p.get('puts', 0):,} puts {p.get('put_ms', 0):,} ms, "
        f"{p.get('cache_misses', 0):,} block cache misses), load {p.get('load_ms', 0):,} ms (changelog replay "
        f"{p.get('replay_ms', 0):,} ms), commit {p.get('commit_ms', 0):,} ms."
    )


def _live_peer_lines(runs: list[dict], peers: list[dict]) -> list[str]:
    """The framework's live rows beside the hand-written plain Spark query's, at the same state size, at each rate
    the peers ran; then the targets: the changelog sink at or below the plain append query's p50 and p99, the upsert
    sink at or below the plain MERGE query's, at every rate."""
    keys = peers[0]["state_keys"]
    rates = sorted({x["rate_rows_per_s"] for r in peers for x in r["latency"]})
    ours = [r for r in runs if r["state_keys"] == keys]
    shown = " and ".join(f"{rate:,}" for rate in rates)
    lines = [
        f"### live phase beside plain Spark ({keys:,} keys of state, {shown} rows/s, the same feed, one run)",
        "",
        "| live path | "
        + " | ".join(f"p50 s at {r:,}/s | p99 s at {r:,}/s" for r in rates)
        + " | micro-batch s (rows) | drain rows/s |",
        "|---|" + "---|---|" * len(rates) + "---|---|",
    ]

    def at(r: dict, rate: int) -> dict | None:
        return next((x for x in r["latency"] if x["rate_rows_per_s"] == rate), None)

    for r in ours + peers:
        name = r.get("peer") or f"this framework, {sink_label(r)} sink"
        cells = []
        for rate in rates:
            lat = at(r, rate)
            cells += [str(lat["p50_s"]), str(lat["p99_s"])] if lat else ["–", "–"]
        drain = f"{r['drain']['rows_per_s']:,}" if "drain" in r else "–"
        lines.append(f"| {name} | {' | '.join(cells)} | {r['batch']['median_s']} ({r['batch']['rows']:,}) | {drain} |")
    pairs = (("changelog", "append"), ("upsert", "merge"))
    verdicts = []
    for mode, peer_mode in pairs:
        theirs = next((r for r in peers if r.get("mode", r["peer"].split()[-2]) == peer_mode), None)
        if theirs is None:
            continue
        for mine in [r for r in ours if r.get("sink_mode", "upsert") == mode]:
            for rate in rates:
                a, b = at(mine, rate), at(theirs, rate)
                if a is None or b is None:
                    continue
                met = a["p50_s"] <= b["p50_s"] and a["p99_s"] <= b["p99_s"]
                verdicts.append(
                    f"{sink_label(mine)} sink ÷ plain {peer_mode} query at {rate:,} rows/s: p50 {a['p50_s']} / "
                    f"{b['p50_s']} s, p99 {a['p99_s']} / {b['p99_s']} s ({'met' if met else 'missed'})"
                )
    if verdicts:
        lines += ["", "Targets (at or below the plain query's p50 and p99): " + "; ".join(verdicts) + "."]
    lines.append("")
    return lines


COLORS = {"plain batch": "#888", "stream": "#c55", "stream, one batch": "#e95", "two-phase": "#4a4"}


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(results["workloads"].items())
    if not workloads:  # e.g. a results file that so far holds only the peers run
        return
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
    for ax, (name, w) in zip(axes[0], workloads, strict=True):
        variants = list(w["timings"])
        seconds = [w["timings"][v]["seconds"] for v in variants]
        colors = [COLORS.get(v, "#58a") for v in variants]
        hatches = ["//" if w["timings"][v].get("extrapolated") else "" for v in variants]
        bars = ax.bar(variants, seconds, color=colors, hatch=hatches)
        ax.bar_label(bars, fmt="%.1f s")
        ax.set_title(f"{name}: {w['rows']:,} rows / {w['keys']:,} keys")
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log; hatched: extrapolated)")
        ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(results: dict, out: Path) -> tuple[Path, Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md, png = out / "results.json", out / "results.md", out / "results.png"
    js.write_text(json.dumps(results, indent=2))
    md.write_text(markdown(results))
    chart(results, png)
    if results.get("growth"):
        from benchmarks import growth

        growth.chart(results["growth"], out / "growth.png")
    return js, md, png
