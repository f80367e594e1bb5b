"""Where a pipeline's results go: a Delta table, or a Kafka topic beside the engine's Delta table of the results."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from phases._internal.definition.fields import _Model
from phases._internal.definition.registry import SchemaRegistry
from phases._internal.definition.sources import ValueFormat

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
    change_feed: bool = Field(
        default=False,
        description="keyed aggregation, upsert mode: create the sink with its change data feed on, so that other "
        "pipelines can read its results as changes (PipelineSource); each write then records the changed rows' old "
        "and new values too. The sinks of the appending kinds always have it on.",
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
        if self.change_feed and self.mode != "upsert":
            raise ValueError(
                "sink.change_feed lets other pipelines read an upsert sink's changes; a changelog sink's rows do not "
                "carry the value they replace. Use sink.mode 'upsert' with change_feed=True"
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
        description=f"How keys and values are written, one of {[f.value for f in ValueFormat]}: 'avro' and "
        "'protobuf' register the results' schema in the registry and write the Confluent wire format.",
    )
    registry: SchemaRegistry | None = Field(
        default=None,
        description="Avro or Protobuf: the schema registry of the topic's schemas. Not part of the fingerprint.",
    )
    value_subject: str | None = Field(
        default=None, description="Avro or Protobuf: the subject of the value schema (default: '<topic>-value')."
    )
    key_subject: str | None = Field(
        default=None, description="Avro or Protobuf: the subject of the key schema (default: '<topic>-key')."
    )

    @model_validator(mode="after")
    def _format_settings(self) -> KafkaSink:
        if self.value_format == ValueFormat.JSON:
            given = [f for f in ("registry", "value_subject", "key_subject") if getattr(self, f) is not None]
            if given:
                raise ValueError(f"sink {given} are for Avro or Protobuf records; sink.value_format is 'json'")
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
