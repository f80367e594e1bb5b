"""Event-time windows in two phases: the backlog emits the windows the final backlog watermark closed and
hands the open ones over; the live phase closes them. For any cut-off the emitted windows equal one
streaming job's and a plain-Python reference's."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Aggregation, Window, WindowedAggregate
from phases._internal.errors import DefinitionError
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import EVENT_VERSIONS, append_version, materialize, quarantine_rows, us_of, write_source
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

AGGS = [
    Aggregation(name="n", kind="count"),
    Aggregation(name="total", kind="sum", column="value"),
    Aggregation(name="hi", kind="max", column="value"),
]
WINDOWS = [(10, None), (20, 10), (30, 10)]  # (size s, slide s); sizes divide a day: epoch-aligned like the data


def _pipeline(source: str, root: str, size_s: int, slide_s: int | None):
    window = Window(size=timedelta(seconds=size_s), slide=timedelta(seconds=slide_s) if slide_s else None)
    return make_pipeline(source, root, delay_s=DELAY_S, operator=WindowedAggregate(window=window, aggregations=AGGS))


def _emitted(spark, path: str) -> dict[tuple[str, int, int], dict]:
    return emitted_windows(spark.read.format("delta").load(path).collect())


def emitted_windows(rows) -> dict[tuple[str, int, int], dict]:
    """Result rows of :data:`AGGS` by (key, window start, window end); a window in them twice fails."""
    out = {}
    for r in rows:
        key = (r["key"], us_of(r["window_start"]), us_of(r["window_end"]))
        assert key not in out, f"window emitted twice: {key}"
        out[key] = {"n": r["n"], "total": r["total"], "hi": r["hi"]}
    return out


@pytest.mark.slow
@settings(max_examples=examples(3), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=EVENT_VERSIONS, cut=st.integers(min_value=0, max_value=5), shape=st.sampled_from(WINDOWS))
def test_windows_two_phase_equal_a_single_streaming_job_for_any_cutoff(spark, tmp_path, raw, cut, shape):
    size_s, slide_s = shape
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = materialize(raw)
    cutoff = min(cut, len(versions))
    write_source(spark, source, {v: rows for v, rows in versions.items() if v <= cutoff})

    two_phase = _pipeline(source, str(root / "two_phase"), size_s, slide_s)
    handoff = BacklogRunner(spark, two_phase).run()
    expected_backlog, _ = reference.run_windows(
        {v: r for v, r in versions.items() if v <= cutoff},
        DELAY_S * SECOND,
        size_s * SECOND,
        (slide_s or size_s) * SECOND,
    )
    assert _emitted(spark, two_phase.sink.path) == expected_backlog  # closed by the final backlog watermark
    assert handoff.sink_rows == len(expected_backlog)
    LiveRunner.from_manifest(spark, two_phase).start(available_now=True)
    for v in sorted(versions):
        if v > cutoff:
            append_version(spark, source, versions[v])
    LiveRunner.from_manifest(spark, two_phase).start(available_now=True)

    single = _pipeline(source, str(root / "single"), size_s, slide_s)
    LiveRunner.streaming_only(spark, single, max_files_per_trigger=1).start(available_now=True)

    expected, _ = reference.run_windows(versions, DELAY_S * SECOND, size_s * SECOND, (slide_s or size_s) * SECOND)
    assert _emitted(spark, two_phase.sink.path) == expected
    assert _emitted(spark, single.sink.path) == expected
    assert quarantine_rows(spark, str(root / "two_phase")) == quarantine_rows(spark, str(root / "single"))


def test_window_definitions_are_validated():
    with pytest.raises(DefinitionError, match="window slide must be > 0 and <= size"):
        Window(size=timedelta(seconds=10), slide=timedelta(seconds=20))
    with pytest.raises(DefinitionError, match="whole multiple of slide"):
        Window(size=timedelta(seconds=10), slide=timedelta(seconds=3))
    with pytest.raises(DefinitionError, match="window size must be > 0"):
        Window(size=timedelta(0))
    with pytest.raises(DefinitionError, match="reserved for the window's bounds"):
        WindowedAggregate(
            window=Window(size=timedelta(seconds=1)), aggregations=[Aggregation(name="window_end", kind="count")]
        )
    assert reference.windows_of(25, 20, 10) == [(10, 30), (20, 40)]
