"""Two-input operators (interval join, co-group) with a Kafka topic as either input or both, on a real broker.

A Kafka input keeps its own arrival chunks (fixed-size chunks of the backlog, then one chunk per live micro-batch,
:mod:`phases._internal.sources.kafka`) in the role a Delta input's versions play, its own W(v) and its own quarantine;
the join's watermark is the smaller of the two. The promise is the Delta one: for any cut-off of each input, the backlog
plus the live phase (restarted after every arrival) emit what one streaming job over the same arrivals emits, and
what the plain reference over each input's recorded chunks emits."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import CoGroup, DeltaSource, IntervalJoin, KafkaSource, Window
from phases._internal.errors import DefinitionError
from phases._internal.live.runner import LiveRunner
from phases._internal.storage import tables
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import EVENT_VERSIONS, append_version, materialize, produce, ts, us_of, write_source
from tests.phases.operators.test_two_input import LOWER_S, UPPER_S, WINDOW_S, _groups, _pairs
from tests.phases.operators.two_input_functions import match_summary
from tests.phases.sources.test_kafka_source import (
    CHUNK,
    KAFKA_ROUNDS,
    PARTITIONS,
    VALUE_SCHEMA,
    chunk_versions,
    delta_archive_handing_over,
    materialize_rounds,
)
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

SIDES = [("delta", "kafka"), ("kafka", "delta"), ("kafka", "kafka")]


class _Input:
    """One input of the test: a Delta table written version by version, or a topic produced round by round (a round
    is CHUNK records of each partition: one arrival chunk, in the backlog and in a live micro-batch alike)."""

    def __init__(self, spark, kafka, kind: str, root, name: str, arrivals: list):
        self.spark, self.kafka, self.kind, self.arrivals = spark, kafka, kind, arrivals
        self.produced: dict[tuple[int, int], reference.Row] = {}
        if kind == "kafka":
            self.topic = f"{name}-{uuid.uuid4().hex[:8]}"
            kafka.create_topic(self.topic, PARTITIONS)
            self.spec = KafkaSource(
                topic=self.topic,
                bootstrap_servers=kafka.bootstrap_servers,
                value_schema=VALUE_SCHEMA,
                backlog_chunk_records=CHUNK,
            )
        else:
            self.path = str(root / name)
            write_source(spark, self.path, {})
            self.spec = DeltaSource(path=self.path)

    def arrive(self, i: int) -> None:
        """Arrival ``i``: version i + 1 of the table, or round i of the topic."""
        if self.kind == "kafka":
            positions = produce(self.kafka.bootstrap_servers, self.topic, self.arrivals[i])
            self.produced.update({pos: row for pos, (_, row) in zip(positions, self.arrivals[i], strict=True)})
        else:
            append_version(self.spark, self.path, self.arrivals[i])

    def versions(self, runner: LiveRunner, label: str) -> dict[int, list[reference.Row]]:
        """What the reference replays: the table's versions, or the records of the chunks ``runner`` recorded."""
        if self.kind == "kafka":
            return chunk_versions(runner.arrival_chunks(label), self.produced)
        return {i + 1: rows for i, rows in enumerate(self.arrivals)}


def _arrivals(kind: str, raw_versions, raw_rounds) -> list:
    if kind == "kafka":
        return materialize_rounds(raw_rounds)
    versions = materialize(raw_versions)
    return [versions[v] for v in sorted(versions)]


def _join(right) -> IntervalJoin:
    return IntervalJoin(right=right, lower=timedelta(seconds=LOWER_S), upper=timedelta(seconds=UPPER_S))


def _co_group(right) -> CoGroup:
    return CoGroup(
        right=right,
        window=Window(size=timedelta(seconds=WINDOW_S)),
        function="tests.phases.operators.two_input_functions:match_summary",
        output_schema="left_n long, right_n long, left_total long, trace string",
    )


