"""Peak resident memory of the Spark driver JVM (in local mode also the executor) and of Spark's Python
workers, read from /proc (Linux). ``reset()`` clears the kernel's high-water marks before a variant runs."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pyspark.sql import SparkSession

from phases._internal import spark_internals


def jvm_pid(spark: SparkSession) -> int:
    return int(spark_internals.jvm(spark).java.lang.ProcessHandle.current().pid())


def _python_workers() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd or b"pyspark/daemon" in cmd:
            pids.append(int(proc.name))
    return pids


def _hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset(spark: SparkSession) -> None:
    """Resets the peak-RSS marks of the JVM and the live Python workers ("5" > clear_refs)."""
    for pid in [jvm_pid(spark), os.getpid(), *_python_workers()]:
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/clear_refs").write_text("5")


def peaks(spark: SparkSession) -> dict:
    """Peak RSS in MiB since the last reset: the JVM (driver and, in local mode, executor), the Python driver
    process, and the largest Python worker."""
    workers = [_hwm_kib(pid) for pid in _python_workers()]
    return {
        "jvm_peak_mib": round(_hwm_kib(jvm_pid(spark)) / 1024),
        "python_driver_peak_mib": round(_hwm_kib(os.getpid()) / 1024),
        "python_worker_peak_mib": round(max(workers, default=0) / 1024),
    }
