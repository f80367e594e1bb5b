"""Session windows in two phases: the backlog emits the sessions the final backlog watermark closed and hands
the open ones over; live, each open session re-enters Spark's session aggregation as one row spanning it.
For any cut-off the emitted sessions equal one streaming job's and a plain-Python reference's; increments
merge open sessions with new records."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import SessionAggregate
from phases._internal.errors import DefinitionError
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import EVENT_VERSIONS, append_version, materialize, quarantine_rows, write_source
from tests.phases.operators.test_windows import AGGS, _emitted
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

GAPS = [4, 12]


def _pipeline(source: str, root: str, gap_s: int):
    return make_pipeline(
        source, root, delay_s=DELAY_S, operator=SessionAggregate(gap=timedelta(seconds=gap_s), aggregations=AGGS)
    )


@pytest.mark.slow
@settings(max_examples=examples(3), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=EVENT_VERSIONS, cut=st.integers(min_value=0, max_value=5), gap_s=st.sampled_from(GAPS))
def test_sessions_two_phase_equal_a_single_streaming_job_for_any_cutoff(spark, tmp_path, raw, cut, gap_s):
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = materialize(raw)
    cutoff = min(cut, len(versions))
    backlog = {v: rows for v, rows in versions.items() if v <= cutoff}
    write_source(spark, source, backlog)

    two_phase = _pipeline(source, str(root / "two_phase"), gap_s)
    handoff = BacklogRunner(spark, two_phase).run()
    expected_backlog = reference.run_sessions(backlog, DELAY_S * SECOND, gap_s * SECOND)
    assert _emitted(spark, two_phase.sink.path) == expected_backlog
    assert handoff.sink_rows == len(expected_backlog)
    LiveRunner.from_manifest(spark, two_phase).start(available_now=True)
    for v in sorted(versions):
        if v > cutoff:
            append_version(spark, source, versions[v])
    LiveRunner.from_manifest(spark, two_phase).start(available_now=True)

    single = _pipeline(source, str(root / "single"), gap_s)
    LiveRunner.streaming_only(spark, single, max_files_per_trigger=1).start(available_now=True)

    expected = reference.run_sessions(versions, DELAY_S * SECOND, gap_s * SECOND)
    assert _emitted(spark, two_phase.sink.path) == expected
    assert _emitted(spark, single.sink.path) == expected
    assert quarantine_rows(spark, str(root / "two_phase")) == quarantine_rows(spark, str(root / "single"))


def test_a_catch_up_increment_extends_open_sessions_and_emits_each_once(spark, tmp_path):
    source = str(tmp_path / "source")
    first = {1: [("a", 0, 1), ("a", 3 * SECOND, 2), ("b", 10 * SECOND, 5)]}
    write_source(spark, source, first)
    p = _pipeline(source, str(tmp_path / "p"), 4)
    BacklogRunner(spark, p).run()
    assert _emitted(spark, p.sink.path) == {}  # W = 10 - 15 s: every session open
    later = {2: [("a", 6 * SECOND, 3)], 3: [("c", 40 * SECOND, 1)]}  # a's session grows to [0, 10 s)
    for v in sorted(later):
        append_version(spark, source, later[v])
    handoff = BacklogRunner(spark, p).run_increment()
    assert handoff.kind == "increment"
    expected = reference.run_sessions({**first, **later}, DELAY_S * SECOND, 4 * SECOND)
    assert expected == {
        ("a", 0, 10 * SECOND): {"n": 3, "total": 6, "hi": 3},
        ("b", 10 * SECOND, 14 * SECOND): {"n": 1, "total": 5, "hi": 5},
    }
    assert _emitted(spark, p.sink.path) == expected


def test_session_definitions_are_validated():
    with pytest.raises(DefinitionError, match="session gap must be > 0"):
        SessionAggregate(gap=timedelta(0), aggregations=AGGS)
    with pytest.raises(DefinitionError, match="reserved for the session's bounds"):
        SessionAggregate(
            gap=timedelta(seconds=1), aggregations=[*AGGS[:1], AGGS[0].model_copy(update={"name": "window_start"})]
        )
