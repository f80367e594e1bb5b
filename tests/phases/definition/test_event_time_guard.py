"""The event-time plausibility guard: a record far in the future of its version's commit (``max_future``) or
before ``min_event_time`` is quarantined with its reason and never moves the watermark, in the backlog, live
and in one streaming job alike; the handoff counts the far-future ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.errors import DefinitionError
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, quarantine_rows, sink_rows, write_source
from tests.phases.live.test_live import DELAY_S, S

# One record dated 2099 in the middle of the backlog; without the guard it would move the watermark to 2099
# and every record after it would be late.
FAR = reference.FAR_FUTURE_US
BACKLOG = {1: [("a", 100 * S, 1)], 2: [("b", FAR, 2), ("a", 110 * S, 3)], 3: [("b", 120 * S, 4)]}
LIVE = {4: [("a", 130 * S, 5), ("c", FAR + S, 6)], 5: [("b", 140 * S, 7)]}


def _run(spark, tmp_path, name: str, **settings) -> tuple:
    source = str(tmp_path / name / "source")
    write_source(spark, source, BACKLOG)
    p = make_pipeline(source, str(tmp_path / name / "run"), delay_s=DELAY_S, **settings)
    handoff = BacklogRunner(spark, p).run()
    for v in sorted(LIVE):
        append_version(spark, source, LIVE[v])
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    single = make_pipeline(source, str(tmp_path / name / "single"), delay_s=DELAY_S, **settings)
    LiveRunner.streaming_only(spark, single).start(available_now=True)
    return p, single, handoff


def test_a_far_future_record_is_quarantined_and_does_not_make_later_records_late(spark, tmp_path):
    p, single, handoff = _run(spark, tmp_path, "guarded")
    expected, expected_q = reference.run({**BACKLOG, **LIVE}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert_results_equal(sink_rows(spark, single.sink.path), expected)
    assert sorted(expected) == ["a", "b"]  # c's only record is far-future
    got_q = quarantine_rows(spark, str(tmp_path / "guarded" / "run"))
    assert got_q == sorted(expected_q, key=repr) == quarantine_rows(spark, str(tmp_path / "guarded" / "single"))
    assert [(v, row[0], reason.split(":")[0]) for v, row, reason in got_q] == [(2, "b", "future"), (4, "c", "future")]
    assert "max_future" in got_q[0][2]
    assert handoff.future_rows == 1 and handoff.invalid_rows == 1 and handoff.late_rows == 0
    assert handoff.backlog_max_event_time_us < FAR  # the guard kept the watermark where the data is


def test_without_the_guard_one_far_future_record_makes_everything_after_it_late(spark, tmp_path):
    """What the guard prevents (``max_future=None`` turns it off): the 2099 record moves the watermark."""
    p, _, handoff = _run(spark, tmp_path, "unguarded", max_future=None)
    got_q = quarantine_rows(spark, str(tmp_path / "unguarded" / "run"))
    late = sorted(row[0] for _, row, reason in got_q if reason.startswith("late"))
    assert late == ["a", "b", "b"]  # b at 120 s in the backlog, then live a at 130 s and b at 140 s
    assert handoff.future_rows == 0 and handoff.late_rows == 1


def test_records_before_min_event_time_are_quarantined_as_past(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, {1: [("a", 100 * S, 1), ("b", -3600 * S, 2)], 2: [("b", 110 * S, 3)]})
    bound = datetime(2026, 1, 1, tzinfo=UTC)  # the tests' event-time epoch: b's first record is an hour before
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S, min_event_time=bound)
    BacklogRunner(spark, p).run()
    got_q = quarantine_rows(spark, str(tmp_path / "run"))
    assert [(row[0], reason) for _, row, reason in got_q] == [
        ("b", "past: event time before 2026-01-01T00:00:00+00:00 (min_event_time)")
    ]
    assert sink_rows(spark, p.sink.path)["b"]["n"] == 1


def test_guard_settings_are_validated_and_shape_the_fingerprint(tmp_path):
    base = make_pipeline("s", str(tmp_path))
    with pytest.raises(DefinitionError, match="max_future must be >= 0 or None"):
        make_pipeline("s", str(tmp_path), max_future=timedelta(hours=-1))
    assert make_pipeline("s", str(tmp_path), max_future=timedelta(days=1)).fingerprint() == base.fingerprint()
    assert make_pipeline("s", str(tmp_path), max_future=timedelta(hours=1)).fingerprint() != base.fingerprint()
    assert make_pipeline("s", str(tmp_path), max_future=None).fingerprint() != base.fingerprint()
    naive = make_pipeline("s", str(tmp_path), min_event_time=datetime(2020, 1, 1))
    assert naive.min_event_time == datetime(2020, 1, 1, tzinfo=UTC)
    assert naive.fingerprint() != base.fingerprint()


def test_the_far_future_reason_says_its_bound_as_a_person_writes_it():
    """It read "more than 1 day, 0:00:00 after its version's commit"."""
    from phases._internal.records import duration_text, future_reason

    assert (
        future_reason(timedelta(days=1)) == "future: event time more than 1 day after its version's commit (max_future)"
    )
    assert duration_text(timedelta(hours=2, minutes=30)) == "2 hours 30 minutes"
    assert duration_text(timedelta(seconds=90)) == "1 minute 30 seconds"
    assert duration_text(timedelta(milliseconds=500)) == "0.5 seconds"


def test_the_log_does_not_prove_a_far_future_last_version_on_time(spark, tmp_path):
    """Versions in event-time order, the last one's only record dated 2099: the log's bounds show nothing late, but
    its commit time (read from the log) shows the record beyond ``max_future``: the backlog scans, and quarantines
    it."""
    source = str(tmp_path / "source")
    write_source(spark, source, {1: [("a", 100 * S, 1)], 2: [("b", 110 * S, 2)], 3: [("c", FAR, 3)]})
    runner = BacklogRunner(spark, make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S))
    handoff = runner.run()
    assert "statistics_from_log" not in runner.timings
    assert handoff.future_rows == 1 and handoff.backlog_max_event_time_us < FAR
    from phases._internal.sources.delta import DeltaTableSource

    reader = DeltaTableSource(spark, runner.pipeline.source, runner.pipeline.source.path)
    spark_times, log_times = dict(reader.commit_times()), reader.log_commit_times(1)
    assert sorted(log_times) == [1, 2, 3] == sorted(v for v in spark_times if v >= 1)
    assert all(abs((log_times[v] - spark_times[v]).total_seconds()) < 5 for v in log_times)