def _quarantine(spark, root) -> list[tuple]:
    path = f"{root}/quarantine"
    if not tables.exists(spark, path):
        return []
    rows = spark.read.format("delta").load(path).collect()
    out = []
    for r in rows:
        record = json.loads(r["record"])
        out.append((r["source_version"], record.get("key"), us_of(record.get("ts")), record.get("value"), r["reason"]))
    return sorted(out, key=repr)


def _run(spark, kafka, tmp_path, sides, left_raw, right_raw, cut_left, cut_right, operator_for):
    """The two-phase run (backlog at the cut-offs, then the live phase restarted after each arrival) and one
    streaming job over the same arrivals (run after each arrival too); returns both runners and the inputs."""
    root = tmp_path / uuid.uuid4().hex
    left = _Input(spark, kafka, sides[0], root, "left", _arrivals(sides[0], *left_raw))
    right = _Input(spark, kafka, sides[1], root, "right", _arrivals(sides[1], *right_raw))
    cuts = (min(cut_left, len(left.arrivals)), min(cut_right, len(right.arrivals)))
    two_phase = make_pipeline(left.spec, str(root / "two_phase"), delay_s=DELAY_S, operator=operator_for(right.spec))
    single = make_pipeline(left.spec, str(root / "single"), delay_s=DELAY_S, operator=operator_for(right.spec))
    single_live = LiveRunner.streaming_only(spark, single)
    # Arrivals one input at a time, the single job after each: a Kafka round is one chunk of that job.
    for side, cut in ((left, cuts[0]), (right, cuts[1])):
        for i in range(cut):
            side.arrive(i)
            single_live.start(available_now=True)
    BacklogRunner(spark, two_phase).run()
    live = LiveRunner.from_manifest(spark, two_phase)
    live.start(available_now=True)
    for i in range(max(len(left.arrivals) - cuts[0], len(right.arrivals) - cuts[1])):
        for side, cut in ((left, cuts[0]), (right, cuts[1])):
            if cut + i < len(side.arrivals):
                side.arrive(cut + i)
                single_live.start(available_now=True)
                live = LiveRunner.from_manifest(spark, two_phase)  # a restart from its checkpoint each time
                live.start(available_now=True)
    return root, live, single_live, left, right


def _references(live: LiveRunner, left: _Input, right: _Input) -> tuple[dict, dict]:
    return left.versions(live, ""), right.versions(live, "right")


def _expected_quarantine(left_versions: dict, right_versions: dict) -> list[tuple]:
    """The reference's quarantine of both inputs: (version or chunk, key, ts, value, reason), the right input's
    reasons naming it."""
    out = []
    for versions, prefix in ((left_versions, ""), (right_versions, "right input: ")):
        _, quarantined = reference.run(versions, DELAY_S * SECOND)
        out += [(v, *row, prefix + reason) for v, row, reason in quarantined]
    return sorted(out, key=repr)


