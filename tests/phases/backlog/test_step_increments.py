"""Catch-up increments of the kinds whose state does not merge (process functions, interval joins, co-groups): the
live step over each increment's range, committed with a new manifest (:mod:`phases._internal.backlog.increments`).

The promise: a backlog at any first cut-off followed by increments at any later points equals the one-pass backlog
over the same versions (sink, state and quarantine), and with the live phase after it, the plain reference over every
version. A crash anywhere in an increment, then a rerun, changes nothing; a live phase from the base is refused
meanwhile."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import ProcessOperator
from phases._internal.errors import PhaseStateError
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import EVENT_VERSIONS, append_version, materialize, quarantine_rows, ts, write_source
from tests.phases.operators.process_functions import Sessions
from tests.phases.operators.test_process_function import _outputs
from tests.phases.operators.test_two_input import LOWER_S, UPPER_S, WINDOW_S, _co_group, _groups, _join, _pairs_of
from tests.phases.operators.two_input_functions import match_summary
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

KINDS = ("process", "interval_join", "co_group")


def _operator(kind: str, right: str):
    if kind == "process":
        return ProcessOperator(function="tests.phases.operators.process_functions:Sessions")
    return _join(right) if kind == "interval_join" else _co_group(right)


def _results(spark, kind: str, path: str) -> list:
    rows = spark.read.format("delta").load(path).collect()
    if kind == "process":
        return _outputs(rows)
    return _pairs_of(rows) if kind == "interval_join" else _groups(rows)


def _expected(kind: str, left: dict, right: dict) -> list:
    if kind == "process":
        return _outputs(reference.run_process(left, DELAY_S * SECOND, Sessions(), ts))
    if kind == "interval_join":
        return reference.run_interval_join(left, right, DELAY_S * SECOND, LOWER_S * SECOND, UPPER_S * SECOND)
    return _groups(reference.run_co_group(left, right, DELAY_S * SECOND, WINDOW_S * SECOND, match_summary, ts))


def _normal(value):
    """A state value compared as a set where its order carries no meaning (the rows a window or a key holds)."""
    if isinstance(value, list):
        return sorted((_normal(v) for v in value), key=repr)
    if hasattr(value, "asDict"):
        return {k: _normal(v) for k, v in value.asDict().items()}
    return value


def _state(spark, handoff) -> list:
    rows = spark.read.format("delta").load(handoff.state_path).collect()
    return sorted(repr(_normal(r)) for r in rows)


def _upto(versions: dict, end: int) -> dict:
    return {v: rows for v, rows in versions.items() if v <= end}


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(KINDS),
    left=EVENT_VERSIONS,
    right=EVENT_VERSIONS,
    cuts=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=3),
)
def test_increments_of_every_kind_equal_the_one_pass_backlog_and_then_the_reference(
    spark, tmp_path, kind, left, right, cuts
):
    """The first cut-off runs the backlog, each later one an increment; a second input grows between them (each
    increment takes it to its head)."""
    lv, rv = materialize(left), materialize(right)
    points = sorted({min(c, len(lv)) for c in cuts})
    root = tmp_path / uuid.uuid4().hex
    left_src, right_src = str(root / "left"), str(root / "right")
    write_source(spark, left_src, _upto(lv, points[0]))
    write_source(spark, right_src, _upto(rv, 1))
    p = make_pipeline(left_src, str(root / "run"), delay_s=DELAY_S, operator=_operator(kind, right_src))
    handoff = BacklogRunner(spark, p).run()
    written_left, written_right = points[0], min(1, len(rv))
    for step, point in enumerate(points[1:], start=2):
        for v in range(written_left + 1, point + 1):
            append_version(spark, left_src, lv[v])
        for v in range(written_right + 1, min(step, len(rv)) + 1):
            append_version(spark, right_src, rv[v])
        written_left, written_right = point, max(written_right, min(step, len(rv)))
        base = handoff
        handoff = BacklogRunner(spark, p).run_increment()
        assert (handoff.kind, handoff.base_manifest_id, handoff.source_version) == (
            "increment",
            base.manifest_id,
            point,
        )

    # The one-pass backlog over the same versions of each input.
    whole = make_pipeline(left_src, str(root / "whole"), delay_s=DELAY_S, operator=_operator(kind, right_src))
    one_pass = BacklogRunner(spark, whole).run(end_version=written_left)
    assert _results(spark, kind, p.sink.path) == _results(spark, kind, whole.sink.path)
    assert _state(spark, handoff) == _state(spark, one_pass)
    assert quarantine_rows(spark, str(root / "run")) == quarantine_rows(spark, str(root / "whole"))
    for field in ("state_rows", "sink_rows", "aggregated_rows", "late_rows", "final_watermark_us"):
        assert getattr(handoff, field) == getattr(one_pass, field), field
    if p.inputs.two:
        assert (handoff.right_source_version, handoff.right_max_event_time_us) == (
            one_pass.right_source_version,
            one_pass.right_max_event_time_us,
        )
    assert _results(spark, kind, p.sink.path) == _expected(kind, _upto(lv, written_left), _upto(rv, written_right))

    # The live phase from the last increment's handoff over the rest: the reference over everything.
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    for v in range(written_left + 1, len(lv) + 1):
        append_version(spark, left_src, lv[v])
    for v in range(written_right + 1, len(rv) + 1):
        append_version(spark, right_src, rv[v])
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    assert _results(spark, kind, p.sink.path) == _expected(kind, lv, rv if p.inputs.two else {})


@pytest.mark.parametrize("kind", ["interval_join"])  # the process kind takes the same route
def test_an_increment_cut_short_after_its_output_is_refused_live_and_finished_by_a_rerun(
    spark, tmp_path, monkeypatch, kind
):
    """The increment appended its output, then died before its manifest: a live phase from the base would append
    that output again, so it is refused; the rerun finishes the same range (its append is skipped) and the results
    are the reference's."""
    from phases._internal.backlog.runner import BacklogRunner as Runner

    left = {1: [("a", 10 * SECOND, 1), ("b", 12 * SECOND, 2)], 2: [("a", 40 * SECOND, 3), ("a", 1 * SECOND, 4)]}
    right = {1: [("a", 15 * SECOND, 5), ("b", 45 * SECOND, 6)]}
    left_src, right_src = str(tmp_path / "left"), str(tmp_path / "right")
    write_source(spark, left_src, _upto(left, 1))
    write_source(spark, right_src, right)
    p = make_pipeline(left_src, str(tmp_path / "run"), delay_s=DELAY_S, operator=_operator(kind, right_src))
    base = BacklogRunner(spark, p).run()
    append_version(spark, left_src, left[2])
    real = Runner.write_handoff

    def die_after_the_step(self, write, **kwargs):
        raise RuntimeError("simulated crash before the state table and the manifest")

    monkeypatch.setattr(Runner, "write_handoff", die_after_the_step)
    with pytest.raises(RuntimeError, match="simulated crash"):
        BacklogRunner(spark, p).run_increment()
    monkeypatch.setattr(Runner, "write_handoff", real)
    with pytest.raises(PhaseStateError, match=f"increment from handoff {base.manifest_id} .* was cut short"):
        LiveRunner.from_manifest(spark, p)
    done = BacklogRunner(spark, p).run_increment()
    assert done.kind == "increment" and done.source_version == 2
    assert BacklogRunner(spark, p).run_increment().manifest_id == done.manifest_id  # nothing new, nothing open
    expected = _expected(kind, left, right if p.inputs.two else {})
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    assert _results(spark, kind, p.sink.path) == expected


