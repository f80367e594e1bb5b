"""Where an input's head is now, without Spark: the observation an orchestrator records of a source.

* A Delta table: its version, row count and the maximum event time, from the log's file statistics
  (:mod:`phases._internal.storage.table_stats`).
* A Kafka topic: each partition's end offset, and the event time of each partition's newest record (decoded as
  the pipeline decodes values). The maximum over those is the topic's head event time: records inside a
  partition may be out of order, so it is a lower bound of the true maximum, and is labelled so.
* A hybrid source: its topic (the archive is finished history).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from phases._internal.definition import SOURCE_LABEL, HybridSource, KafkaSource
from phases._internal.errors import SourceError
from phases._internal.placement import Placement
from phases._internal.storage import table_stats


@dataclass(frozen=True)
class SourceHead:
    label: str  # "source" or "right source"
    location: str
    position: str  # what a data version is made of: "v<version>" or "partition:offset,..."
    version: int | None  # Delta
    end_offsets: dict[int, int] | None  # Kafka
    rows: int | None  # records the input holds now (Delta: file statistics; Kafka: end - earliest offsets)
    max_event_time: datetime | None
    basis: str  # how max_event_time was found
    error: str | None = None  # why the head could not be read (then only ``location`` is meaningful)


def delta_head(label: str, path: str, event_time: str) -> SourceHead:
    try:
        stats = table_stats.stats(path, max_of=(event_time,))
    except SourceError as exc:
        return SourceHead(label, path, "", None, None, None, None, "", str(exc))
    if stats is None:
        return SourceHead(label, path, "", None, None, None, None, "", "no Delta table (moved or deleted?)")
    top = stats.max_values.get(event_time)
    return SourceHead(
        label,
        path,
        f"v{stats.version}",
        stats.version,
        None,
        stats.rows,
        _as_utc(top) if isinstance(top, datetime) else None,
        "Delta file statistics",
    )


def kafka_head(label: str, spec: KafkaSource, where: Placement, event_time: str, timeout: float = 10.0) -> SourceHead:
    from confluent_kafka import Consumer, TopicPartition

    from phases._internal.sources.kafka import client_conf, partition_watermarks

    conf = client_conf(spec, where.source_brokers(spec))
    try:
        marks = partition_watermarks(conf, spec.topic, timeout=timeout)
    except SourceError as exc:
        return SourceHead(label, where.location(spec), "", None, None, None, None, "", str(exc))
    end = {p: hi for p, (_, hi) in marks.items()}
    newest: list[datetime] = []
    wanted = [TopicPartition(spec.topic, p, hi - 1) for p, (lo, hi) in marks.items() if hi > lo]
    if wanted:
        consumer = Consumer({**conf, "group.id": "phases-probe", "enable.auto.commit": False})
        try:
            consumer.assign(wanted)
            remaining = {tp.partition for tp in wanted}
            deadline = datetime.now(UTC).timestamp() + timeout
            while remaining and datetime.now(UTC).timestamp() < deadline:
                msg = consumer.poll(0.5)
                if msg is None or msg.error() is not None or msg.partition() not in remaining:
                    continue
                remaining.discard(msg.partition())  # pyright: ignore[reportArgumentType]
                at = _event_time_of(msg.value(), event_time)
                if at is not None:
                    newest.append(at)
        finally:
            consumer.close()
    return SourceHead(
        label,
        where.location(spec),
        ",".join(f"{p}:{o}" for p, o in sorted(end.items())),
        None,
        end,
        sum(hi - lo for lo, hi in marks.values()),
        max(newest) if newest else None,
        "newest record of each partition",
    )


def _event_time_of(value: bytes | None, field: str) -> datetime | None:
    """The event time of a JSON value, as Spark's ``from_json`` would read it (ISO text or epoch seconds);
    None for a value the pipeline would quarantine."""
    if value is None:
        return None
    try:
        raw = json.loads(value).get(field)
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return datetime.fromtimestamp(raw, tz=UTC)
        if isinstance(raw, str):
            return _as_utc(datetime.fromisoformat(raw))
    except (ValueError, AttributeError, TypeError, OverflowError):
        return None
    return None


def _as_utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def source_heads(where: Placement) -> list[SourceHead]:
    """The head of every input of the placed pipeline (the source, and a two-input operator's right source)."""
    pipeline = where.definition
    heads = []
    for inp in pipeline.inputs:
        spec = inp.spec.live if isinstance(inp.spec, HybridSource) else inp.spec
        label = "source" if inp.label == SOURCE_LABEL else inp.name
        if isinstance(spec, KafkaSource):
            heads.append(kafka_head(label, spec, where, pipeline.event_time))
        else:
            heads.append(delta_head(label, where.source_path(spec), pipeline.event_time))
    return heads
