"""Where a pipeline's records come from: a Delta table's change feed, a Kafka topic, a hybrid of an archive and a
topic. Where its results go: :mod:`phases._internal.definition.sinks`."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_serializer, model_validator

from phases._internal.definition.fields import RESERVED_PREFIX, _Model
from phases._internal.definition.registry import SchemaRegistry


class DeltaSource(_Model):
    """A Delta table read as backlog (snapshot at version V) then live (versions V+1, V+2, ...).

    The table must be append-only and have the change data feed enabled (``delta.enableChangeDataFeed =
    true``) from its first version, or from ``starting_version``: the change feed gives each record its
    commit version, which defines arrival order and therefore lateness (see :mod:`phases._internal.lateness`).
    """

    kind: Literal["delta"] = "delta"
    path: str = Field(min_length=1)
    starting_version: int = Field(
        default=0,
        ge=0,
        description="For a table whose change data feed was turned on after it was created: versions "
        "0..starting_version-1 are read as one snapshot of version starting_version-1 (one arrival, with that "
        "version's commit time), later versions through the change feed. 0: the feed from the first version.",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        # The default leaves the dump (and so every existing pipeline's fingerprint) as it was.
        data = handler(self)
        if isinstance(data, dict) and data.get("starting_version") == 0:
            data.pop("starting_version")
        return data

    @property
    def location(self) -> str:
        return self.path

    def state_spec(self) -> dict:
        return self.model_dump(mode="json")


class ValueFormat(StrEnum):
    """How a topic's record values are written: JSON text, or Avro or Protobuf in the Confluent wire format (a zero
    magic byte, the schema id, for Protobuf the message indexes, then the binary encoding) with its schemas in a schema
    registry."""

    JSON = "json"
    AVRO = "avro"
    PROTOBUF = "protobuf"


# A DDL field list as Spark writes it: "key string, ts timestamp, value bigint" (types are checked by Spark).
_DDL_FIELD = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s+\S.*$")


def ddl_field_names(ddl: str) -> list[str]:
    """The top-level field names of a DDL field list (commas inside ``<...>``/``(...)`` do not split)."""
    names, depth, start = [], 0, 0
    parts = []
    for i, ch in enumerate(ddl):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(ddl[start:i])
            start = i + 1
    parts.append(ddl[start:])
    for part in parts:
        match = _DDL_FIELD.match(part)
        if match is None:
            raise ValueError(f"{part.strip()!r} is not a field of a DDL schema ('name type', e.g. 'ts timestamp')")
        names.append(match.group(1))
    return names


_OWNED_KAFKA_OPTIONS = frozenset(
    {
        "subscribe",
        "assign",
        "subscribePattern",
        "startingOffsets",
        "endingOffsets",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "failOnDataLoss",
        "maxOffsetsPerTrigger",
        "kafka.bootstrap.servers",
    }
)


class KafkaSource(_Model):
    """A Kafka topic read as backlog (every partition from its earliest offset to the end offsets captured when
    the backlog starts, a Spark batch job) then live (from exactly those offsets; partitions added later from
    their start).

    Kafka has no commit versions, so the framework defines arrival order by **arrival chunks** that play their
    role (:mod:`phases._internal.sources.kafka`): the backlog is cut into fixed-size slices of ``backlog_chunk_records``
    offsets per partition, and each live micro-batch is one chunk; both are recorded (manifest, progress log).
    The record's Kafka timestamp stands for its version's commit time (the ``max_future`` guard).
    """

    kind: Literal["kafka"] = "kafka"
    topic: str = Field(min_length=1)
    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port...]; not part of the fingerprint")
    value_format: ValueFormat = Field(
        default=ValueFormat.JSON,
        description=f"How the values are written, one of {[f.value for f in ValueFormat]}: 'avro' and 'protobuf' need "
        "a registry.",
    )
    value_schema: str | None = Field(
        default=None,
        min_length=1,
        description="The record's fields as a Spark DDL list, e.g. 'key string, ts timestamp, value bigint'. JSON: "
        "required; a value that is not JSON of this shape is quarantined (reason 'undecodable'), with its topic, "
        "partition and offset. Avro and Protobuf: optional; given, the pipeline reads these fields of each record "
        "(cast to these types), else every field of the subject's newest schema (Protobuf: of its first message).",
    )
    registry: SchemaRegistry | None = Field(
        default=None,
        description="Avro or Protobuf values: the schema registry that holds their schemas. Not part of the "
        "fingerprint.",
    )
    value_subject: str | None = Field(
        default=None,
        description="Avro or Protobuf values: the registry subject of the value schemas (default: '<topic>-value').",
    )
    key_format: Literal["avro", "protobuf"] | None = Field(
        default=None,
        description="Avro or Protobuf values: the record keys' format. None (default) leaves them unread; 'avro' or "
        "'protobuf' (the Confluent wire format) makes the key record's fields columns beside the value's (the value's "
        "field wins where both have one).",
    )
    key_subject: str | None = Field(
        default=None,
        description="Avro or Protobuf keys: the registry subject of the key schemas (default: '<topic>-key').",
    )
    backlog_chunk_records: int = Field(
        default=100_000,
        gt=0,
        description="Arrival chunks of the backlog: this many offsets of each partition per chunk.",
    )
    options: dict[str, str] = Field(
        default_factory=dict,
        description="Options of Spark's Kafka source, as Spark names them: Kafka consumer settings with a 'kafka.' "
        "prefix ('kafka.security.protocol', 'kafka.default.api.timeout.ms') and the source's own "
        "('kafkaConsumer.pollTimeoutMs', 'fetchOffset.numRetries'). Not part of the fingerprint.",
    )
    client_options: dict[str, str] = Field(
        default_factory=dict,
        description="Settings of the confluent-kafka (librdkafka) client that reads end offsets for the backlog's "
        "chunk plan and the switch sensor's lag, e.g. {'security.protocol': 'SSL'}. Not part of the fingerprint.",
    )
    connect_timeout: timedelta = Field(
        default=timedelta(seconds=30),
        description="How long the engine waits for the brokers to answer before it stops, naming "
        "source.bootstrap_servers (nothing read). Not part of the fingerprint.",
    )

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, str]) -> dict[str, str]:
        owned = sorted(k for k in v if k in _OWNED_KAFKA_OPTIONS)
        if owned:
            raise ValueError(
                f"options {owned} are set by the framework (the backlog's end offsets, the live phase's start, "
                f"failing on lost offsets); the options it owns: {sorted(_OWNED_KAFKA_OPTIONS)}"
            )
        return v

    @field_validator("connect_timeout")
    @classmethod
    def _connect_timeout(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("source.connect_timeout must be positive")
        return v

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", v):
            raise ValueError(f"{v!r} is not a Kafka topic name (letters, digits, '.', '_', '-'; at most 249)")
        return v

    @field_validator("value_schema")
    @classmethod
    def _schema(cls, v: str | None) -> str | None:
        if v is None:
            return v
        names = ddl_field_names(v)
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"value_schema repeats fields {dupes}")
        reserved = [n for n in names if n.startswith(RESERVED_PREFIX)]
        if reserved:
            raise ValueError(f"value_schema fields {reserved} start with {RESERVED_PREFIX!r}, reserved for the engine")
        return v

    @model_validator(mode="after")
    def _format_settings(self) -> KafkaSource:
        if self.value_format == ValueFormat.JSON:
            if self.value_schema is None:
                raise ValueError("source.value_schema is required for JSON values (a Spark DDL list of the fields)")
            given = [f for f in ("registry", "value_subject", "key_format") if getattr(self, f) is not None]
            if given:
                raise ValueError(f"source {given} are for Avro or Protobuf records; source.value_format is 'json'")
        elif self.registry is None:
            raise ValueError(
                f"source.value_format {self.value_format.value!r} needs source.registry (SchemaRegistry(url=...)): "
                "the record names its schema by an id the registry resolves"
            )
        if self.key_format is None and self.key_subject is not None:
            raise ValueError("source.key_subject is for Avro or Protobuf keys; source.key_format is not set")
        return self

    @property
    def location(self) -> str:
        return f"kafka topic {self.topic!r} at {self.bootstrap_servers}"

    @property
    def subject(self) -> str:
        """The registry subject of the value schemas."""
        return self.value_subject or f"{self.topic}-value"

    @property
    def key_subject_name(self) -> str:
        """The registry subject of the key schemas."""
        return self.key_subject or f"{self.topic}-key"

    @property
    def field_names(self) -> list[str]:
        return ddl_field_names(self.value_schema) if self.value_schema else []

    def state_spec(self) -> dict:
        # Unset Avro settings stay out, so that a JSON source keeps its fingerprint.
        spec = self.model_dump(
            mode="json", exclude={"bootstrap_servers", "options", "client_options", "connect_timeout", "registry"}
        )
        optional = ("value_schema", "value_subject", "key_format", "key_subject")
        return {k: v for k, v in spec.items() if not (k in optional and v is None)}


class KafkaHandoff(_Model):
    """Where a hybrid source hands over from its archive to its topic: explicit end offsets per partition, or a
    timestamp resolved to offsets when the backlog starts (the first offset of each partition whose Kafka
    timestamp is >= it; Kafka's ``offsetsForTimes``). Either way the resolved offsets are recorded in the handoff
    manifest, and the live phase starts at exactly them."""

    offsets: dict[int, int] | None = Field(
        default=None, description="partition -> the first offset the live phase reads (a partition left out: from 0)."
    )
    timestamp: datetime | None = Field(default=None, description="Resolved to offsets per partition; naive is UTC.")

    @field_validator("timestamp")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            from datetime import UTC

            return v.replace(tzinfo=UTC)
        return v

    @model_validator(mode="after")
    def _one(self) -> KafkaHandoff:
        if (self.offsets is None) == (self.timestamp is None):
            raise ValueError("handoff: give exactly one of 'offsets' (partition -> offset) or 'timestamp'")
        if self.offsets is not None and any(p < 0 or o < 0 for p, o in self.offsets.items()):
            raise ValueError(f"handoff.offsets: partitions and offsets must be >= 0; got {self.offsets}")
        return self


class FileFormat(StrEnum):
    PARQUET = "parquet"
    JSON = "json"


class FileArchive(_Model):
    """A folder of Parquet or JSON (JSON Lines) files as a hybrid source's backlog. Arrival order: the files by
    name, one file one version (0, 1, ...); a file's modification time stands for its commit time. Names
    starting with '_' or '.' are skipped (Spark's convention for metadata files). The records are read with the
    live topic's declared value schema (plus the archive's Kafka position columns)."""

    kind: Literal["files"] = "files"
    path: str = Field(min_length=1)
    format: FileFormat = FileFormat.PARQUET

    @property
    def location(self) -> str:
        return f"{self.format.value} files in {self.path}"


def _archive_kind(value) -> str:
    """A hybrid source's archive kind; a Delta table when not given."""
    if isinstance(value, dict):
        return value.get("kind", "delta")
    return getattr(value, "kind", "delta")


class HybridSource(_Model):
    """FLIP-327's first example (Flink's ``HybridSource``): an archive (a Delta table, or a folder of Parquet or
    JSON files) as the backlog, then a Kafka topic as the live input, handed over at an explicit, recorded
    position.

    No record is in both phases and none in neither, even when the archive and the topic overlap: the archive
    keeps the Kafka position of each record it holds (``archive_partition_column`` / ``archive_offset_column``,
    as Kafka Connect's sinks write them) and the backlog takes only records before the handoff offsets, the live
    phase everything from them. Without those columns the archive is taken whole and the handoff offsets must be
    exactly where it ends. Arrival order: the archive's versions, then one arrival chunk per live micro-batch.
    """

    kind: Literal["hybrid"] = "hybrid"
    backlog: Annotated[
        Annotated[DeltaSource, Tag("delta")] | Annotated[FileArchive, Tag("files")],
        Discriminator(_archive_kind),
    ] = Field(description="The archive: a Delta table ({'path': ...}) or files ({'kind': 'files', 'path': ...}).")
    live: KafkaSource
    handoff: KafkaHandoff
    archive_partition_column: str | None = None
    archive_offset_column: str | None = None

    @model_validator(mode="after")
    def _columns(self) -> HybridSource:
        pair = (self.archive_partition_column, self.archive_offset_column)
        if (pair[0] is None) != (pair[1] is None):
            raise ValueError("archive_partition_column and archive_offset_column go together: give both or neither")
        if self.handoff.timestamp is not None and pair[0] is None:
            raise ValueError(
                "a handoff by timestamp resolves to offsets per partition, and the archive can be cut there only by "
                "its records' Kafka positions: set archive_partition_column and archive_offset_column, or hand off "
                "at explicit offsets where the archive ends"
            )
        return self

    @property
    def location(self) -> str:
        return f"{self.backlog.location}, then {self.live.location}"

    def state_spec(self) -> dict:
        data = self.model_dump(mode="json", exclude={"live"})
        data["live"] = self.live.state_spec()
        return data
