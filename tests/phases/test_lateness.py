"""Lateness is defined by arrival order of versions and does not depend on how versions are batched."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from phases.lateness import version_watermarks


def test_no_watermark_before_the_first_record_then_max_of_earlier_versions_minus_delay():
    marks, running = version_watermarks([(1, 100), (2, 50), (3, 300)], None, delay_us=10)
    assert marks == {2: 90, 3: 90}
    assert running == 300


def test_prior_maximum_from_the_backlog_sets_the_first_live_watermark():
    marks, running = version_watermarks([(7, 10)], prior_max_us=500, delay_us=100)
    assert marks == {7: 400}
    assert running == 500


@given(
    maxima=st.dictionaries(st.integers(0, 30), st.integers(-1000, 1000), min_size=1, max_size=12),
    cuts=st.lists(st.integers(0, 30), max_size=4),
    delay=st.integers(0, 200),
)
def test_watermarks_do_not_depend_on_how_versions_are_grouped_into_batches(maxima, cuts, delay):
    """The live tagger merges earlier batches' maxima; any batching gives the one-pass answer."""
    versions = sorted(maxima.items())
    whole, _ = version_watermarks(versions, None, delay)
    bounds = sorted(set(cuts))
    seen: dict[int, int] = {}
    batched: dict[int, int] = {}
    start = 0
    for bound in [*bounds, 31]:
        batch = [(v, m) for v, m in versions if start <= v < bound]
        merged = {**seen, **dict(batch)}
        marks, _ = version_watermarks(sorted(merged.items()), None, delay)
        batched.update({v: marks[v] for v, _ in batch if v in marks})
        seen.update(batch)
        start = bound
    assert batched == whole