def test_a_backlog_checkpoint_interval_commits_increments_for_a_process_function(spark, tmp_path):
    """FLIP-327's checkpoint interval during backlog for a kind that does not merge: one handoff per increment of
    source time, the last one equal to the reference."""
    from datetime import UTC, datetime

    from tests.helpers import backdate_commits

    versions = {
        1: [("a", 10 * SECOND, 1), ("b", 20 * SECOND, 2)],
        2: [("a", 50 * SECOND, 3), ("a", 5 * SECOND, 4)],
        3: [("b", 90 * SECOND, 5), ("c", 95 * SECOND, 6)],
    }
    source = str(tmp_path / "source")
    write_source(spark, source, versions)
    backdate_commits(source, {v: datetime(2026, 3, 1, v, tzinfo=UTC) for v in range(4)})  # an hour apart
    p = make_pipeline(
        source,
        str(tmp_path / "run"),
        delay_s=DELAY_S,
        operator=ProcessOperator(function="tests.phases.operators.process_functions:Sessions"),
        checkpoint_interval_during_backlog=timedelta(minutes=30),
    )
    assert p.supports_increments and not p.supports_slices
    runner = BacklogRunner(spark, p)
    assert runner.increment_ends(3) == [0, 1, 2, 3]
    last = runner.run()
    assert (last.kind, last.source_version) == ("increment", 3)
    assert _results(spark, "process", p.sink.path) == _expected("process", versions, {})