def _assert_quarantines(spark, root, live, single_live, left, right) -> None:
    assert _quarantine(spark, root / "two_phase") == _expected_quarantine(*_references(live, left, right))
    assert _quarantine(spark, root / "single") == _expected_quarantine(*_references(single_live, left, right))


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["interval_join", "co_group"]),
    sides=st.sampled_from(SIDES),
    left_versions=EVENT_VERSIONS,
    left_rounds=KAFKA_ROUNDS,
    right_versions=EVENT_VERSIONS,
    right_rounds=KAFKA_ROUNDS,
    cut_left=st.integers(min_value=0, max_value=4),
    cut_right=st.integers(min_value=0, max_value=4),
)
def test_a_two_input_operator_with_a_topic_as_either_input_equals_one_streaming_job_and_the_reference(
    spark, kafka, tmp_path, kind, sides, left_versions, left_rounds, right_versions, right_rounds, cut_left, cut_right
):
    """Either kind, a topic on the left, the right or both; both runs equal the reference over what each recorded."""
    root, live, single_live, left, right = _run(
        spark,
        kafka,
        tmp_path,
        sides,
        (left_versions, left_rounds),
        (right_versions, right_rounds),
        cut_left,
        cut_right,
        _join if kind == "interval_join" else _co_group,
    )
    if kind == "interval_join":
        bounds = (DELAY_S * SECOND, LOWER_S * SECOND, UPPER_S * SECOND)
        expected = reference.run_interval_join(*_references(live, left, right), *bounds)
        assert _pairs(spark, f"{root}/two_phase/sink") == expected
        assert _pairs(spark, f"{root}/single/sink") == reference.run_interval_join(
            *_references(single_live, left, right), *bounds
        )
        assert _pairs(spark, f"{root}/single/sink") == expected
    else:
        args = (DELAY_S * SECOND, WINDOW_S * SECOND, match_summary, ts)
        expected = _groups(reference.run_co_group(*_references(live, left, right), *args))
        assert _groups(spark.read.format("delta").load(f"{root}/two_phase/sink").collect()) == expected
        assert _groups(spark.read.format("delta").load(f"{root}/single/sink").collect()) == expected
    _assert_quarantines(spark, root, live, single_live, left, right)


def test_a_join_refuses_the_same_topic_on_both_sides(kafka):
    topic = KafkaSource(topic="events", bootstrap_servers=kafka.bootstrap_servers, value_schema=VALUE_SCHEMA)
    with pytest.raises(DefinitionError, match="right source is the pipeline's own source .*kafka topic 'events'"):
        make_pipeline(topic, "/tmp/never-written", operator=_join(topic))


CRASH_POINTS = (
    "after the source's quarantine",
    "after the right input's quarantine",
    "after the pairs",
    "after the state",
)


def _round(i: int, key: str, side: int) -> list:
    """Round ``i`` of one side: on-time records that pair with the other side's, and one record late by then."""
    clock = 100 * (i + 1) * SECOND
    rows = [(0, (key, clock + side * SECOND, 10 * i + side)), (1, ("a", clock + 2 * SECOND, 10 * i + 5))]
    if i > 0:
        rows.append((2, (key, clock - 150 * SECOND, -i)))  # behind the previous round's watermark: late
    return rows


def test_a_join_of_two_topics_crashed_at_any_write_of_a_micro_batch_resumes_exactly(
    spark, kafka, tmp_path, monkeypatch
):
    """One micro-batch per crash point, each with late records on both sides and new pairs, dies after that write;
    the restart replays it (the same offsets from Spark's offset log, the same chunk, the same store version): nothing
    is lost or written twice, and the results equal the reference over the recorded chunks."""
    from phases._internal.coordination.progress_log import ProgressLog
    from phases._internal.storage.live_writes import BatchWrites
    from tests.helpers import crash_on_state_write

    rounds = len(CRASH_POINTS) + 1
    root = tmp_path / "p"
    left = _Input(spark, kafka, "kafka", root, "left", [_round(i, "a", 0) for i in range(rounds)])
    right = _Input(spark, kafka, "kafka", root, "right", [_round(i, "a", 3) for i in range(rounds)])
    p = make_pipeline(left.spec, str(root / "two_phase"), delay_s=DELAY_S, operator=_join(right.spec))
    left.arrive(0)
    right.arrive(0)
    BacklogRunner(spark, p).run()
    LiveRunner.from_manifest(spark, p).start(available_now=True)

    def fail(message: str):
        raise RuntimeError(f"simulated crash {message}")

    for i, crash in enumerate(CRASH_POINTS, start=1):
        left.arrive(i)
        right.arrive(i)
        if crash == "after the state":
            real_write = ProgressLog.write
            monkeypatch.setattr(
                ProgressLog,
                "write",
                lambda self, b, r, crash=crash, real_write=real_write: (
                    fail(crash) if b >= 0 else real_write(self, b, r)
                ),
            )
        elif crash == "after the pairs":
            crash_on_state_write(monkeypatch, f"simulated crash {crash}")
        else:
            what = "quarantine" if crash == "after the source's quarantine" else "quarantine_right"
            real_append = BatchWrites.append_once

            def append_then_die(self, df, path, written, what=what, real_append=real_append, crash=crash, **options):
                real_append(self, df, path, written, **options)
                if written == what:
                    fail(crash)

            monkeypatch.setattr(BatchWrites, "append_once", append_then_die)
        with pytest.raises(Exception, match="simulated crash"):
            LiveRunner.from_manifest(spark, p).start(available_now=True)
        monkeypatch.undo()
        LiveRunner.from_manifest(spark, p).start(available_now=True)

    live = LiveRunner.from_manifest(spark, p)
    versions = _references(live, left, right)
    expected = reference.run_interval_join(*versions, DELAY_S * SECOND, LOWER_S * SECOND, UPPER_S * SECOND)
    assert len(expected) >= 2 * rounds
    assert _pairs(spark, p.sink.path) == expected
    quarantined = _quarantine(spark, root / "two_phase")
    assert quarantined == _expected_quarantine(*versions)
    assert len(quarantined) == 2 * len(CRASH_POINTS), quarantined  # each late record once


