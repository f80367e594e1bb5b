"""A Kafka topic as the pipeline's source, on a real broker: arrival chunks in the role of versions.

The promise for Kafka: backlog (fixed-size chunks up to the end offsets captured at its start) + live (one chunk
per micro-batch) == one streaming job over the same arrival chunks == the plain reference over those chunks,
results and quarantine alike, for any cut-off."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSource
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import assert_results_equal, produce, sink_rows, us_of

DELAY_S = 15
SECOND = 1_000_000
PARTITIONS = 3
CHUNK = 2  # backlog_chunk_records: a round of 2 records per partition is one backlog chunk
VALUE_SCHEMA = "key string, ts timestamp, value bigint"

FAR = 11
_record = st.tuples(
    st.one_of(st.sampled_from(["a", "b", "c", "d"]), st.none()),
    st.integers(min_value=-40, max_value=FAR),
    st.one_of(st.integers(min_value=-50, max_value=50), st.none()),
)
# A round: CHUNK records for each partition (record j goes to partition j % PARTITIONS).
KAFKA_ROUNDS = st.lists(
    st.lists(_record, min_size=CHUNK * PARTITIONS, max_size=CHUNK * PARTITIONS), min_size=1, max_size=4
)


def materialize_rounds(raw: list[list[tuple]]) -> list[list[tuple[int, reference.Row]]]:
    """Round i: (partition, (key, event time around i*20 s, value)) pairs."""
    rounds = []
    for i, rows in enumerate(raw):
        clock = (i + 1) * 20 * SECOND
        rounds.append(
            [
                (
                    j % PARTITIONS,
                    (
                        None if key is None and j % 2 else key or "a",
                        (reference.FAR_FUTURE_US if jitter == FAR else 0) + clock + min(jitter, FAR - 1) * SECOND,
                        value,
                    ),
                )
                for j, (key, jitter, value) in enumerate(rows)
            ]
        )
    return rounds


def kafka_pipeline(kafka, topic: str, root: str, *, options: dict | None = None, **overrides):
    source = KafkaSource(
        topic=topic,
        bootstrap_servers=kafka.bootstrap_servers,
        value_schema=VALUE_SCHEMA,
        backlog_chunk_records=CHUNK,
        options=options or {},
    )
    return make_pipeline(source, root, delay_s=DELAY_S, **overrides)


def chunk_versions(chunks: dict, produced: dict[tuple[int, int], reference.Row]) -> dict[int, list[reference.Row]]:
    """The produced records grouped by the arrival chunk (partition, offset) fell into: the reference's versions."""
    versions: dict[int, list[reference.Row]] = {c: [] for c in chunks}
    for (partition, offset), row in produced.items():
        owners = [c for c, ranges in chunks.items() if _within(ranges.get(partition), offset)]
        assert len(owners) == 1, f"record at {partition}@{offset} is in chunks {owners}: {chunks}"
        versions[owners[0]].append(row)
    return versions


def _within(span: tuple[int, int] | None, offset: int) -> bool:
    return span is not None and span[0] <= offset < span[1]


def kafka_quarantine(spark, root: str) -> list[tuple[int, reference.Row, str]]:
    from phases._internal.storage import tables

    if not tables.exists(spark, f"{root}/quarantine"):
        return []
    rows = []
    for r in spark.read.format("delta").load(f"{root}/quarantine").collect():
        rec = json.loads(r["record"])
        rows.append((r["source_version"], (rec.get("key"), us_of(rec.get("ts")), rec.get("value")), r["reason"]))
    return sorted(rows, key=repr)


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=KAFKA_ROUNDS, cut=st.integers(min_value=0, max_value=4))
def test_two_phase_equals_single_streaming_job_over_the_same_arrival_chunks(spark, kafka, tmp_path, raw, cut):
    topic = f"events-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    root = tmp_path / uuid.uuid4().hex
    rounds = materialize_rounds(raw)
    cutoff = min(cut, len(rounds))
    produced: dict[tuple[int, int], reference.Row] = {}

    def produce_round(i: int) -> None:
        positions = produce(kafka.bootstrap_servers, topic, rounds[i])
        produced.update({pos: row for pos, (_, row) in zip(positions, rounds[i], strict=True)})

    single = kafka_pipeline(kafka, topic, str(root / "single"))
    single_live = LiveRunner.streaming_only(spark, single)
    two_phase = kafka_pipeline(kafka, topic, str(root / "two_phase"))
    for i in range(cutoff):
        produce_round(i)
        single_live.start(available_now=True)  # one streaming job: a micro-batch per round
    handoff = BacklogRunner(spark, two_phase).run()
    live = LiveRunner.from_manifest(spark, two_phase)
    live.start(available_now=True)
    for i in range(cutoff, len(rounds)):
        produce_round(i)
        single_live.start(available_now=True)
        live = LiveRunner.from_manifest(spark, two_phase)  # a restart from its checkpoint each round
        live.start(available_now=True)

    two_chunks = live.arrival_chunks()
    single_chunks = single_live.arrival_chunks()
    assert handoff.source_version == max(cutoff - 1, 0)
    # Both runs cut the records into the same chunks (a round each), numbered alike.
    strip = {c: r for c, r in two_chunks.items() if any(lo < hi for lo, hi in r.values())}
    assert list(strip.values()) == [r for r in single_chunks.values() if any(lo < hi for lo, hi in r.values())]

    expected, expected_q = reference.run(chunk_versions(two_chunks, produced), DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, two_phase.sink.path), expected)
    assert_results_equal(sink_rows(spark, single.sink.path), expected)
    assert kafka_quarantine(spark, str(root / "two_phase")) == sorted(expected_q, key=repr)
    _, single_q = reference.run(chunk_versions(single_chunks, produced), DELAY_S * SECOND)
    assert kafka_quarantine(spark, str(root / "single")) == sorted(single_q, key=repr)


