"""Daily backlog slices through Dagster: a backfill killed mid-way is resumed by re-running the range,
which executes only the days that did not finish (FLIP-383's batch job recovery), and the combined
handoff equals one backlog job over the whole source."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg

from phases._internal.handoff import manifest
from phases._internal.storage import quarantine, tables
from phases_dagster.resources.spark import SparkResource
from phases_dagster.settings import Names
from tests import reference
from tests.helpers import SHORT_LIVED_JVM_OPTIONS, assert_results_equal, backdate_commits, sink_rows, write_source
from tests.phases_dagster import backfill_child as child

S = 1_000_000
DAYS = 6
PROJECT = Path(__file__).resolve().parents[2]


def _versions() -> dict[int, list]:
    out = {}
    for v in range(1, DAYS + 1):
        base = v * 100 * S
        out[v] = [(f"k{(v * 7 + i) % 5}", base + i * S, v * 10 + i) for i in range(6)]
        # Behind the version's watermark (the versions before it reach (v - 1) * 100 s, less the 5 s delay): late
        # from version 2 on.
        out[v].append((f"k{v % 5}", base - 160 * S, 99))
    return out


def _finished(spark, log_path: str) -> set[str]:
    if not tables.exists(spark, log_path):
        return set()
    return {r["slice"] for r in spark.read.format("delta").load(log_path).select("slice").collect()}


def test_killed_backfill_resumes_only_unfinished_days_and_combines_to_the_whole_backlog(spark, tmp_path):
    root = str(tmp_path / "data")
    versions = _versions()
    write_source(spark, f"{root}/src", versions)
    days = [child.START + timedelta(days=i) for i in range(DAYS)]
    backdate_commits(
        f"{root}/src",
        {0: datetime.combine(days[0], datetime.min.time(), tzinfo=UTC)}
        | {v: datetime.combine(days[v - 1], datetime.min.time(), tzinfo=UTC) + timedelta(hours=6) for v in versions},
    )
    first, last = days[0].isoformat(), days[-1].isoformat()
    log_path = f"{root}/engine/slices/log"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "PYTHONPATH": str(PROJECT),
        "JAVA_TOOL_OPTIONS": SHORT_LIVED_JVM_OPTIONS,  # killed after its first day
    }
    (tmp_path / "dagster_home").mkdir()

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.phases_dagster.backfill_child", root, first, last],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the child and the JVM it launched die together
    )
    try:
        deadline = time.monotonic() + 300
        while not _finished(spark, log_path):
            assert proc.poll() is None, "the backfill run ended before any slice finished"
            assert time.monotonic() < deadline, (
                f"no slice finished within 300 s; the backfill run (pid {proc.pid}) is still running, "
                f"the slice log {log_path} exists: {tables.exists(spark, log_path)}"
            )
            time.sleep(0.2)
        # A crash of the machine: no cleanup, no Dagster failure event. The whole group, not the Python process
        # alone: its Spark JVM would otherwise finish the py4j call it was running (the next slice's log append)
        # after the kill, and the run would have done more than the test read at the kill.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done_at_kill = _finished(spark, log_path)
    assert 1 <= len(done_at_kill) < DAYS, f"kill landed after {len(done_at_kill)} of {DAYS} slices"

    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    try:
        defs = child.definitions(root, SparkResource(shuffle_partitions=2, stop_after_run=False))
        names = Names(child.PIPELINE)
        with dg.DagsterInstance.get() as instance:
            killed = instance.get_runs(dg.RunsFilter(job_name=names.slices_job))
            assert [r.status for r in killed] == [dg.DagsterRunStatus.STARTED]  # died without a failure event
            rerun = defs.resolve_job_def(names.slices_job).execute_in_process(
                instance=instance, tags=child.range_tags(first, last)
            )
            assert rerun.success
            by_day = {m.partition: m.metadata for m in rerun.asset_materializations_for_node(names.slices)}
            meta = by_day[first]
            executed = set(meta["run_executed_days"].value.split(", "))
            recovered = set(meta["run_recovered_days"].value.split(", "))
            assert recovered == done_at_kill and executed == {d.isoformat() for d in days} - done_at_kill
            # Each day's partition says which run executed it.
            assert {d for d, m in by_day.items() if m["executed_by"].value == "this run"} == executed
            assert defs.resolve_job_def(names.backlog_job).execute_in_process(instance=instance).success
    finally:
        os.environ.pop("DAGSTER_HOME", None)

    handoff = manifest.latest(spark, f"{root}/engine/manifests", child.PIPELINE.name)
    assert (handoff.kind, handoff.source_version) == ("slices", DAYS)
    expected, expected_q = reference.run(versions, 5 * S)
    assert_results_equal(sink_rows(spark, f"{root}/engine/sink"), expected)
    late = quarantine.count(spark, f"{root}/engine/quarantine", child.PIPELINE.name, phase="backlog")
    assert late == len(expected_q) == handoff.quarantined_rows == DAYS - 1


def test_daily_schedule_requests_the_previous_days_slice():
    defs = child.definitions("/unused", SparkResource())
    schedule = defs.resolve_schedule_def(Names(child.PIPELINE).schedule)
    ctx = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 3, 5, 1, tzinfo=UTC))
    [req] = schedule.evaluate_tick(ctx).run_requests
    assert req.partition_key == "2026-03-04"


def test_the_demos_daily_data_lands_on_its_days_and_a_day_without_data_warns(spark, tmp_path):
    """The demo backdated its versions but not the table's creation, and Delta keeps commit times increasing: every
    version counted as today, and a backfill of the days it claims found nothing, yet went green with keys=0."""
    from assets.definitions import DAILY_SETTINGS
    from assets.pipelines import DEMO_DAILY
    from phases._internal.backlog.slices import SliceRunner
    from phases_dagster.resources.storage import StorageResource
    from scripts.demo import daily_source
    from tests.phases_dagster.conftest import definitions

    daily_source(spark, tmp_path, days=3, rows=40)
    p = StorageResource(root=str(tmp_path)).placement(DEMO_DAILY)
    today = datetime.now(UTC).date()
    runner = SliceRunner.at(spark, p, DAILY_SETTINGS.backfill.start_date)
    assert [runner.day_versions(today - timedelta(days=d)) for d in (3, 2, 1)] == [(1, 1), (2, 2), (3, 3)]

    names = Names(DEMO_DAILY)
    job = definitions(spark, str(tmp_path), DEMO_DAILY, DAILY_SETTINGS).resolve_job_def(names.slices_job)
    with dg.instance_for_test() as instance:
        # Days 5 and 4 before today: the first has no version, the second the table's creation (version 0).
        empty, created = (today - timedelta(days=5)).isoformat(), (today - timedelta(days=4)).isoformat()
        ran = job.execute_in_process(instance=instance, tags=child.range_tags(empty, created))
        [check] = ran.get_asset_check_evaluations()
        assert (
            not check.passed
            and check.severity == dg.AssetCheckSeverity.WARN
            and check.check_name == names.slices_have_data
        )
        # Both are empty: a day with no version, and a day whose only version is the table's creation (no record).
        assert check.metadata["empty_days"].value == f"{empty}, {created}", check.metadata
        logs = instance.all_logs(ran.run_id)
        said = f"slice {empty}: no source version was committed on that day"
        assert any(r.level >= 30 and said in r.user_message for r in logs), [r.user_message for r in logs]
        creation = f"slice {created}: versions 0..0 were committed on that day but hold no record"
        assert any(r.level >= 30 and creation in r.user_message for r in logs), [r.user_message for r in logs]
        # Each empty day's partition says so in its own metadata (Dagster's checks are per asset, not per partition).
        said = {m.partition: m.metadata for m in ran.asset_materializations_for_node(names.slices)}
        assert said[empty]["contents"].value == "empty: no source version was committed on that day (UTC)"
        assert said[created]["contents"].value == "empty: the day's source versions hold no record"
        assert said[empty]["dagster/row_count"].value == 0

        # A range of the three days with data, in one run: each day's partition carries its own day's figures.
        first, last = (today - timedelta(days=3)).isoformat(), (today - timedelta(days=1)).isoformat()
        ranged = job.execute_in_process(instance=instance, tags=child.range_tags(first, last))
        assert ranged.success
        by_day = {m.partition: m.metadata for m in ranged.asset_materializations_for_node(names.slices)}
        assert sorted(by_day) == [(today - timedelta(days=d)).isoformat() for d in (3, 2, 1)]
        versions = {meta["versions"].value for meta in by_day.values()}
        assert versions == {"1..1", "2..2", "3..3"}, by_day
        for meta in by_day.values():  # 40 records a day, each either aggregated or quarantined
            assert meta["aggregated_rows"].value + meta["quarantined_rows"].value == 40, meta
            assert 0 < meta["keys"].value <= 10 and meta["run_range"].value == f"{first}..{last}"
        [has_data] = ranged.get_asset_check_evaluations()
        assert has_data.passed
        # The check is evaluated once per run, never planned and left unexecuted per partition.
        planned = instance.all_logs(ranged.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED)
        assert len(planned) == 1, [r.dagster_event.event_specific_data for r in planned]