def test_a_co_group_with_an_archive_handing_over_to_a_topic_as_its_right_input(spark, kafka, tmp_path):
    """The right input is FLIP-327's hybrid source: its archive (a Delta table with each record's Kafka position) up
    to the handoff offsets in the backlog, the topic from them live; every right record is in exactly one phase."""
    topic = f"right-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    early = [(i % 2, (f"k{i % 3}", (100 + i) * SECOND, i)) for i in range(8)]  # offsets 0..3 of each partition
    late = [(i % 2, (f"k{i % 3}", (130 + i) * SECOND, 100 + i)) for i in range(6)]  # offsets 4..6
    late.append((0, ("k0", 50 * SECOND, 999)))  # behind the right input's watermark: quarantined live
    positions = produce(kafka.bootstrap_servers, topic, early + late)
    by_position = dict(zip(positions, [row for _, row in early + late], strict=True))
    exported = [(pos, row) for pos, row in sorted(by_position.items()) if pos[1] < 5]  # overlaps the topic at 4
    right = delta_archive_handing_over(spark, kafka, topic, str(tmp_path / "archive"), exported, {0: 4, 1: 4})
    left_versions = {1: [(f"k{i % 3}", (101 + 3 * i) * SECOND, i) for i in range(6)]}
    left_path = str(tmp_path / "left")
    write_source(spark, left_path, left_versions)
    p = make_pipeline(left_path, str(tmp_path / "run"), delay_s=DELAY_S, operator=_co_group(right))
    handoff = BacklogRunner(spark, p).run()
    assert json.loads(handoff.right_source_position)["end"] == {"0": 4, "1": 4}
    left_versions[2] = [(f"k{i % 3}", (160 + i) * SECOND, 10 + i) for i in range(3)]  # closes the live windows
    append_version(spark, left_path, left_versions[2])
    live = LiveRunner.from_manifest(spark, p)
    live.start(available_now=True)

    right_versions = {1: [row for (_, offset), row in exported if offset < 4]}
    right_versions.update(
        chunk_versions(live.arrival_chunks("right"), {k: r for k, r in by_position.items() if k[1] >= 4})
    )
    assert sum(len(rows) for rows in right_versions.values()) == len(by_position)
    expected = _groups(
        reference.run_co_group(left_versions, right_versions, DELAY_S * SECOND, WINDOW_S * SECOND, match_summary, ts)
    )
    assert expected and _groups(spark.read.format("delta").load(p.sink.path).collect()) == expected
    assert _quarantine(spark, tmp_path / "run") == _expected_quarantine(left_versions, right_versions)
    assert any(r[-1].startswith("right input: late") for r in _quarantine(spark, tmp_path / "run"))