def test_kafka_definition_refuses_backlog_checkpoints():
    from phases._internal.errors import DefinitionError

    with pytest.raises(DefinitionError, match="which a kafka source does not support"):
        make_pipeline(
            KafkaSource(topic="t", bootstrap_servers="127.0.0.1:9", value_schema=VALUE_SCHEMA),
            "/tmp/x",
            checkpoint_interval_during_backlog=timedelta(seconds=10),
        )


def test_undecodable_and_late_records_are_quarantined_with_their_topic_partition_and_offset(spark, kafka, tmp_path):
    topic = f"events-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    s = SECOND
    backlog = [  # chunk 0: the first two offsets of each partition; chunk 1: the third
        (0, ("a", 20 * s, 1)),
        (0, ("a", 25 * s, 2)),
        (0, ("a", 60 * s, 3)),
        (1, b"not json"),
        (1, ("b", 22 * s, 4)),
        (1, ("b", 5 * s, 5)),  # chunk 0's greatest event time is 25 s: W(1) = 10 s, 5 s is late
        (2, ("c", 21 * s, 6)),
        (2, None),  # a tombstone
        (2, ("c", 30 * s, 7)),
    ]
    live = [
        (0, b'{"key": "a", "ts": "2026-01-01T00:01:10Z", "value": "seven"}'),  # wrong type
        (1, ("b", 30 * s, 5)),  # W = 60 - 15 = 45 s: late
        (2, ("c", 70 * s, 6)),
        (0, b"[1, 2]"),
        (1, ("d", reference.FAR_FUTURE_US, 7)),  # far beyond its Kafka timestamp: max_future
    ]
    produced, undecodable = {}, {}
    for records in (backlog,):
        for pos, (_, rec) in zip(produce(kafka.bootstrap_servers, topic, records), records, strict=True):
            (produced if isinstance(rec, tuple) else undecodable)[pos] = rec
    p = kafka_pipeline(kafka, topic, str(tmp_path))
    handoff = BacklogRunner(spark, p).run()
    assert (handoff.late_rows, handoff.invalid_rows) == (1, 2)
    for pos, (_, rec) in zip(produce(kafka.bootstrap_servers, topic, live), live, strict=True):
        (produced if isinstance(rec, tuple) else undecodable)[pos] = rec
    runner = LiveRunner.from_manifest(spark, p)
    runner.start(available_now=True)

    chunks = runner.arrival_chunks()
    assert len(chunks) == 3  # two backlog chunks of 2 offsets per partition, one live micro-batch
    expected, expected_q = reference.run(chunk_versions(chunks, produced), DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    q = spark.read.format("delta").load(f"{tmp_path}/quarantine")
    bad = {
        (r["kafka_partition"], r["kafka_offset"]): (r["record"], r["reason"], r["kafka_topic"])
        for r in q.filter(q.reason.startswith("undecodable")).collect()
    }
    assert set(bad) == set(undecodable)
    for pos, raw in undecodable.items():
        record, reason, where = bad[pos]
        assert where == topic
        if raw is None:
            assert reason == "undecodable: null value (a tombstone)" and record == ""
        else:
            assert record == raw.decode(), (pos, record)
    assert bad[next(pos for pos, raw in undecodable.items() if raw == b"[1, 2]")][1].startswith("undecodable: not")
    decodable = [
        (r["source_version"], r["kafka_partition"], r["reason"])
        for r in q.filter(~q.reason.startswith("undecodable")).collect()
    ]
    assert sorted((v, reason) for v, _, reason in decodable) == sorted((v, reason) for v, _, reason in expected_q)
    assert all(partition is not None for _, partition, _ in decodable)


ARCHIVE_SCHEMA = "key string, ts timestamp, value bigint, kafka_partition int, kafka_offset bigint"


def delta_archive_handing_over(
    spark,
    kafka,
    topic: str,
    archive: str,
    exported: list[tuple[tuple[int, int], reference.Row]],
    offsets: dict[int, int],
):
    """A Delta archive of ``topic`` at ``archive`` holding ``exported`` ((partition, offset), (key, event time,
    value)) pairs in one version, each with its partition and offset, handing over to the topic at ``offsets``."""
    from phases._internal.definition import HybridSource, KafkaHandoff
    from phases._internal.sources import feed as sources
    from tests.helpers import ts

    sources.create_source(spark, archive, ARCHIVE_SCHEMA)
    sources.append(spark, archive, [(k, ts(t), v, p, o) for (p, o), (k, t, v) in exported])
    return HybridSource(
        backlog={"path": archive},
        live=KafkaSource(topic=topic, bootstrap_servers=kafka.bootstrap_servers, value_schema=VALUE_SCHEMA),
        handoff=KafkaHandoff(offsets=offsets),
        archive_partition_column="kafka_partition",
        archive_offset_column="kafka_offset",
    )


# Both archive kinds and both handoffs, in two runs (the suite's time is bounded).
@pytest.mark.parametrize(("archive_kind", "by"), [("delta", "timestamp"), ("json", "offsets")])
def test_hybrid_archive_then_topic_counts_every_record_once_when_they_overlap(spark, kafka, tmp_path, archive_kind, by):
    """FLIP-327's first example: an archive (a Delta table, or JSON files), then the topic. The archive holds
    the first records of each partition and, past the handoff, some the topic also holds (an export that ran
    on); the handoff is explicit offsets or a timestamp resolved to offsets. No record is in both phases and
    none in neither."""
    import time as clock
    from datetime import UTC, datetime

    from phases._internal.definition import HybridSource, KafkaHandoff
    from phases._internal.sources import feed as sources
    from tests.helpers import ts

    topic = f"hybrid-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    early = [(i % 2, (f"k{i % 3}", (100 + i) * SECOND, i)) for i in range(8)]  # offsets 0..3 of each partition
    late = [(i % 2, (f"k{i % 3}", (200 + i) * SECOND, 100 + i)) for i in range(6)]  # offsets 4..6
    late.append((0, ("k0", 50 * SECOND, 999)))  # behind the archive's watermark (107 - 15 s): quarantined live
    positions = produce(kafka.bootstrap_servers, topic, early)
    clock.sleep(1.5)
    cut_at = datetime.now(UTC)
    clock.sleep(1.5)
    positions += produce(kafka.bootstrap_servers, topic, late)
    by_position = dict(zip(positions, [row for _, row in early + late], strict=True))

    archive = str(tmp_path / "archive")
    exported = sorted(by_position.items())  # the archive: offsets 0..3 and, overlapping the topic, 4..5
    exported = [(pos, row) for pos, row in exported if pos[1] < 6]
    halves = (exported[: len(exported) // 2], exported[len(exported) // 2 :])  # two archive versions (files)
    if archive_kind == "delta":
        sources.create_source(spark, archive, ARCHIVE_SCHEMA)
    for i, half in enumerate(halves):
        rows = [(k, ts(t), v, p, o) for (p, o), (k, t, v) in half]
        if archive_kind == "delta":
            sources.append(spark, archive, rows)
        else:
            lines = [
                json.dumps({"key": k, "ts": t.isoformat(), "value": v, "kafka_partition": p, "kafka_offset": o})
                for k, t, v, p, o in rows
            ]
            (tmp_path / "archive").mkdir(exist_ok=True)
            (tmp_path / "archive" / f"part-{i:05d}.json").write_text("\n".join(lines) + "\n")

    handoff = KafkaHandoff(offsets={0: 4, 1: 4}) if by == "offsets" else KafkaHandoff(timestamp=cut_at)
    source = HybridSource(
        backlog={"path": archive} if archive_kind == "delta" else {"kind": "files", "path": archive, "format": "json"},
        live=KafkaSource(topic=topic, bootstrap_servers=kafka.bootstrap_servers, value_schema=VALUE_SCHEMA),
        handoff=handoff,
        archive_partition_column="kafka_partition",
        archive_offset_column="kafka_offset",
    )
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    manifest = BacklogRunner(spark, p).run()
    first = 1 if archive_kind == "delta" else 0  # a Delta archive's version 0 is its creation
    assert manifest.source_version == first + 1
    assert json.loads(manifest.source_position)["end"] == {"0": 4, "1": 4}
    live = LiveRunner.from_manifest(spark, p)
    live.start(available_now=True)

    # The reference: archive versions 1 and 2 cut at the handoff offsets, then the live chunks the run recorded.
    versions = {first + i: [row for (part, offset), row in half if offset < 4] for i, half in enumerate(halves)}
    live_rows = {pos: row for pos, row in by_position.items() if pos[1] >= 4}
    versions.update(chunk_versions(live.arrival_chunks(), live_rows))
    assert sum(len(rows) for rows in versions.values()) == len(by_position)  # every record in exactly one phase
    expected, expected_q = reference.run(versions, DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert kafka_quarantine(spark, str(tmp_path / "run")) == sorted(expected_q, key=repr)
    assert expected_q, "the live record behind the watermark should be quarantined"
