"""A long run's progress, read from Spark's status store while it runs: the runner's step (its job description),
the running stage, tasks done/total, input rows read and the stage's time left; as callbacks and, in a terminal,
as a progress bar."""

from __future__ import annotations

import io
import sys

from phases._internal.backlog import progress
from tests.helpers import append_version
from tests.phases.backlog.test_backlog import S

SLOW = "reflect('java.lang.Thread', 'sleep', cast(250 as bigint))"  # 250 ms per row: a job that takes seconds


def _slow_job(spark, path: str) -> None:
    """8 tasks of 2 rows each, 0.5 s per task, reading a Delta table of 8 files (16 input rows)."""
    spark.read.format("delta").load(path).repartition(8).selectExpr(SLOW).collect()


def _source(spark, tmp_path) -> str:
    path = str(tmp_path / "src")
    append_version(spark, path, [(f"k{i}", i * S, i) for i in range(16)], files=8)
    _idle(spark)
    return path


def _idle(spark, timeout_s: float = 120) -> None:
    """Waits until the shared session runs no stage: a job an earlier test left running in the background (seen once:
    a 2-task stage of another pipeline's backlog step, active for seconds) would be the newest stage the reporter
    shows instead of this test's."""
    import time

    deadline = time.monotonic() + timeout_s
    while spark.sparkContext._jsc.sc().statusStore().activeStages().size():
        if time.monotonic() > deadline:
            active = spark.sparkContext._jsc.sc().statusStore().activeStages()
            names = [active.apply(i).name() for i in range(active.size())]
            raise AssertionError(f"the shared session still runs stages after {timeout_s:.0f} s: {names}")
        time.sleep(0.2)


def test_a_running_job_is_reported_with_its_step_stage_tasks_and_rows(spark, tmp_path):
    path = _source(spark, tmp_path)
    seen: list[progress.Snapshot] = []
    with progress.ProgressReporter(spark, seen.append, every_s=0.1), progress.step(spark, "orders", "backlog", "state"):
        _slow_job(spark, path)
    assert seen, "no report while the job ran"
    ours = [s for s in seen if s.step == "orders backlog: state"]
    assert ours, {s.step for s in seen}
    assert all(0 <= s.tasks_done <= s.tasks_total and s.stage_id >= 0 for s in ours)
    assert any(s.tasks_done > 0 and s.stage_left_s is not None for s in ours)
    assert any(s.input_rows > 0 for s in seen)  # the stage reading the table has read rows
    assert "tasks" in ours[-1].describe() and "orders backlog: state" in ours[-1].describe()
    # The job description is restored after the step.
    assert spark.sparkContext.getLocalProperty("spark.job.description") is None


def test_rows_read_by_a_stage_that_finished_before_the_first_report_are_counted(spark, tmp_path):
    """The first report comes a second after the start: the stage reading the table (fast) has finished by then and
    only the slow stage after the shuffle (no input rows of its own) is active. Its rows are still counted. (Delta's
    own jobs listing the table's files come first: on a loaded machine the first report once fell in one of them, so
    the table's files are listed before, and the reports of Delta's jobs are left out.)"""
    path = _source(spark, tmp_path)
    spark.read.format("delta").load(path).inputFiles()  # the snapshot's files, listed before the reporter starts
    _idle(spark)
    seen: list[progress.Snapshot] = []
    with progress.ProgressReporter(spark, seen.append, every_s=1.0), progress.step(spark, "orders", "backlog", "state"):
        _slow_job(spark, path)
    ours = [s for s in seen if not s.step.startswith("Delta:")]
    assert ours, f"no report of the job while it ran: {[(s.step, s.input_rows) for s in seen]}"
    assert ours[0].input_rows == 16, [(s.step, s.stage_name, s.input_rows) for s in seen]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_console_bar_shows_the_step_in_a_terminal_only(spark, tmp_path, monkeypatch):
    path = _source(spark, tmp_path)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress.console(spark, every_s=0.1), progress.step(spark, "orders", "backlog", "sink"):
        _slow_job(spark, path)
    assert "orders backlog: sink" in terminal.getvalue()

    pipe = io.StringIO()  # not a terminal: no bar
    monkeypatch.setattr(sys, "stderr", pipe)
    with progress.console(spark, every_s=0.1), progress.step(spark, "orders", "backlog", "sink"):
        _slow_job(spark, path)
    assert pipe.getvalue() == ""
