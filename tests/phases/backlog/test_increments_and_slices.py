"""The backlog built from pieces: catch-up increments and daily slices give the whole backlog's results."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.backlog.slices import SliceRunner
from phases._internal.errors import DefinitionError, PhaseStateError
from phases._internal.handoff import manifest
from phases._internal.live.runner import LiveRunner
from phases._internal.placement import Placement
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import (
    append_version,
    assert_results_equal,
    backdate_commits,
    quarantine_rows,
    sink_rows,
    write_source,
)
from tests.phases.backlog.test_backlog import DELAY_S, VERSIONS, S

DAY0 = date(2026, 3, 1)
NOW = datetime(2026, 3, 10, tzinfo=UTC)


def _at(day: date, hour: int = 12) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


@pytest.fixture
def source(spark, tmp_path):
    path = str(tmp_path / "source")
    write_source(spark, path, VERSIONS)
    # v0 (table creation) the day before DAY0, v1 on DAY0, nothing on DAY0+1, v2 and v3 on DAY0+2.
    backdate_commits(
        path,
        {
            0: _at(DAY0 - timedelta(days=1)),
            1: _at(DAY0),
            2: _at(DAY0 + timedelta(days=2), 1),
            3: _at(DAY0 + timedelta(days=2), 2),
        },
    )
    return path


def test_catch_up_increment_equals_one_backlog_over_all_versions(spark, tmp_path, source):
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    runner = BacklogRunner(spark, p)
    first = runner.run(end_version=1)
    second = BacklogRunner(spark, p).run_increment()
    assert (second.kind, second.base_manifest_id, second.source_version) == ("increment", first.manifest_id, 3)
    expected, expected_q = reference.run(VERSIONS, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert quarantine_rows(spark, p.locations.root) == sorted(expected_q, key=repr)
    whole = BacklogRunner(spark, make_pipeline(source, str(tmp_path / "whole"), delay_s=DELAY_S)).run()
    for field in ("state_rows", "input_rows", "aggregated_rows", "late_rows", "invalid_rows", "final_watermark_us"):
        assert getattr(second, field) == getattr(whole, field), field
    # Nothing new: the increment hands back the same manifest; a live phase then refuses increments.
    assert BacklogRunner(spark, p).run_increment().manifest_id == second.manifest_id
    live = LiveRunner.from_manifest(spark, p)
    live.start(available_now=True)
    append_version(spark, source, [("z", 100 * S, 1)])
    with pytest.raises(PhaseStateError, match="already switched to live"):
        BacklogRunner(spark, p).run_increment()


def test_slices_follow_commit_days_and_combine_to_the_whole_backlog(spark, tmp_path, source):
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    slices = SliceRunner(spark, p, DAY0)
    assert slices.day_versions(DAY0) == (0, 1)  # the first day takes the earlier versions too
    assert slices.day_versions(DAY0 + timedelta(days=1)) is None
    assert slices.day_versions(DAY0 + timedelta(days=2)) == (2, 3)
    days = [DAY0 + timedelta(days=i) for i in range(3)]
    # The last day first: slices are independent of each other (the watermark continues from the source).
    late_first = slices.run_range(days[2:], now=NOW)
    assert late_first.executed == ["2026-03-03"]
    with pytest.raises(PhaseStateError, match="do not cover the source without a gap"):
        slices.combine()
    result = slices.run_range(days, now=NOW)
    assert (result.executed, result.recovered) == (["2026-03-01", "2026-03-02"], ["2026-03-03"])
    handoff = slices.combine()
    assert (handoff.kind, handoff.source_version) == ("slices", 3)
    expected, expected_q = reference.run(VERSIONS, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert quarantine_rows(spark, p.locations.root) == sorted(expected_q, key=repr)
    manifest.check_matches(spark, handoff, Placement(p))
    assert (handoff.state_rows, handoff.late_rows, handoff.invalid_rows) == (4, 2, 1)


def test_a_slice_runs_only_once_its_day_is_over(spark, tmp_path, source):
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    with pytest.raises(PhaseStateError, match="is not over until 2026-03-02T00:00:00"):
        SliceRunner(spark, p, DAY0).run_slice(DAY0, now=_at(DAY0, 23))
    with pytest.raises(PhaseStateError, match="before the pipeline's first slice"):
        SliceRunner(spark, p, DAY0).day_versions(DAY0 - timedelta(days=1))


def _manifests(spark, p) -> list[tuple[str, int]]:
    rows = spark.read.format("delta").load(p.locations.manifests).filter(f"pipeline = '{p.name}'").collect()
    return [(r["kind"], r["source_version"]) for r in sorted(rows, key=lambda r: r["created_at_us"])]


def test_a_checkpoint_interval_during_backlog_commits_increments_and_a_crash_reruns_only_the_last(
    spark, tmp_path, source, monkeypatch
):
    p = make_pipeline(
        source, str(tmp_path / "run"), delay_s=DELAY_S, checkpoint_interval_during_backlog=timedelta(days=1)
    )
    runner = BacklogRunner(spark, p)
    # Commits: v0 DAY0-1 12:00, v1 DAY0 12:00 (a day later: next increment), v2 and v3 DAY0+2 01:00/02:00.
    assert runner.increment_ends(3) == [0, 1, 3]
    real = BacklogRunner._run_increment

    def crash_at_the_last(self, end_version):
        if end_version == 3:
            raise RuntimeError("simulated crash in the last increment")
        return real(self, end_version)

    monkeypatch.setattr(BacklogRunner, "_run_increment", crash_at_the_last)
    with pytest.raises(RuntimeError, match="simulated crash"):
        runner.run()
    monkeypatch.undo()
    assert _manifests(spark, p) == [("full", 0), ("increment", 1)]

    handoff = BacklogRunner(spark, p).run()
    assert _manifests(spark, p) == [("full", 0), ("increment", 1), ("increment", 3)]
    assert handoff.source_version == 3
    expected, expected_q = reference.run(VERSIONS, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert quarantine_rows(spark, p.locations.root) == sorted(expected_q, key=repr)


def test_a_checkpoint_interval_during_backlog_is_refused_where_increments_cannot_be_built():
    from phases._internal.definition import EndOfStreamStep, KafkaSource, MapPartition

    with pytest.raises(DefinitionError, match="end_of_stream steps \\['tiers'\\] consume the whole backlog"):
        make_pipeline(
            "s",
            "r",
            checkpoint_interval_during_backlog=timedelta(hours=1),
            end_of_stream=[
                EndOfStreamStep(
                    name="tiers",
                    operators=[
                        MapPartition(
                            function="tests.phases.steps.partition_functions:key_tier", output_schema="k string"
                        )
                    ],
                    output={"path": "tiers"},
                )
            ],
        )
    topic = KafkaSource(
        topic="t", bootstrap_servers="127.0.0.1:9", value_schema="key string, ts timestamp, value bigint"
    )
    with pytest.raises(DefinitionError, match="which a kafka source does not support"):
        make_pipeline(topic, "r", checkpoint_interval_during_backlog=timedelta(hours=1))
