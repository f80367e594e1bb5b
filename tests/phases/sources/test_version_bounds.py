"""The log's per-version bounds prove a range on time only when no exact event times inside them can make a
record late; the backlog then skips the statistics scan and still hands off what the scan would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from phases._internal.lateness import version_watermarks
from phases._internal.sources.version_bounds import VersionBounds, proves_all_on_time
from tests.conftest import examples

MS = 1000


def _bounds(version: int, times_us: list[int]) -> VersionBounds:
    """What the log records of a version with these event times: ms-truncated min and max."""
    if not times_us:
        return VersionBounds(version, 0, None, None, 0)
    return VersionBounds(version, len(times_us), min(times_us) // MS * MS, max(times_us) // MS * MS, 0)


@settings(max_examples=examples(300), deadline=None)
@given(
    versions=st.lists(st.lists(st.integers(0, 20_000), max_size=5), min_size=1, max_size=6),
    prior=st.one_of(st.none(), st.integers(0, 20_000)),
    delay=st.integers(0, 5_000),
)
def test_a_proof_is_never_wrong_for_any_event_times_within_the_logged_bounds(versions, prior, delay):
    bounds = [_bounds(v, times) for v, times in enumerate(versions)]
    if not proves_all_on_time(bounds, prior, delay):
        return
    maxima = [(v, max(times)) for v, times in enumerate(versions) if times]
    marks, _ = version_watermarks(maxima, prior, delay)
    late = [t for v, times in enumerate(versions) for t in times if v in marks and t <= marks[v]]
    assert late == [], f"proved on time, but {late} are late under {marks}"


def test_ordered_versions_are_proved_and_an_old_record_or_a_null_is_not():
    ordered = [_bounds(0, [0, 59_000_000]), _bounds(1, [60_000_000, 119_000_000])]
    assert proves_all_on_time(ordered, None, delay_us=0)
    late = [*ordered, _bounds(2, [10_000_000])]
    assert not proves_all_on_time(late, None, delay_us=0)
    assert proves_all_on_time(late, None, delay_us=200_000_000)  # within the delay: on time
    with_null = [ordered[0], VersionBounds(1, 5, 60_000_000, 61_000_000, nulls=1)]
    assert not proves_all_on_time(with_null, None, delay_us=0)


def test_a_record_within_the_truncated_millisecond_is_not_proved():
    # Version 0's max is 1_000_999 us, logged as 1_000_000: a version-1 record at 1_000_500 with delay 0 may
    # be late (it is: 1_000_500 <= 1_000_999), so the proof must not claim otherwise.
    bounds = [_bounds(0, [1_000_999]), _bounds(1, [1_000_500])]
    assert not proves_all_on_time(bounds, None, delay_us=0)


@settings(max_examples=examples(6), deadline=None)
@given(
    versions=st.lists(
        st.lists(st.integers(0, 20_000), min_size=1, max_size=8),  # microseconds: several inside one millisecond
        min_size=1,
        max_size=3,
    ),
    files=st.integers(1, 3),
)
def test_the_exact_maximum_is_read_from_the_files_that_can_hold_it_without_a_spark_job(
    spark, tmp_path_factory, versions, files
):
    from phases._internal.sources.version_bounds import exact_max_us, read
    from tests.helpers import _EPOCH_US, append_version, create_source, spark_jobs

    path = str(tmp_path_factory.mktemp("exact") / "source")
    create_source(spark, path)
    for i, times in enumerate(versions):
        append_version(spark, path, [(f"k{i}-{j}", t, 1) for j, t in enumerate(times)], files)
    with spark_jobs(spark, "the exact maximum") as jobs:
        bounds = read(path, 1, len(versions), "ts", ["key"])
        assert bounds is not None
        top = max(b.max_floor_us for b in bounds if b.max_floor_us is not None)
        reaching = [b for b in bounds if b.max_ceil_us is not None and b.max_ceil_us >= top]
        found = exact_max_us(path, len(versions), reaching, top, "ts")
    assert found == _EPOCH_US + max(max(times) for times in versions)
    assert jobs == []
