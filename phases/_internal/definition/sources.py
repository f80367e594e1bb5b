"""Where a pipeline's records come from (a Delta table's change feed, a Kafka topic, a hybrid of an archive and a
topic) and where its results go (a Delta table, or a Kafka topic beside the engine's Delta table of the results)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator, model_serializer, model_validator

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
    """How a topic's record values are written: JSON text, or Avro in the Confluent wire format (a zero magic byte,
    the schema id, the Avro binary encoding) with its schemas in a schema registry."""

    JSON = "json"
    AVRO = "avro"


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
        description=f"How the values are written, one of {[f.value for f in ValueFormat]}: 'avro' needs a registry.",
    )
    value_schema: str | None = Field(
        default=None,
        min_length=1,
        description="The record's fields as a Spark DDL list, e.g. 'key string, ts timestamp, value bigint'. JSON: "
        "required; a value that is not JSON of this shape is quarantined (reason 'undecodable'), with its topic, "
        "partition and offset. Avro: optional; given, the pipeline reads these fields of each record (cast to these "
        "types), else every field of the subject's newest schema.",
    )
    registry: SchemaRegistry | None = Field(
        default=None,
        description="Avro values: the schema registry that holds their schemas. Not part of the fingerprint.",
    )
    value_subject: str | None = Field(
        default=None,
        description="Avro values: the registry subject of the value schemas (default: '<topic>-value').",
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
            given = [f for f in ("registry", "value_subject") if getattr(self, f) is not None]
            if given:
                raise ValueError(f"source {given} are for Avro values; source.value_format is 'json'")
        elif self.registry is None:
            raise ValueError(
                f"source.value_format {self.value_format.value!r} needs source.registry (SchemaRegistry(url=...)): "
                "the record names its schema by an id the registry resolves"
            )
        return self

    @property
    def location(self) -> str:
        return f"kafka topic {self.topic!r} at {self.bootstrap_servers}"

    @property
    def subject(self) -> str:
        """The registry subject of the value schemas."""
        return self.value_subject or f"{self.topic}-value"

    @property
    def field_names(self) -> list[str]:
        return ddl_field_names(self.value_schema) if self.value_schema else []

    def state_spec(self) -> dict:
        # Unset Avro settings stay out, so that a JSON source keeps its fingerprint.
        spec = self.model_dump(
            mode="json", exclude={"bootstrap_servers", "options", "client_options", "connect_timeout", "registry"}
        )
        return {k: v for k, v in spec.items() if not (k in ("value_schema", "value_subject") and v is None)}


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


SINK_MODES = ("upsert", "changelog")
UPSERT_WRITES = ("auto", "merge", "rewrite")


class DeltaSink(_Model):
    """The pipeline's result table. Windows, sessions, process functions, interval joins and co-groups append
    each result once. A keyed aggregation keeps one row per key, in one of two modes:

    - ``upsert`` (default): ``path`` holds one row per key; every live micro-batch writes the changed keys' rows
      into it in one commit (a pass over the table: its cost grows with the number of keys). ``upsert_write``
      says how: ``merge`` (a MERGE on the keys), ``rewrite`` (the table's other rows and the changed ones, in one
      overwrite: no search for the files the keys are in, and no shuffle of the table), or ``auto`` (default):
      ``rewrite`` when the updated keys are enough to reach nearly every file of the table (at least
      five a file: the engine writes the sink with its keys spread over its files, so a MERGE would rewrite them
      all as well), else ``merge``;
    - ``changelog``: ``path`` is an append-only log of the changed keys' rows, each with the micro-batch
      (``_batch_id``; -1: the handoff), the newest source version that changed the key (``_source_version``)
      and ``_op``; every micro-batch appends once. ``current_path`` is compacted from it outside the
      micro-batch (every ``compact_every`` while the live phase runs, and by ``phases.compact_changelog``);
      ``phases.read_current`` gives the latest row per key, exactly, at any time.
    """

    kind: Literal["delta"] = "delta"
    path: str = Field(min_length=1)
    mode: Literal["upsert", "changelog"] = Field(
        default="upsert",
        description=f"How a keyed aggregation's live results reach the sink: one of {list(SINK_MODES)}.",
    )
    upsert_write: Literal["auto", "merge", "rewrite"] = Field(
        default="auto",
        description=f"upsert mode: how a live micro-batch writes the changed keys, one of {list(UPSERT_WRITES)} "
        "(auto: rewrite when the updated keys reach nearly every file of the sink, else merge). Choose merge for a "
        "sink clustered by its key (OPTIMIZE ZORDER BY the key), where a MERGE touches few files.",
    )
    current_path: str | None = Field(
        default=None,
        description="changelog mode: the compacted table of the latest row per key (default: <path>_current).",
    )
    compact_every: timedelta = Field(
        default=timedelta(minutes=1),
        description="changelog mode: how often the running live phase compacts the changelog into current_path, "
        "in a background thread (0: only when phases.compact_changelog is called).",
    )

    @property
    def current(self) -> str:
        """The compacted table of a changelog sink."""
        return self.current_path or f"{self.path.rstrip('/')}_current"

    @model_validator(mode="after")
    def _changelog_only_settings(self) -> DeltaSink:
        if self.mode != "changelog" and self.current_path is not None:
            raise ValueError(
                f"sink.current_path is the compacted table of a changelog sink; sink.mode is {self.mode!r}"
            )
        if self.mode != "upsert" and self.upsert_write != "auto":
            raise ValueError(
                f"sink.upsert_write says how an upsert sink is written; sink.mode is {self.mode!r} (leave it 'auto')"
            )
        if self.compact_every < timedelta(0):
            raise ValueError("sink.compact_every must be 0 (no background compaction) or positive")
        return self


# The name a Kafka topic may have (Kafka's own rule: letters, digits, '.', '_', '-'; at most 249 characters).
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
# librdkafka settings the topic sink sets itself (its transactions, its partitioner, its marker group).
_OWNED_PRODUCER_SETTINGS = frozenset(
    {"bootstrap.servers", "transactional.id", "enable.idempotence", "partitioner", "group.id", "isolation.level"}
)


class KafkaSink(DeltaSink):
    """The pipeline's results published to a Kafka topic, exactly once, as well as kept in the engine's Delta table at
    ``path`` (every field of :class:`DeltaSink` holds for that table; a relative ``path`` is under the deployment's
    storage root).

    Every write goes out in one Kafka transaction that also commits the write's marker (what it applied: the handoff
    and the live micro-batch), before the engine records the write as done; a replay after a crash reads the marker
    and neither loses nor repeats a write. A consumer with ``isolation.level=read_committed`` reads each result once.
    The handoff's results (every result of the backlog: every key's row of an aggregation) go out first, then each
    live micro-batch's: in ``upsert`` mode one record per changed key (the key columns as the Kafka key, the result
    row as the value; meant for a compacted topic), in ``changelog`` mode every change, its value with ``_batch_id``,
    ``_source_version`` and ``_op``. Record format and headers: :mod:`phases._internal.topics.records`. The topic
    must exist before the backlog runs.
    """

    kind: Literal["kafka"] = "kafka"  # type: ignore[assignment]
    path: str = Field(
        min_length=1,
        description="The engine's Delta table of the results beside the topic (what the switch, a live start and a "
        "reconciliation read); a relative path is under the deployment's storage root.",
    )
    topic: str = Field(min_length=1, description="The result topic (it must exist; compacted for an upsert sink).")
    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port...]; not part of the fingerprint")
    client_options: dict[str, str] = Field(
        default_factory=dict,
        description="Settings of the confluent-kafka (librdkafka) producer and marker reader, e.g. "
        "{'security.protocol': 'SSL'}. Not part of the fingerprint.",
    )
    transaction_timeout: timedelta = Field(
        default=timedelta(seconds=60),
        description="How long one write (a transaction) may take before the broker aborts it.",
    )
    connect_timeout: timedelta = Field(
        default=timedelta(seconds=30),
        description="How long the engine waits for the brokers to answer before anything is written (the topic's "
        "check, a redeploy's new topic) before it stops, naming sink.bootstrap_servers.",
    )
    value_format: ValueFormat = Field(
        default=ValueFormat.JSON,
        description=f"How keys and values are written, one of {[f.value for f in ValueFormat]}: 'avro' registers the "
        "results' schema in the registry and writes the Confluent wire format.",
    )
    registry: SchemaRegistry | None = Field(
        default=None, description="Avro: the schema registry of the topic's schemas. Not part of the fingerprint."
    )
    value_subject: str | None = Field(
        default=None, description="Avro: the subject of the value schema (default: '<topic>-value')."
    )
    key_subject: str | None = Field(
        default=None, description="Avro: the subject of the key schema (default: '<topic>-key')."
    )

    @model_validator(mode="after")
    def _format_settings(self) -> KafkaSink:
        if self.value_format == ValueFormat.JSON:
            given = [f for f in ("registry", "value_subject", "key_subject") if getattr(self, f) is not None]
            if given:
                raise ValueError(f"sink {given} are for Avro records; sink.value_format is 'json'")
        elif self.registry is None:
            raise ValueError(
                f"sink.value_format {self.value_format.value!r} needs sink.registry (SchemaRegistry(url=...)): the "
                "results' schema is registered there and each record names it by its id"
            )
        return self

    @property
    def subjects(self) -> tuple[str, str]:
        """(the key's, the value's) registry subjects."""
        return self.key_subject or f"{self.topic}-key", self.value_subject or f"{self.topic}-value"

    @field_validator("topic")
    @classmethod
    def _topic_name(cls, v: str) -> str:
        if not _TOPIC_NAME.fullmatch(v) or v in (".", ".."):
            raise ValueError(
                f"sink.topic {v!r} is not a Kafka topic name: 1 to 249 of letters, digits, '.', '_' and '-'"
            )
        return v

    @field_validator("client_options")
    @classmethod
    def _client_options(cls, v: dict[str, str]) -> dict[str, str]:
        owned = sorted(k for k in v if k in _OWNED_PRODUCER_SETTINGS)
        if owned:
            raise ValueError(
                f"sink.client_options {owned} are set by the topic sink itself (its transactions, partitioner and "
                f"marker group); the settings it owns: {sorted(_OWNED_PRODUCER_SETTINGS)}"
            )
        return v

    @field_validator("transaction_timeout", "connect_timeout")
    @classmethod
    def _timeout(cls, v: timedelta, info: ValidationInfo) -> timedelta:
        if v <= timedelta(0):
            raise ValueError(f"sink.{info.field_name} must be positive")
        return v
