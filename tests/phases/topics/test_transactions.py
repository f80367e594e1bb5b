"""Exactly-once writes into a Kafka topic (:mod:`phases._internal.topics.transactions`) against the real broker: a
committed write is read once by a read_committed consumer and names itself by its marker; a writer killed with
SIGKILL while its transaction holds records leaves nothing of it readable, and the writer that takes over aborts that
transaction and resumes from the marker; an older writer of the same id is fenced; a replayed write is skipped."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest

from phases._internal.errors import SinkError
from phases._internal.topics.reading import fold_upsert, read_committed
from phases._internal.topics.transactions import HANDOFF_BATCH, Marker, Record, TopicWriter


def _topic(kafka, partitions: int = 3) -> str:
    name = f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, partitions)
    return name


def _records(batch: int, keys: range) -> list[Record]:
    return [Record(f"k{k}".encode(), f"{batch}:{k}".encode(), (("phases.batch", str(batch).encode()),)) for k in keys]


def test_a_committed_write_is_read_once_and_its_marker_names_it(kafka):
    topic = _topic(kafka)
    writer = TopicWriter(kafka.bootstrap_servers, topic, "events")
    try:
        assert writer.check_topic() == 3
        assert writer.committed() is None
        assert writer.write(_records(HANDOFF_BATCH, range(50)), Marker(HANDOFF_BATCH, "h1")) == 50
        assert writer.committed() == Marker(HANDOFF_BATCH, "h1")
        assert writer.write(_records(0, range(10)), Marker(0, "h1")) == 10
        assert writer.committed() == Marker(0, "h1")
    finally:
        writer.close()
    read = list(read_committed(kafka.bootstrap_servers, topic))
    assert len(read) == 60 and len({(r.partition, r.offset) for r in read}) == 60
    assert fold_upsert(read) == {f"k{k}".encode(): (f"0:{k}" if k < 10 else f"-1:{k}").encode() for k in range(50)}
    # One key's records stay in one partition, in the order written.
    by_key = {}
    for r in read:
        by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(partitions) == 1 for partitions in by_key.values())
    assert {r.headers["phases.batch"] for r in read} == {b"-1", b"0"}


def test_a_replayed_write_is_skipped_and_a_tombstone_removes_its_key(kafka):
    topic = _topic(kafka, partitions=1)
    writer = TopicWriter(kafka.bootstrap_servers, topic, "events")
    try:
        assert writer.write_once(_records(0, range(3)), Marker(0, "h1")) == 3
        assert writer.write_once(_records(0, range(3)), Marker(0, "h1")) is None  # the same batch again
        assert writer.write_once([Record(b"k1", None)], Marker(1, "h1")) == 1
        with pytest.raises(SinkError, match="holds batch 1 of handoff h1"):
            writer.write_once(_records(1, range(3)), Marker(1, "h2"))
    finally:
        writer.close()
    read = list(read_committed(kafka.bootstrap_servers, topic))
    assert len(read) == 4
    assert fold_upsert(read) == {b"k0": b"0:0", b"k2": b"0:2"}


_KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from confluent_kafka import Producer
    from phases._internal.topics import transactions as t

    servers, topic = sys.argv[1], sys.argv[2]
    writer = t.TopicWriter(servers, topic, "events")
    producer = writer._start()
    producer.begin_transaction()
    for k in range(100):
        producer.produce(topic, key=f"k{k}".encode(), value=b"uncommitted")
    producer.flush(30)  # the records are on the broker, inside the open transaction
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_writer_killed_while_its_transaction_holds_records_leaves_nothing_readable_and_the_next_resumes(kafka):
    topic = _topic(kafka)
    first = TopicWriter(kafka.bootstrap_servers, topic, "events")
    first.write(_records(HANDOFF_BATCH, range(20)), Marker(HANDOFF_BATCH, "h1"))
    first.close()
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, kafka.bootstrap_servers, topic],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9 and "holding" in child.stdout, child.stderr[-2000:]
    # While the killed writer's transaction is open, a read_committed reader sees what was committed before it.
    before = list(read_committed(kafka.bootstrap_servers, topic))
    assert len(before) == 20 and all(r.value != b"uncommitted" for r in before)
    # The writer that takes over fences the dead one (its transaction is aborted) and reads the last marker.
    takeover = TopicWriter(kafka.bootstrap_servers, topic, "events")
    try:
        assert takeover.committed() == Marker(HANDOFF_BATCH, "h1")
        assert takeover.write_once(_records(0, range(5)), Marker(0, "h1")) == 5
    finally:
        takeover.close()
    read = list(read_committed(kafka.bootstrap_servers, topic))
    assert len(read) == 25 and all(r.value != b"uncommitted" for r in read)


def test_an_older_writer_of_the_same_generation_is_fenced_and_says_so(kafka):
    topic = _topic(kafka)
    zombie = TopicWriter(kafka.bootstrap_servers, topic, "events")
    zombie.write(_records(HANDOFF_BATCH, range(5)), Marker(HANDOFF_BATCH, "h1"))
    newer = TopicWriter(kafka.bootstrap_servers, topic, "events")
    try:
        assert newer.committed() == Marker(HANDOFF_BATCH, "h1")  # starting it fenced the zombie
        with pytest.raises(SinkError, match="a newer writer of this pipeline started"):
            zombie.write(_records(0, range(5)), Marker(0, "h1"))
        assert newer.write_once(_records(0, range(5)), Marker(0, "h1")) == 5
    finally:
        newer.close()
        zombie.close()
    assert len(list(read_committed(kafka.bootstrap_servers, topic))) == 10
    # Another pipeline is another producer id and another marker: it does not fence this one.
    other = TopicWriter(kafka.bootstrap_servers, topic, "other")
    try:
        assert other.committed() is None
    finally:
        other.close()


def test_a_missing_topic_and_a_foreign_marker_are_named(kafka):
    writer = TopicWriter(kafka.bootstrap_servers, f"absent-{uuid.uuid4().hex[:8]}", "events", timeout_s=10)
    try:
        with pytest.raises(SinkError, match="does not exist"):
            writer.check_topic()
    finally:
        writer.close()
    with pytest.raises(SinkError, match="not one this engine writes"):
        Marker.parse(7, "not json", "topic 't'")
    with pytest.raises(SinkError, match="sits at offset 9"):
        Marker.parse(9, '{"batch": 3, "handoff": "h"}', "topic 't'")
    assert Marker.parse(5, Marker(3, "h").metadata, "topic 't'") == Marker(3, "h")


def test_a_write_is_read_committed_as_soon_as_it_returns(kafka):
    """The broker answers a commit before its transaction markers reach the partitions; a write returns only once a
    read_committed consumer sees all of it (a reader right after a handoff or a batch misses nothing)."""
    from confluent_kafka import Consumer, TopicPartition

    partitions = 6
    topic = _topic(kafka, partitions)
    writer = TopicWriter(kafka.bootstrap_servers, topic, "events")
    readers = {
        level: Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"{level}-{topic}",
                         "isolation.level": level})
        for level in ("read_committed", "read_uncommitted")
    }  # fmt: skip

    def ends(level: str) -> list[int]:
        return [
            readers[level].get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)
        ]

    try:
        for batch in range(60):
            writer.write(_records(batch, range(12)), Marker(batch, "h1"))
            # the last stable offsets (read_committed) reach the ends (records and commit markers): nothing pending
            assert ends("read_committed") == ends("read_uncommitted"), f"batch {batch}"
    finally:
        writer.close()
        for reader in readers.values():
            reader.close()


def test_a_write_held_behind_another_producers_open_transaction_says_so_and_its_replay_is_skipped(kafka):
    """Another transactional producer's open transaction keeps the partition's last stable offset before this
    write: the write commits, says it is not yet seen and why, a replay of it is skipped, and once that transaction
    ends a read_committed consumer reads the write once."""
    from confluent_kafka import Producer

    topic = _topic(kafka, partitions=1)
    other = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"other-{topic}"})
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(topic, key=b"x", value=b"open")
    other.flush(10)
    # The write waits timeout_s for the open transaction to end; under load a first query of the partition leaders
    # alone has taken 3 s, so it is given 6 and the writer's metadata is read before.
    writer = TopicWriter(kafka.bootstrap_servers, topic, "events", timeout_s=6)
    writer.check_topic()
    try:
        with pytest.raises(SinkError, match=r"batch 0 committed, but read_committed consumers did not see it.*another"):
            writer.write(_records(0, range(5)), Marker(0, "h1"))
        assert writer.committed() == Marker(0, "h1")
        assert writer.write_once(_records(0, range(5)), Marker(0, "h1")) is None
        other.abort_transaction(10)
    finally:
        writer.close()
    read = list(read_committed(kafka.bootstrap_servers, topic))
    assert sorted(r.value for r in read) == [f"0:{k}".encode() for k in range(5)]


def test_a_record_the_broker_refuses_aborts_the_whole_write_and_the_next_write_goes_out(kafka):
    """Delivery reports are not read record by record: a record the broker refuses (larger than the topic's
    max.message.bytes) fails the transaction's commit, the write aborts whole, and the writer goes on."""
    topic = f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2, **{"max.message.bytes": "2000"})
    writer = TopicWriter(kafka.bootstrap_servers, topic, "events")
    try:
        big = Record(b"k-big", b"x" * 5000, (("phases.batch", b"0"),))
        with pytest.raises(SinkError, match="the write of batch 0 was aborted"):
            writer.write([*_records(0, range(20)), big], Marker(0, "h1"))
        assert writer.committed() is None
        assert writer.write(_records(1, range(20)), Marker(1, "h1")) == 20
        assert writer.committed() == Marker(1, "h1")
    finally:
        writer.close()
    read = list(read_committed(kafka.bootstrap_servers, topic))
    assert sorted(r.value for r in read) == sorted(f"1:{k}".encode() for k in range(20))
