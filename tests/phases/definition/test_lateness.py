"""Lateness is defined by arrival order of versions and does not depend on how versions are batched."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from phases._internal.lateness import VERSION, late_candidates, version_stats, version_watermarks
from tests.conftest import examples


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


@given(
    versions=st.lists(
        st.lists(st.one_of(st.none(), st.integers(-1000, 1000)), min_size=1, max_size=6), min_size=1, max_size=8
    ),
    delay=st.integers(0, 300),
)
@settings(max_examples=examples(15), deadline=None)
def test_only_versions_named_by_the_statistics_hold_late_or_invalid_records(spark, versions, delay):
    """One aggregation's per-version min/max/invalid count finds every version with a late or an invalid
    record (None stands for an invalid record), so the quarantine pass may skip all others."""
    rows = [(v, ts) for v, batch in enumerate(versions) for ts in batch]
    df = spark.createDataFrame(
        [(v, None if ts is None else datetime.fromtimestamp(ts / 1e6, tz=UTC)) for v, ts in rows],
        f"{VERSION} long, ts timestamp",
    )
    stats = version_stats(df, F.col("ts").isNotNull(), "ts")
    marks, _ = version_watermarks([(s.version, s.max_us) for s in stats if s.max_us is not None], None, delay)
    late = {v for v, ts in rows if ts is not None and v in marks and ts <= marks[v]}
    invalid = {v for v, ts in rows if ts is None}
    assert set(late_candidates(stats, marks)) == late
    assert {s.version for s in stats if s.invalid} == invalid
