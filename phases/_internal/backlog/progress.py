"""Progress of a long batch run (backlog, catch-up increment, daily slices) while it runs.

The runners name each step in Spark's job description (``<pipeline> backlog: <step>``, :func:`step`), which Spark
also shows in its own UI. A :class:`ProgressReporter` thread reads Spark's live status store every few seconds and
reports the current step, its running stage, tasks done/total, the input rows those stages read so far and an
estimate of the stage's time left. A caller gets :class:`Snapshot`\\ s through a callback (the Dagster assets log
them); a Python API run in a terminal gets a ``tqdm`` progress bar (:func:`console`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pyspark.sql import SparkSession

from phases._internal import spark_internals

_PREFIX = "phases:"


@contextlib.contextmanager
def step(spark: SparkSession, pipeline: str, phase: str, name: str) -> Iterator[None]:
    """Runs the block with the Spark job description ``phases:<pipeline> <phase>: <name>`` (restored after)."""
    sc = spark.sparkContext
    previous = sc.getLocalProperty("spark.job.description")
    sc.setJobDescription(f"{_PREFIX}{pipeline} {phase}: {name}")
    try:
        yield
    finally:
        sc.setLocalProperty("spark.job.description", previous)  # None removes it  # pyright: ignore[reportArgumentType]


@dataclass(frozen=True)
class Snapshot:
    step: str  # "<pipeline> <phase>: <step>", or "" when the running stage carries no step
    stage_id: int
    stage_name: str
    tasks_done: int
    tasks_total: int
    input_rows: int  # read so far by the run's stages (those of a phases step)
    elapsed_s: float  # since the reporter started
    stage_left_s: float | None  # the running stage's time left at its pace so far (None: no task done yet)

    def describe(self) -> str:
        left = f", ~{self.stage_left_s:.0f} s left in this stage" if self.stage_left_s is not None else ""
        return (
            f"{self.step or 'spark'}: stage {self.stage_id} ({self.stage_name}), tasks {self.tasks_done}/"
            f"{self.tasks_total}, {self.input_rows:,} input rows read{left}; {self.elapsed_s:.0f} s elapsed"
        )


class _Rows:
    """Input rows read by the run's stages (those of a phases step), finished ones included: stage ids are
    sequential, so every stage created since the reporter started is looked up once it is no longer active (also
    one that ran and finished between two looks)."""

    def __init__(self, spark: SparkSession):
        self.spark = spark
        self.finished: dict[int, int] = {}
        self.first = spark_internals.stages_submitted(spark)  # the first stage id created after the start

    def total(self, active: dict[int, tuple[str, int]]) -> int:
        top = max([*active, *self.finished, spark_internals.stages_submitted(self.spark) - 1])
        for stage_id in range(self.first, top + 1):
            if stage_id in self.finished or stage_id in active:
                continue
            stage = spark_internals.stage_attempt(self.spark, stage_id)
            if stage is not None and stage.status not in ("ACTIVE", "PENDING"):
                self.finished[stage_id] = stage.input_records if stage.description.startswith(_PREFIX) else 0
        return sum(self.finished.values()) + sum(rows for described, rows in active.values() if described)


def snapshot(spark: SparkSession, started: float, rows: _Rows) -> Snapshot | None:
    """What the session runs now (the newest active stage of a phases step), or None when idle."""
    now_ms = time.time() * 1000
    best = None
    active: dict[int, tuple[str, int]] = {}
    for stage in spark_internals.active_stages(spark):
        ours = stage.description.startswith(_PREFIX)
        active[stage.stage_id] = (stage.description if ours else "", stage.input_records)
        if best is None or (ours and not best[1]) or (ours == best[1] and stage.stage_id > best[0].stage_id):
            best = (stage, ours)
    if best is None:
        return None
    stage = best[0]
    done, total = stage.tasks_done, stage.tasks_total
    left = None
    if done > 0 and stage.submitted_ms is not None:
        running_ms = now_ms - stage.submitted_ms
        left = max(0.0, running_ms / 1000 * (total - done) / done)
    return Snapshot(
        step=stage.description.removeprefix(_PREFIX),
        stage_id=stage.stage_id,
        stage_name=stage.name.split(" at ")[0],
        tasks_done=done,
        tasks_total=total,
        input_rows=rows.total(active),
        elapsed_s=time.monotonic() - started,
        stage_left_s=left,
    )


class ProgressReporter:
    """A daemon thread calling ``on_report`` with a :class:`Snapshot` every ``every_s`` seconds while Spark
    works (nothing while it is idle). Use as a context manager around the run."""

    def __init__(self, spark: SparkSession, on_report: Callable[[Snapshot], None], every_s: float = 5.0):
        self.spark = spark
        self.on_report = on_report
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="phases-progress", daemon=True)
        self._started = time.monotonic()
        self._rows = _Rows(spark)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                snap = snapshot(self.spark, self._started, self._rows)
            except Exception:  # the session may be stopping; progress is best effort, the run is not
                continue
            if snap is not None:
                self.on_report(snap)

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every_s + 5)


_active = threading.local()


@contextlib.contextmanager
def console(spark: SparkSession, every_s: float = 1.0) -> Iterator[None]:
    """A ``tqdm`` bar of the running stage's tasks on stderr, when stderr is a terminal (and
    ``PHASES_PROGRESS`` is not ``0``); otherwise nothing. Nested uses show one bar."""
    if getattr(_active, "on", False) or not sys.stderr.isatty() or os.environ.get("PHASES_PROGRESS") == "0":
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=0, unit="task", leave=False, dynamic_ncols=True)
    current = {"stage": None}

    def show(snap: Snapshot) -> None:
        if current["stage"] != snap.stage_id:
            current["stage"] = snap.stage_id  # pyright: ignore[reportArgumentType]
            bar.reset(total=snap.tasks_total)
        bar.set_description_str(snap.step or snap.stage_name)
        bar.set_postfix_str(f"{snap.input_rows:,} rows read")
        bar.n = snap.tasks_done
        bar.refresh()

    try:
        with reported(spark, show, every_s):
            yield
    finally:
        bar.close()


@contextlib.contextmanager
def reported(spark: SparkSession, on_report: Callable[[Snapshot], None], every_s: float = 5.0) -> Iterator[None]:
    """Reports to ``on_report`` while the block runs; the console bar of nested runner calls stays off."""
    _active.on = True
    try:
        with ProgressReporter(spark, on_report, every_s):
            yield
    finally:
        _active.on = False
