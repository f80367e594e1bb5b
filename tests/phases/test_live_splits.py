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

from phases.backlog.runner import BacklogRunner
from phases.definition import SessionAggregate, Window, WindowedAggregate
from phases.live.runner import LiveRunner
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import append_version, assert_results_equal, quarantine_rows, sink_rows, write_source
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND, _materialize, _versions
from tests.phases.test_windows import AGGS, _emitted

KINDS = ["keyed", "tumbling", "sliding", "session"]


def _pipeline(kind: str, source: str, root: str):
    if kind == "keyed":
        return make_pipeline(source, root, delay_s=DELAY_S)
    if kind == "session":
        op = SessionAggregate(gap=timedelta(seconds=12), aggregations=AGGS)
    else:
        slide = timedelta(seconds=10) if kind == "sliding" else None
        op = WindowedAggregate(window=Window(size=timedelta(seconds=20), slide=slide), aggregations=AGGS)
    return make_pipeline(source, root, delay_s=DELAY_S, operator=op)


def _expected(kind: str, versions: dict) -> dict:
    if kind == "keyed":
        return reference.run(versions, DELAY_S * SECOND)[0]
    if kind == "session":
        return reference.run_sessions(versions, DELAY_S * SECOND, 12 * SECOND)
    slide = 10 if kind == "sliding" else 20
    return reference.run_windows(versions, DELAY_S * SECOND, 20 * SECOND, slide * SECOND)[0]


def _assert_sink(spark, kind: str, path: str, expected: dict) -> None:
    if kind == "keyed":
        assert_results_equal(sink_rows(spark, path), expected)
    else:
        assert _emitted(spark, path) == expected


@pytest.mark.slow
@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=_versions,
    cut=st.integers(min_value=0, max_value=5),
    kind=st.sampled_from(KINDS),
    files=st.integers(min_value=1, max_value=3),
    per_trigger=st.integers(min_value=1, max_value=2),
)
def test_live_equals_one_streaming_job_under_any_micro_batch_split(spark, tmp_path, raw, cut, kind, files, per_trigger):
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = _materialize(raw)
    cutoff = min(cut, len(versions))
    write_source(spark, source, {v: rows for v, rows in versions.items() if v <= cutoff}, files=files)

    two_phase = _pipeline(kind, str(source), str(root / "two_phase"))
    BacklogRunner(spark, two_phase).run()
    LiveRunner.from_manifest(spark, two_phase, max_files_per_trigger=per_trigger).start(available_now=True)
    for v in sorted(versions):
        if v > cutoff:
            append_version(spark, source, versions[v], files)
    # Every live version piled up before this restart: micro-batches of `per_trigger` files mix them.
    LiveRunner.from_manifest(spark, two_phase, max_files_per_trigger=per_trigger).start(available_now=True)

    single = _pipeline(kind, source, str(root / "single"))
    LiveRunner.streaming_only(spark, single, max_files_per_trigger=per_trigger).start(available_now=True)

    expected = _expected(kind, versions)
    _assert_sink(spark, kind, two_phase.sink.path, expected)
    _assert_sink(spark, kind, single.sink.path, expected)
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
    [("keyed", "sink"), ("keyed", "state"), ("tumbling", "sink")],
    ids=["keyed-state-committed", "keyed-sink-committed", "tumbling-state-committed"],
)
def test_a_crash_between_the_state_write_and_the_sink_write_is_replayed_exactly_once(
    spark, tmp_path, monkeypatch, kind, fails
):
    """The micro-batch dies with one of its two writes committed and the other not; the restart replays it:
    Delta skips the committed write (same txnAppId/txnVersion), the other gets the batch once, nothing is
    counted twice. Keyed aggregations write the state and the sink at the same time, so either can be the one
    committed: with the state committed, the replay must not combine the batch into the state a second time
    for the sink's values."""
    import phases.live.micro_batch as engine

    source = str(tmp_path / "source")
    backlog = {1: [("a", 100 * SECOND, 1), ("b", 90 * SECOND, 2)]}
    live_versions = {2: [("a", 110 * SECOND, 3), ("c", 120 * SECOND, 4)], 3: [("b", 200 * SECOND, 5)]}
    write_source(spark, source, backlog)
    p = _pipeline(kind, source, str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    for v in sorted(live_versions):
        append_version(spark, source, live_versions[v])

    if kind == "keyed":
        real_replace = engine.tables.replace_rows

        def replace_or_crash(spark_, path, rows, keys):
            if (path == p.sink.path) == (fails == "sink"):
                raise RuntimeError(f"simulated crash: the {fails} write fails, the other commits")
            return real_replace(spark_, path, rows, keys)

        monkeypatch.setattr(engine.tables, "replace_rows", replace_or_crash)
    else:  # windows append their sink rows after the state MERGE; crash right before that append
        monkeypatch.setattr(
            engine.tables, "append_once", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("simulated crash"))
        )
    with pytest.raises(Exception, match="simulated crash"):
        LiveRunner.from_manifest(spark, p).start(available_now=True)
    monkeypatch.undo()

    LiveRunner.from_manifest(spark, p).start(available_now=True)
    _assert_sink(spark, kind, p.sink.path, _expected(kind, {**backlog, **live_versions}))


@pytest.mark.slow
def test_kill_9_of_the_live_process_after_the_state_write_then_a_restart_counts_nothing_twice(spark, tmp_path):
    """A real crash: the live process is SIGKILLed after its state MERGE committed, before the sink write.
    Its lease is left behind (taken over explicitly), the restart replays the micro-batch: Delta skips the
    state MERGE, the sink gets it once."""
    import subprocess
    import sys

    from phases.storage import leases

    source = str(tmp_path / "source")
    backlog = {1: [("a", 100 * SECOND, 1), ("b", 90 * SECOND, 2)]}
    live_versions = {2: [("a", 110 * SECOND, 3), ("c", 120 * SECOND, 4)], 3: [("b", 200 * SECOND, 5)]}
    write_source(spark, source, backlog)
    p = _pipeline("keyed", source, str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    for v in sorted(live_versions):
        append_version(spark, source, live_versions[v])

    child = subprocess.run(
        [sys.executable, "-m", "tests.phases.live_child", p.model_dump_json(), "sink"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    with pytest.raises(leases.LeaseHeld, match="take_over=True"):
        LiveRunner.from_manifest(spark, p).start(available_now=True)
    LiveRunner.from_manifest(spark, p, take_over=True).start(available_now=True)
    _assert_sink(spark, "keyed", p.sink.path, _expected("keyed", {**backlog, **live_versions}))
    assert quarantine_rows(spark, str(tmp_path / "run")) == []
