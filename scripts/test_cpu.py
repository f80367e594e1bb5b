"""CPU per test module: a pytest plugin that records, for every test, the CPU seconds of its pytest process, of the
children it reaped (crashed child runs, Dagster stacks) and of its SparkSession's JVM, and a summary of them.

    PHASES_TEST_CPU=/tmp/cpu make test ARGS="-p scripts.test_cpu"   # one JSON file per pytest process
    .venv/bin/python -m scripts.test_cpu /tmp/cpu                   # CPU-s, time and their ratio per module

A module whose CPU over its time is low mostly waits: on sleeps, or on processes it started and did not reap (a
Dagster stack's runs), whose CPU this does not see. A test during which the session's JVM changed counts no JVM time.
benchmarks/profiles/suite-cpu-2026-12-02.txt is a full run's summary.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path

import pytest

_rows: list[dict] = []
_TICK = os.sysconf("SC_CLK_TCK")


def _jvm() -> tuple[int | None, float]:
    """(pid, CPU-s) of the active SparkSession's JVM; (None, 0) without one."""
    from pyspark.sql import SparkSession

    from phases._internal import spark_internals

    session = SparkSession.getActiveSession()
    if session is None:
        return None, 0.0
    try:
        pid = int(spark_internals.jvm(session).java.lang.ProcessHandle.current().pid())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None, 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return pid, (int(fields[11]) + int(fields[12])) / _TICK


def _now() -> tuple[float, float, int | None, float, float]:
    t = os.times()
    pid, jvm = _jvm()
    return t.user + t.system, t.children_user + t.children_system, pid, jvm, time.monotonic()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    start = _now()
    yield
    end = _now()
    jvm = end[3] - start[3] if start[2] == end[2] else 0.0
    _rows.append(
        {
            "test": item.nodeid,
            "python": end[0] - start[0],
            "children": max(0.0, end[1] - start[1]),
            "jvm": max(0.0, jvm),
            "seconds": end[4] - start[4],
        }
    )


def pytest_sessionfinish(session):
    folder = os.environ.get("PHASES_TEST_CPU")
    if not folder or not _rows:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (Path(folder) / f"cpu-{worker}.json").write_text(json.dumps(_rows))


def summary(folder: str, top: int = 25) -> str:
    rows = [r for f in sorted(Path(folder).glob("cpu-*.json")) for r in json.loads(f.read_text())]
    modules: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        m = modules[r["test"].split("::")[0]]
        m["cpu"] += r["python"] + r["children"] + r["jvm"]
        m["seconds"] += r["seconds"]
    cpu, seconds = sum(m["cpu"] for m in modules.values()), sum(m["seconds"] for m in modules.values())
    lines = [
        f"{len(rows)} tests, {seconds:,.0f} s of test time, {cpu:,.0f} CPU-s measured",
        f"{'CPU-s':>6} {'time s':>7} {'CPU/time':>8}  module (the {top} longest)",
    ]
    for name, m in sorted(modules.items(), key=lambda kv: -kv[1]["seconds"])[:top]:
        lines.append(f"{m['cpu']:6.0f} {m['seconds']:7.0f} {m['cpu'] / max(m['seconds'], 1e-9):8.2f}  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
