"""What consumers of a result topic see, without a producer (no writer is fenced): every record a
``read_committed`` consumer reads (:func:`read_committed`), an upsert topic folded to its newest value per key
(:func:`fold_upsert`), and a topic's figures with its newest committed marker (:func:`topic_figures`). The writes:
:mod:`phases._internal.topics.transactions`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from phases._internal.errors import SinkError
from phases._internal.topics.admin import client_settings
from phases._internal.topics.transactions import Marker, TopicRecord, marker_group, marker_reader

# The header of a redeploy's boundary records (:mod:`phases._internal.topics.swap_publish`).
HEADER_BOUNDARY = "phases.boundary"


def read_committed(
    servers: str, topic: str, *, timeout_s: float = 60.0, client_config: dict[str, str] | None = None
) -> Iterator[TopicRecord]:
    """Every record a ``read_committed`` consumer sees in ``topic`` as of the call, in partition then offset order:
    each partition from its start to its last stable offset (the broker's answer to a read_committed consumer, which
    stops before the first transaction still open: a write in flight, or one a crashed writer left until the writer
    that takes over aborts it). A SinkError when that end is not reached within ``timeout_s``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {
            **client_settings(servers, client_config),
            "group.id": f"phases.read.{topic}.{time.time_ns()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        topics = consumer.list_topics(topic, timeout=timeout_s).topics
        if topic not in topics or topics[topic].error is not None:
            raise SinkError(f"topic {topic!r} does not exist on {servers}")
        partitions = sorted(topics[topic].partitions)
        # A read_committed consumer's query of the end offsets answers the last stable offsets.
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in partitions}
        pending = {p for p in partitions if ends[p] > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        by_partition: dict[int, list[TopicRecord]] = {p: [] for p in partitions}
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                behind = {p: ends[p] for p in sorted(pending)}
                raise SinkError(
                    f"topic {topic!r}: the read stopped short of the last stable offsets {behind} of these partitions "
                    f"for {timeout_s:g} s; is the broker at {servers} up?"
                )
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    raise SinkError(f"topic {topic!r}: {msg.error()}")
                p = msg.partition()
                if msg.offset() < ends[p]:
                    by_partition[p].append(  # pyright: ignore[reportArgumentType]
                        TopicRecord(p, msg.offset(), msg.key(), msg.value(), dict(msg.headers() or []))  # pyright: ignore[reportArgumentType]
                    )
            for p in list(pending):
                [position] = consumer.position([TopicPartition(topic, p)])
                if position.offset >= ends[p]:
                    pending.discard(p)
        for p in partitions:
            yield from by_partition[p]
    except KafkaException as exc:
        raise SinkError(f"topic {topic!r} could not be read ({exc.args[0]})") from exc
    finally:
        consumer.close()


def after_last_boundary(records: Iterable[TopicRecord]) -> list[TopicRecord]:
    """The records of each partition after its last boundary record (a redeploy's swap: what follows is the serving
    definition's whole result, then its changes), in partition then offset order; all of them where none is."""
    kept: dict[int, list[TopicRecord]] = {}
    for record in records:
        if HEADER_BOUNDARY in record.headers:
            kept[record.partition] = []
        else:
            kept.setdefault(record.partition, []).append(record)
    return [r for p in sorted(kept) for r in kept[p]]


def fold_upsert(records: Iterable[TopicRecord]) -> dict[bytes, bytes]:
    """The current value of each key of an upsert topic: its newest record's value; a tombstone removes the key; a
    redeploy's boundary records are not results (its swap sent a tombstone for each key the new definition lacks)."""
    current: dict[bytes, bytes] = {}
    for record in records:
        if HEADER_BOUNDARY in record.headers:
            continue
        if record.key is None:
            raise SinkError(f"partition {record.partition} offset {record.offset}: a record without a key")
        if record.value is None:
            current.pop(record.key, None)
        else:
            current[record.key] = record.value
    return current


@dataclass(frozen=True)
class TopicFigures:
    """A result topic as a read_committed consumer sees it: its partitions' last stable offsets (the end a
    read_committed consumer reads to; offsets count Kafka's transaction markers too, so they are positions, not a
    record count) and the newest committed write's marker (None: nothing written yet)."""

    topic: str
    end_offsets: dict[int, int]
    marker: Marker | None


def topic_figures(
    servers: str,
    topic: str,
    pipeline: str,
    *,
    client_config: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> TopicFigures:
    """The figures of a pipeline's result topic, read without a producer (so no writer is fenced and no
    open transaction aborted: a write in flight is simply not in them). A SinkError names the topic when it cannot
    be read."""
    from confluent_kafka import KafkaException, TopicPartition

    where = f"topic {topic!r}"
    consumer = marker_reader(client_settings(servers, client_config), marker_group(pipeline))
    try:
        found = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise SinkError(f"{where} does not exist on {servers}")
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
            for p in sorted(found.partitions)
        }
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=timeout_s)
        if tp.error is not None:
            raise SinkError(f"{where}: its committed marker could not be read ({tp.error})")
        marker = None if tp.offset < 0 else Marker.parse(tp.offset, tp.metadata, where)
        return TopicFigures(topic, ends, marker)
    except KafkaException as exc:
        raise SinkError(f"{where} could not be read ({exc.args[0]})") from exc
    finally:
        consumer.close()
