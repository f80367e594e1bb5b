"""The engine's one-time set-up on a machine: ``python -m phases.setup`` fetches the JVM jars from Maven Central
(Delta, the Kafka connector, the local broker, the S3A connector), builds the engine's JVM helper with Maven, and
builds the JVM class archive a local session starts from (:mod:`phases._internal.runtime.class_archive`: a JVM runs
a small two-phase pipeline and writes the classes it loaded as it exits). ``--no-class-archive`` skips the archive
(a session then loads every class from its jar).

It is idempotent: current jars, helper and archive are kept. The Makefile's setup runs it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from phases._internal.errors import SetupError
from phases._internal.runtime import jvm_deps
from phases._internal.runtime.class_archive import QUIET, archive_path

__all__ = ["build_class_archive", "main"]


def build_class_archive(jar_dir: Path = jvm_deps.DEFAULT_JAR_DIR, timeout_s: float = 600) -> Path:
    """Builds the archive unless the current one exists: a JVM runs a small two-phase pipeline (backlog, switch, live
    phase, one streaming job; Delta reads and writes, the state store) and writes the classes it loaded as it
    exits. Returns its path; raises SetupError naming what failed."""
    path = archive_path(jar_dir)
    if path is None:
        raise SetupError(
            "the class archive needs java on PATH (or JAVA_HOME) and the setup's jars: run the setup step "
            "(`make setup`, or `python -m phases.setup --no-class-archive`) first."
        )
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    with tempfile.TemporaryDirectory() as work:
        # A process group of its own: the JVM writes the archive as it exits, after its Python process has; the
        # build waits until no process of the group is left.
        child = subprocess.Popen(
            [sys.executable, "-m", "phases.setup", "--dump", str(staged), work],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = child.communicate(timeout=timeout_s)
            _wait_for_group(child.pid, timeout_s)
        except (subprocess.TimeoutExpired, SetupError):
            _kill_group(child.pid)
            staged.unlink(missing_ok=True)
            raise SetupError(f"building the JVM class archive {path} took over {timeout_s:.0f} s; stopped") from None
    if child.returncode != 0 or not staged.is_file():
        staged.unlink(missing_ok=True)
        tail = "\n".join(output.strip().splitlines()[-12:])
        raise SetupError(f"could not build the JVM class archive {path} (exit {child.returncode}):\n{tail}")
    os.replace(staged, path)
    for old in path.parent.glob("classes-*.jsa"):
        if old != path:
            old.unlink(missing_ok=True)
    return path


def _wait_for_group(group: int, timeout_s: float) -> None:
    """Waits until no process of the process group ``group`` is left (the dump's JVM outlives its Python parent)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise SetupError(f"the JVM writing the class archive did not exit within {timeout_s:.0f} s")


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def _dump(target: str, work: str) -> None:
    """The archive's workload, in the process that writes it (``--dump TARGET WORK``)."""
    from phases._internal.definition import (
        Aggregation,
        DeltaSink,
        DeltaSource,
        KeyedAggregate,
        Locations,
        Pipeline,
    )
    from phases._internal.runtime.session import SparkSettings, build_session
    from phases.testing import assert_equivalent

    options = f"-XX:ArchiveClassesAtExit={target} {QUIET}"
    spark = build_session(
        SparkSettings(
            shuffle_partitions=2,
            app_name="class-archive",
            class_archive=False,
            extra_conf={"spark.driver.extraJavaOptions": options},
        )
    )
    pipeline = Pipeline(
        name="archive",
        source=DeltaSource(path=f"{work}/unused"),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=timedelta(seconds=15),
        operator=KeyedAggregate(
            aggregations=[
                Aggregation(name="n", kind="count"),  # pyright: ignore[reportArgumentType]
                Aggregation(name="total", kind="sum", column="value"),  # pyright: ignore[reportArgumentType]
                Aggregation(name="xor", kind="reduce", column="value", reduce="acc ^ x"),  # pyright: ignore[reportArgumentType]
            ]
        ),
        sink=DeltaSink(path=f"{work}/unused-sink"),
        locations=Locations(root=f"{work}/unused-root"),
        checkpoint_interval=timedelta(milliseconds=500),
    )
    at = datetime(2026, 1, 1)
    versions = [
        [("a", at, 1), ("b", at + timedelta(seconds=2), None)],
        [("a", at + timedelta(seconds=40), 3), ("c", at + timedelta(seconds=5), 4)],
    ]
    assert_equivalent(spark, pipeline, versions, work=work, cutoffs=[1])
    spark.stop()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--dump"] and len(argv) == 3:
        _dump(argv[1], argv[2])
        return 0
    if [a for a in argv if a != "--no-class-archive"]:
        print(f"usage: python -m phases.setup [--no-class-archive]; got {argv}", file=sys.stderr)
        return 2
    if jvm_deps.main() != 0:
        return 1
    if "--no-class-archive" in argv:
        return 0
    try:
        print(f"the JVM class archive: {build_class_archive()}")
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
