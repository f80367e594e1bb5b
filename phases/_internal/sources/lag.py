"""How far each input of a pipeline is behind its handoff, without a Spark session (the switch sensor's probe).

FLIP-309: a job is *processing backlog* while **any** of its sources is. An input is behind by the versions its
Delta table committed after the handoff's version (read from its log with delta-rs), or by the records its
Kafka topic holds after the handoff's end offsets (the broker's end offsets, through confluent-kafka). Together
with each input's watermark this gives the switch rule (``phases_dagster.switch.decide``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from phases._internal.definition import DeltaSource, HybridSource, KafkaSource
from phases._internal.errors import SourceError
from phases._internal.placement import Placement
from phases._internal.storage import table_stats


@dataclass(frozen=True)
class InputLag:
    """One input's distance from its handoff position."""

    label: str  # "source" or "right source"
    location: str
    behind: int | None  # versions (Delta) or records (Kafka) after the handoff; None: could not be read
    unit: str  # "versions" or "records"
    watermark_us: int | None  # the input's final backlog watermark (None: no valid record yet)
    error: str | None = None  # why ``behind`` is unknown

    def describe(self) -> str:
        if self.behind is None:
            return f"{self.label} {self.location}: {self.error}"
        return f"{self.label} {self.location}: {self.behind} {self.unit} after the handoff"


def _head_version(path: str) -> tuple[int | None, str | None]:
    """(the Delta table's head version, None) or (None, why it is unknown)."""
    try:
        head = table_stats.head_version(path)
    except SourceError as exc:
        return None, str(exc)
    return (head, None) if head is not None else (None, "no Delta log (moved or deleted?)")


def delta_lag(label: str, path: str, handoff_version: int, watermark_us: int | None) -> InputLag:
    head, error = _head_version(path)
    if head is None:
        return InputLag(label, path, None, "versions", watermark_us, error)
    return InputLag(label, path, max(0, head - handoff_version), "versions", watermark_us)


def kafka_lag(
    label: str, spec: KafkaSource, where: Placement, position: str | None, watermark_us: int | None
) -> InputLag:
    """Records after the handoff's end offsets, summed over the partitions (a partition the topic gained since
    counts from its earliest offset)."""
    from phases._internal.sources.kafka import ChunkPlan, client_conf, partition_watermarks

    try:
        marks = partition_watermarks(client_conf(spec, where.source_brokers(spec)), spec.topic, timeout=10)
    except SourceError as exc:
        return InputLag(label, where.location(spec), None, "records", watermark_us, str(exc))
    end = ChunkPlan.from_json(position).end if position else {}
    behind = sum(max(0, hi - end.get(p, lo)) for p, (lo, hi) in marks.items())
    return InputLag(label, where.location(spec), behind, "records", watermark_us)


def input_lag(
    label: str,
    spec: DeltaSource | KafkaSource | HybridSource,
    where: Placement,
    *,
    version: int,
    position: str | None,
    watermark_us: int | None,
) -> InputLag:
    """One input's lag behind a position: its Delta version, or a Kafka chunk plan's end offsets (``position``; a
    hybrid source: its topic, in backlog while the topic has records after the handoff)."""
    if isinstance(spec, KafkaSource):
        return kafka_lag(label, spec, where, position, watermark_us)
    if isinstance(spec, HybridSource):
        return kafka_lag(label, spec.live, where, position, watermark_us)
    return delta_lag(label, where.source_path(spec), version, watermark_us)


def input_lags(
    where: Placement,
    *,
    source_version: int,
    source_position: str | None,
    watermark_us: int | None,
    right_source_version: int | None = None,
    right_watermark_us: int | None = None,
    right_source_position: str | None = None,
) -> list[InputLag]:
    """The lag of every input of the placed pipeline behind the handoff described by the arguments."""
    pipeline = where.definition
    lags = [
        input_lag(
            "source",
            pipeline.source,
            where,
            version=source_version,
            position=source_position,
            watermark_us=watermark_us,
        )
    ]
    if pipeline.inputs.two:
        right = pipeline.inputs.right
        version = -1 if right_source_version is None else right_source_version
        lags.append(
            input_lag(
                right.name,
                right.spec,
                where,
                version=version,
                position=right_source_position,
                watermark_us=right_watermark_us,
            )
        )
    return lags


@dataclass(frozen=True)
class Unapplied:
    """What the source holds that the live phase has not applied yet (the sink's freshness)."""

    location: str
    behind: int | None  # versions (Delta) or records (Kafka); None: could not be read
    unit: str
    oldest_at: datetime | None  # commit time (Delta) or record timestamp (Kafka) of the oldest one not applied
    error: str | None = None

    @property
    def amount(self) -> str:
        """``behind`` with its unit, as a person writes it ("1 version", "3 records")."""
        return f"{self.behind} {self.unit[:-1] if self.behind == 1 and self.unit.endswith('s') else self.unit}"

    @property
    def verb(self) -> str:
        return "waits" if self.behind == 1 else "wait"


def unapplied(where: Placement, *, applied_version: int, applied_offsets: dict[int, int] | None) -> Unapplied:
    """How much of the placed pipeline's source is after the applied position, and since when it waits."""
    return input_unapplied(
        where.definition.source, where, applied_version=applied_version, applied_offsets=applied_offsets
    )


def input_unapplied(
    spec: DeltaSource | KafkaSource | HybridSource,
    where: Placement,
    *,
    applied_version: int,
    applied_offsets: dict[int, int] | None,
) -> Unapplied:
    """How much of one input is after the applied position (its version, or a Kafka input's end offsets), and since
    when it waits."""
    source = spec.live if isinstance(spec, HybridSource) else spec
    if isinstance(source, KafkaSource):
        return _kafka_unapplied(source, where, applied_offsets or {})
    path = where.source_path(source)
    head, error = _head_version(path)
    if head is None:
        return Unapplied(path, None, "versions", None, error)
    if head <= applied_version:
        return Unapplied(path, 0, "versions", None)
    first = applied_version + 1
    return Unapplied(path, head - applied_version, "versions", table_stats.commit_times(path, first).get(first))


def _kafka_unapplied(spec: KafkaSource, where: Placement, applied: dict[int, int]) -> Unapplied:
    from confluent_kafka import Consumer, TopicPartition

    from phases._internal.sources.kafka import client_conf, partition_watermarks

    conf = client_conf(spec, where.source_brokers(spec))
    location = where.location(spec)
    try:
        marks = partition_watermarks(conf, spec.topic, timeout=10)
    except SourceError as exc:
        return Unapplied(location, None, "records", None, str(exc))
    waiting = {p: max(applied.get(p, lo), lo) for p, (lo, hi) in marks.items() if hi > max(applied.get(p, lo), lo)}
    behind = sum(hi - waiting[p] for p, (_, hi) in marks.items() if p in waiting)
    if not waiting:
        return Unapplied(location, 0, "records", None)
    consumer = Consumer({**conf, "group.id": "phases-probe", "enable.auto.commit": False})
    times = []
    try:
        consumer.assign([TopicPartition(spec.topic, p, o) for p, o in waiting.items()])
        remaining, deadline = set(waiting), time.monotonic() + 10
        while remaining and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None or msg.partition() not in remaining:
                continue
            remaining.discard(msg.partition())  # pyright: ignore[reportArgumentType]
            kind, ms = msg.timestamp()
            if ms is not None and ms >= 0:
                times.append(datetime.fromtimestamp(ms / 1000, tz=UTC))
    finally:
        consumer.close()
    return Unapplied(location, behind, "records", min(times) if times else None)
