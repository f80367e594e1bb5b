"""Catch-up increments of a Kafka source, on a real broker: an increment continues the base handoff's chunk plan from
its end offsets (chunks numbered after it) and records the plans so far, so the arrival order stays on record.

The promise: a backlog at any first round and increments at any later rounds equal, for every kind, the one-pass
backlog over the same offsets (a round is CHUNK records of each partition, so both cut the same chunks), and the
plain reference over the recorded chunks; the live phase then continues from the last increment's end offsets."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.backlog.slices import SliceRunner
from phases._internal.definition import ProcessOperator, SessionAggregate, Window, WindowedAggregate
from phases._internal.errors import PhaseStateError
from phases._internal.live.runner import LiveRunner
from phases._internal.sources.kafka import ChunkPlan
from tests import reference
from tests.conftest import examples
from tests.helpers import assert_results_equal, produce, sink_rows, ts, write_source
from tests.phases.operators.process_functions import Sessions
from tests.phases.operators.test_process_function import _outputs
from tests.phases.operators.test_two_input import LOWER_S, UPPER_S, _join, _pairs_of
from tests.phases.operators.test_windows import AGGS, _emitted
from tests.phases.sources.test_kafka_source import (
    DELAY_S,
    KAFKA_ROUNDS,
    PARTITIONS,
    SECOND,
    chunk_versions,
    delta_archive_handing_over,
    kafka_pipeline,
    kafka_quarantine,
    materialize_rounds,
)

KINDS = ("keyed", "tumbling", "session", "process", "interval_join")
RIGHT = {1: [("a", 20 * SECOND, 1), ("b", 45 * SECOND, 2), ("c", 70 * SECOND, 3)]}


def _overrides(kind: str, right: str) -> dict:
    if kind == "process":
        return {"operator": ProcessOperator(function="tests.phases.operators.process_functions:Sessions")}
    if kind == "interval_join":
        return {"operator": _join(right)}
    if kind == "tumbling":
        return {"operator": WindowedAggregate(window=Window(size=timedelta(seconds=20)), aggregations=AGGS)}
    if kind == "session":
        return {"operator": SessionAggregate(gap=timedelta(seconds=12), aggregations=AGGS)}
    return {}


def _results(spark, kind: str, path: str):
    if kind == "keyed":
        return sink_rows(spark, path)
    if kind in ("tumbling", "session"):
        return _emitted(spark, path)
    rows = spark.read.format("delta").load(path).collect()
    return _outputs(rows) if kind == "process" else _pairs_of(rows)


def _expected(kind: str, versions: dict):
    if kind == "keyed":
        return reference.run(versions, DELAY_S * SECOND)[0]
    if kind == "tumbling":
        return reference.run_windows(versions, DELAY_S * SECOND, 20 * SECOND, 20 * SECOND)[0]
    if kind == "session":
        return reference.run_sessions(versions, DELAY_S * SECOND, 12 * SECOND)
    if kind == "process":
        return _outputs(reference.run_process(versions, DELAY_S * SECOND, Sessions(), ts))
    return reference.run_interval_join(versions, RIGHT, DELAY_S * SECOND, LOWER_S * SECOND, UPPER_S * SECOND)


def _assert_equal(kind: str, got, expected) -> None:
    if kind == "keyed":
        assert_results_equal(got, expected)
    else:
        assert got == expected


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(KINDS),
    raw=KAFKA_ROUNDS,
    cuts=st.lists(st.integers(min_value=0, max_value=4), min_size=2, max_size=3),
)
def test_increments_of_a_topic_equal_the_one_pass_backlog_for_every_kind(spark, kafka, tmp_path, kind, raw, cuts):
    topic = f"events-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    root = tmp_path / uuid.uuid4().hex
    right = str(root / "right")
    write_source(spark, right, RIGHT)
    rounds = materialize_rounds(raw)
    points = sorted({min(c, len(rounds)) for c in cuts})
    produced: dict[tuple[int, int], reference.Row] = {}

    def produce_rounds(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            positions = produce(kafka.bootstrap_servers, topic, rounds[i])
            produced.update({pos: row for pos, (_, row) in zip(positions, rounds[i], strict=True)})

    p = kafka_pipeline(kafka, topic, str(root / "run"), **_overrides(kind, right))
    produce_rounds(0, points[0])
    handoff = BacklogRunner(spark, p).run()
    for previous, point in zip(points, points[1:], strict=False):
        produce_rounds(previous, point)
        base, handoff = handoff, BacklogRunner(spark, p).run_increment()
        if point == previous:
            assert handoff.manifest_id == base.manifest_id  # nothing new: the same handoff
            continue
        assert (handoff.kind, handoff.base_manifest_id) == ("increment", base.manifest_id)
        plan = ChunkPlan.from_json(handoff.source_position)
        assert plan.first == base.source_version + 1 and plan.start == ChunkPlan.from_json(base.source_position).end

    whole = kafka_pipeline(kafka, topic, str(root / "whole"), **_overrides(kind, right))
    one_pass = BacklogRunner(spark, whole).run()
    assert ChunkPlan.from_json(one_pass.source_position).end == ChunkPlan.from_json(handoff.source_position).end
    _assert_equal(kind, _results(spark, kind, p.sink.path), _results(spark, kind, whole.sink.path))
    for field in ("state_rows", "aggregated_rows", "late_rows", "invalid_rows", "final_watermark_us"):
        assert getattr(handoff, field) == getattr(one_pass, field), field

    # The live phase from the last handoff, then the reference over every recorded chunk.
    produce_rounds(points[-1], len(rounds))
    live = LiveRunner.from_manifest(spark, p)
    live.start(available_now=True)
    versions = chunk_versions(live.arrival_chunks(), produced)
    assert sum(len(rows) for rows in versions.values()) == len(produced)  # every record in exactly one chunk
    _assert_equal(kind, _results(spark, kind, p.sink.path), _expected(kind, versions))
    _, expected_q = reference.run(versions, DELAY_S * SECOND)
    assert kafka_quarantine(spark, str(root / "run")) == sorted(expected_q, key=repr)


def test_a_topic_takes_increments_but_no_daily_slices_and_no_backlog_checkpoint_interval(spark, kafka, tmp_path):
    from datetime import date

    from phases._internal.errors import DefinitionError

    topic = f"events-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    p = kafka_pipeline(kafka, topic, str(tmp_path))
    assert p.supports_increments and not p.supports_slices
    first = BacklogRunner(spark, p).run()
    produce(kafka.bootstrap_servers, topic, [(0, ("a", 100 * SECOND, 1))])
    second = BacklogRunner(spark, p).run_increment()
    assert json.loads(second.source_position)["earlier"][0]["end"] == json.loads(first.source_position)["end"]
    with pytest.raises(PhaseStateError, match="no commit days; catch it up with increments instead"):
        SliceRunner(spark, p, date(2026, 3, 1)).run_slice(date(2026, 3, 1))
    with pytest.raises(DefinitionError, match="which a kafka source does not support"):
        kafka_pipeline(kafka, topic, str(tmp_path), checkpoint_interval_during_backlog=timedelta(seconds=10))


def test_an_archive_handing_over_to_a_topic_is_caught_up_from_its_handoff_offsets(spark, kafka, tmp_path):
    """A hybrid source's increment reads the topic from the archive's handoff offsets (chunks numbered after the
    archive's versions), through the process operator's live step; the live phase then goes on from its end."""
    topic = f"hybrid-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    early = [(i % 2, (f"k{i % 3}", (100 + 3 * i) * SECOND, i)) for i in range(6)]  # offsets 0..2 of each partition
    archived = dict(zip(produce(kafka.bootstrap_servers, topic, early), [r for _, r in early], strict=True))
    archive = str(tmp_path / "archive")
    source = delta_archive_handing_over(spark, kafka, topic, archive, sorted(archived.items()), {0: 3, 1: 3})
    p = kafka_pipeline(kafka, topic, str(tmp_path / "run"), **_overrides("process", "unused"))
    p = p.model_copy(update={"source": source})
    first = BacklogRunner(spark, p).run()
    assert first.source_version == 1
    produced: dict[tuple[int, int], reference.Row] = {}
    later = [(i % 2, (f"k{i % 3}", (150 + 4 * i) * SECOND, 10 + i)) for i in range(4)]
    later.append((0, ("k0", 10 * SECOND, 99)))  # behind the archive's watermark: late in the increment
    produced.update(zip(produce(kafka.bootstrap_servers, topic, later), [r for _, r in later], strict=True))
    increment = BacklogRunner(spark, p).run_increment()
    plan = ChunkPlan.from_json(increment.source_position)
    assert (increment.kind, plan.first, plan.start) == ("increment", 2, {0: 3, 1: 3})
    tail = [(1, ("k1", 200 * SECOND, 50)), (0, ("k2", 230 * SECOND, 51))]
    produced.update(zip(produce(kafka.bootstrap_servers, topic, tail), [r for _, r in tail], strict=True))
    live = LiveRunner.from_manifest(spark, p)
    live.start(available_now=True)
    versions = {1: list(archived.values())} | chunk_versions(live.arrival_chunks(), produced)
    assert sum(len(rows) for rows in versions.values()) == len(archived) + len(produced)
    assert _results(spark, "process", p.sink.path) == _expected("process", versions)
    assert [r for _, r, reason in kafka_quarantine(spark, str(tmp_path / "run"))] == [("k0", 10 * SECOND, 99)]
