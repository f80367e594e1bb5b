"""The live phase under any split of the source into micro-batches: versions written as several files and
read a few files per micro-batch (so one version spans several micro-batches, and one micro-batch holds the
end of a version and the start of the next), and versions piling up before a restart (several in one
micro-batch). Two-phase == one streaming job == the plain reference, for every aggregation kind."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import DeltaSink, SessionAggregate, Window, WindowedAggregate
from phases._internal.live.runner import LiveRunner
from phases._internal.storage.changelog import compact_changelog
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import (
    EVENT_VERSIONS,
    append_version,
    assert_results_equal,
    current_rows,
    materialize,
    quarantine_rows,
    sink_rows,
    write_source,
)
from tests.phases.operators.test_windows import AGGS, _emitted
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

KINDS = ["keyed", "keyed-changelog", "tumbling", "sliding", "session"]


def _pipeline(kind: str, source: str, root: str):
    if kind == "keyed":
        return make_pipeline(source, root, delay_s=DELAY_S)
    if kind == "keyed-changelog":
        return make_pipeline(source, root, delay_s=DELAY_S, sink=DeltaSink(path=f"{root}/sink", mode="changelog"))
    if kind == "session":
        op = SessionAggregate(gap=timedelta(seconds=12), aggregations=AGGS)
    else:
        slide = timedelta(seconds=10) if kind == "sliding" else None
        op = WindowedAggregate(window=Window(size=timedelta(seconds=20), slide=slide), aggregations=AGGS)
    return make_pipeline(source, root, delay_s=DELAY_S, operator=op)


def _expected(kind: str, versions: dict) -> dict:
    if kind.startswith("keyed"):
        return reference.run(versions, DELAY_S * SECOND)[0]
    if kind == "session":
        return reference.run_sessions(versions, DELAY_S * SECOND, 12 * SECOND)
    slide = 10 if kind == "sliding" else 20
    return reference.run_windows(versions, DELAY_S * SECOND, 20 * SECOND, slide * SECOND)[0]


def _assert_sink(spark, kind: str, pipeline, expected: dict) -> None:
    if kind == "keyed":
        assert_results_equal(sink_rows(spark, pipeline.sink.path), expected)
    elif kind == "keyed-changelog":
        assert_results_equal(current_rows(spark, pipeline), expected)
    else:
        assert _emitted(spark, pipeline.sink.path) == expected


@pytest.mark.slow
@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=EVENT_VERSIONS,
    cut=st.integers(min_value=0, max_value=5),
    kind=st.sampled_from(KINDS),
    files=st.integers(min_value=1, max_value=3),
    per_trigger=st.integers(min_value=1, max_value=2),
)
def test_live_equals_one_streaming_job_under_any_micro_batch_split(spark, tmp_path, raw, cut, kind, files, per_trigger):
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = materialize(raw)
    cutoff = min(cut, len(versions))
    write_source(spark, source, {v: rows for v, rows in versions.items() if v <= cutoff}, files=files)

    two_phase = _pipeline(kind, str(source), str(root / "two_phase"))
    BacklogRunner(spark, two_phase).run()
    LiveRunner.from_manifest(spark, two_phase, max_files_per_trigger=per_trigger).start(available_now=True)
    if kind == "keyed-changelog":  # the reader then joins the compacted table and the newer changelog rows
        compact_changelog(spark, two_phase)
    for v in sorted(versions):
        if v > cutoff:
            append_version(spark, source, versions[v], files)
    # Every live version piled up before this restart: micro-batches of `per_trigger` files mix them.
    LiveRunner.from_manifest(spark, two_phase, max_files_per_trigger=per_trigger).start(available_now=True)

    single = _pipeline(kind, source, str(root / "single"))
    LiveRunner.streaming_only(spark, single, max_files_per_trigger=per_trigger).start(available_now=True)

    expected = _expected(kind, versions)
    _assert_sink(spark, kind, two_phase, expected)
    _assert_sink(spark, kind, single, expected)
    assert quarantine_rows(spark, str(root / "two_phase")) == quarantine_rows(spark, str(root / "single"))


def test_a_version_read_over_several_micro_batches_loses_no_on_time_row(spark, tmp_path):
    """The measured failure: one live version of 400 on-time rows (5 keys, tumbling 10 s windows) read one
    file per micro-batch. Each part of it must wait for the rest before the watermark moves."""
    source = str(tmp_path / "source")
    backlog = {1: [(f"k{i}", i * SECOND, 1) for i in range(5)]}
    write_source(spark, source, backlog)
    window = WindowedAggregate(window=Window(size=timedelta(seconds=10)), aggregations=AGGS)
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S, operator=window)
    BacklogRunner(spark, p).run()
    # 400 rows over 200 s of event time, shuffled across 4 files: later files hold earlier event times.
    live_rows = [(f"k{i % 5}", (10 + (i * 37) % 200) * SECOND, i) for i in range(400)]
    append_version(spark, source, live_rows, files=4)
    append_version(spark, source, [("k0", 400 * SECOND, 0)])  # moves the watermark past every live window

    live = LiveRunner.from_manifest(spark, p, max_files_per_trigger=1)
    live.start(available_now=True)
    assert len(live.incremental.query.recentProgress) >= 4, "the version was not split across micro-batches"
    expected, _ = reference.run_windows(
        {**backlog, 2: live_rows, 3: [("k0", 400 * SECOND, 0)]}, DELAY_S * SECOND, 10 * SECOND, 10 * SECOND
    )
    assert _emitted(spark, p.sink.path) == expected
    assert quarantine_rows(spark, str(tmp_path / "run")) == []


@pytest.mark.parametrize(
    ("kind", "fails"),
    [("keyed", "sink"), ("keyed", "progress"), ("tumbling", "sink"), ("session", "sink")],
    ids=["keyed-store-committed", "keyed-sink-committed", "tumbling-store-committed", "session-store-committed"],
)
def test_a_crash_between_the_state_write_and_the_sink_write_is_replayed_exactly_once(
    spark, tmp_path, monkeypatch, kind, fails
):
    """The micro-batch dies after some of its writes committed; the restart replays it and nothing is counted
    twice. Keyed aggregations: after the state store committed the next version and before the sink write
    (``sink``), or after the sink write and before the progress record (``progress``): the replay loads the
    version the previous record names again, computes the same rows, and Delta skips a sink write it has.
    Windows and sessions: after the store committed the version that removed the closed ones, before their sink
    append."""
    import phases._internal.live.micro_batch as engine
    from phases._internal.coordination.progress_log import ProgressLog

    source = str(tmp_path / "source")
    backlog = {1: [("a", 100 * SECOND, 1), ("b", 90 * SECOND, 2)]}
    live_versions = {2: [("a", 110 * SECOND, 3), ("c", 120 * SECOND, 4)], 3: [("b", 200 * SECOND, 5)]}
    write_source(spark, source, backlog)
    p = _pipeline(kind, source, str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    for v in sorted(live_versions):
        append_version(spark, source, live_versions[v])

    def crash(*args, **kwargs):
        raise RuntimeError(f"simulated crash before the {fails} write")

    if kind == "keyed" and fails == "sink":
        monkeypatch.setattr(engine.tables, "upsert_marked", crash)
    elif kind == "keyed":
        real_write = ProgressLog.write

        def write_or_crash(self, batch_id, record):
            if batch_id >= 0:
                crash()
            return real_write(self, batch_id, record)

        monkeypatch.setattr(ProgressLog, "write", write_or_crash)
    else:  # windows and sessions append the closed ones after the store's commit; crash right before that append
        monkeypatch.setattr(engine.tables, "append_marked", crash)
    with pytest.raises(Exception, match="simulated crash"):
        LiveRunner.from_manifest(spark, p).start(available_now=True)
    monkeypatch.undo()

    LiveRunner.from_manifest(spark, p).start(available_now=True)
    _assert_sink(spark, kind, p, _expected(kind, {**backlog, **live_versions}))


@pytest.mark.slow
def test_kill_9_after_a_progress_record_and_before_sparks_commit_then_versions_arriving_count_once(spark, tmp_path):
    """The live process is SIGKILLed once its first micro-batch's progress record is written and before Spark's
    commit log records the batch; more versions arrive; the restart's query runs that batch again. Its record is
    the truth (its writes are done): the next micro-batch goes on from the state the record names, so every
    record of every version counts once. (It once ran the batch again as if new, kept the old record on disk and
    the new one in memory, and the next micro-batch loaded the handoff's state: the batch's records were lost.)"""
    import subprocess
    import sys

    source = str(tmp_path / "source")
    backlog = {1: [("a", 100 * SECOND, 1), ("b", 90 * SECOND, 2)]}
    first = {2: [("a", 110 * SECOND, 3), ("c", 120 * SECOND, 4)]}
    later = {3: [("a", 130 * SECOND, 5), ("b", 140 * SECOND, 6)], 4: [("c", 150 * SECOND, 7)]}
    write_source(spark, source, backlog)
    p = _pipeline("keyed", source, str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    append_version(spark, source, first[2])
    child = subprocess.run(
        [sys.executable, "-m", "tests.phases.live.live_child", p.model_dump_json(), "recorded"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    for v in sorted(later):
        append_version(spark, source, later[v])
    LiveRunner.from_manifest(spark, p, take_over=True).start(available_now=True)
    _assert_sink(spark, "keyed", p, _expected("keyed", {**backlog, **first, **later}))


@pytest.mark.slow
# Each kill point once and each kind once (a child JVM each): the other two pairs are the in-process crashes at the
# same points (test_a_crash_between_the_state_write_and_the_sink_write_is_replayed_exactly_once).
@pytest.mark.parametrize(("kill_at", "kind"), [("sink", "keyed"), ("progress", "tumbling")])
def test_kill_9_of_the_live_process_after_the_state_write_then_a_restart_counts_nothing_twice(
    spark, tmp_path, kill_at, kind
):
    """A real crash: the live process is SIGKILLed after its state store committed the next version and before
    the sink write (``sink``: the keyed upsert, the closed windows' append), or after the sink write and before the
    progress record (``progress``). Its lease is left behind (taken over explicitly); the restart replays the
    micro-batch from the version the last record names: the sink gets the batch once."""
    import subprocess
    import sys

    from phases._internal.coordination import leases

    source = str(tmp_path / "source")
    backlog = {1: [("a", 100 * SECOND, 1), ("b", 90 * SECOND, 2)]}
    live_versions = {2: [("a", 110 * SECOND, 3), ("c", 120 * SECOND, 4)], 3: [("b", 200 * SECOND, 5)]}
    write_source(spark, source, backlog)
    p = _pipeline(kind, source, str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    for v in sorted(live_versions):
        append_version(spark, source, live_versions[v])

    child = subprocess.run(
        [sys.executable, "-m", "tests.phases.live.live_child", p.model_dump_json(), kill_at],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    with pytest.raises(leases.LeaseHeld, match="take_over=True"):
        LiveRunner.from_manifest(spark, p).start(available_now=True)
    LiveRunner.from_manifest(spark, p, take_over=True).start(available_now=True)
    _assert_sink(spark, kind, p, _expected(kind, {**backlog, **live_versions}))
    assert quarantine_rows(spark, str(tmp_path / "run")) == []
