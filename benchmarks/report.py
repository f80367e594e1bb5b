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
    for name, w in results["workloads"].items():
        lines += [f"### {name} ({w['rows']:,} rows, {w['keys']:,} keys, {w['versions']} versions)", ""]
        lines += [
            "| variant | seconds | × plain batch | stream mode ÷ variant | results equal | detail |",
            "|---|---|---|---|---|---|",
        ]
        plain = w["timings"]["plain batch"]["seconds"]
        stream = w["timings"].get("stream", {}).get("seconds")
        for variant, t in w["timings"].items():
            ratio = t["seconds"] / plain if plain else float("nan")
            speed = f"{stream / t['seconds']:.1f}×" if stream else "–"
            detail = ", ".join(f"{k} {v}" for k, v in t.get("detail", {}).items())
            lines.append(f"| {variant} | {t['seconds']:.1f} | {ratio:.2f}× | {speed} | {t['equal']} | {detail} |")
        if "seeding" in w:
            s = w["seeding"]
            lines += [
                "",
                f"Switch seeding of {s['keys']:,} keys: native replay (first live checkpoint) "
                f"{s['native_s']:.1f} s vs `transformWithState(initialState)` {s['initial_state_s']:.1f} s "
                f"({s['initial_state_s'] / s['native_s']:.1f}× slower).",
            ]
        lines.append("")
    return "\n".join(lines)


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(results["workloads"].items())
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
    for ax, (name, w) in zip(axes[0], workloads, strict=True):
        variants = list(w["timings"])
        seconds = [w["timings"][v]["seconds"] for v in variants]
        bars = ax.bar(variants, seconds, color=["#888", "#c55", "#e95", "#4a4"][: len(variants)])
        ax.bar_label(bars, fmt="%.1f s")
        ax.set_title(f"{name}: {w['rows']:,} rows / {w['keys']:,} keys")
        ax.set_ylabel("seconds")
        ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(results: dict, out: Path) -> tuple[Path, Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md, png = out / "results.json", out / "results.md", out / "results.png"
    js.write_text(json.dumps(results, indent=2))
    md.write_text(markdown(results))
    chart(results, png)
    return js, md, png
