"""The pipeline: one declaration that both phases run, with its inputs, the engine's locations and maintenance.

Validated at construction; messages name the field and the valid values. Only the parts that shape the
per-key state go into the fingerprint (see :meth:`Pipeline.state_spec`), so moving a sink or changing a
trigger interval does not invalidate a handoff manifest, while changing a key or an aggregation does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from phases._internal.definition.change_inputs import DEFAULT_MAX_FUTURE, changes_problem
from phases._internal.definition.fields import _Model, name, not_negative, positive, user_column
from phases._internal.definition.locations import Locations, Maintenance
from phases._internal.definition.operators import (
    OPERATOR_MODELS,
    OPERATOR_VERSION,
    WINDOW_END,
    WINDOW_START,
    CoGroup,
    IntervalJoin,
    Operator,
)
from phases._internal.definition.sinks import DeltaSink, KafkaSink
from phases._internal.definition.sources import DeltaSource, HybridSource, KafkaSource
from phases._internal.definition.steps import (
    FULL_PARTITION_KINDS,
    Derive,
    EndOfStreamStep,
    Enrichment,
    Filter,
    PartitionOperator,
)

# Bumped whenever the layout of the state table or the meaning of its columns changes.
STATE_SCHEMA_VERSION = 1

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TEAM = re.compile(r"^team:[A-Za-z0-9_.\- ]+$")
_TAG_VALUE = re.compile(r"^[A-Za-z0-9_.\-]{0,63}$")
_TAG_KEY = re.compile(r"^([A-Za-z0-9_.\-]{1,63}/)?[A-Za-z0-9_.\-]{1,63}$")


SOURCE_LABEL = ""  # the label of the pipeline's own source in the live phase's progress and watermarks
RIGHT_LABEL = "right"  # the label of a two-input operator's second source


@dataclass(frozen=True)
class Input:
    """One input of a pipeline: its label (:data:`SOURCE_LABEL` or :data:`RIGHT_LABEL`), its name in messages and
    reports, and its source declaration."""

    label: str
    name: str
    spec: DeltaSource | KafkaSource | HybridSource | PipelineSource


@dataclass(frozen=True)
class Inputs:
    """A pipeline's inputs, in order: its source, then a two-input operator's right source."""

    items: tuple[Input, ...]

    def __iter__(self) -> Iterator[Input]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def two(self) -> bool:
        """Whether the operator joins two inputs."""
        return len(self.items) == 2

    @property
    def right(self) -> Input | None:
        return self.items[1] if self.two else None

    @property
    def labels(self) -> list[str]:
        return [i.label for i in self.items]

    @property
    def tables_only(self) -> bool:
        """Whether every input is a Delta table (a pipeline's results too): positions are versions, no topic offsets."""
        return all(isinstance(i.spec, DeltaSource) for i in self.items)


class Pipeline(_Model):
    """Sources + key + event time + watermark delay + operator + sink + settings, declared once."""

    name: str
    source: DeltaSource | KafkaSource | HybridSource | PipelineSource = Field(discriminator="kind")
    key_columns: list[str] = Field(min_length=1)
    event_time: str
    watermark_delay: timedelta = Field(description="How far event time may lag the newest record.")
    operator: Operator = Field(discriminator="kind")
    steps: list[Filter | Derive | PartitionOperator] = Field(
        default_factory=list, description="Record steps before the operator; they run in both phases."
    )
    end_of_stream: list[EndOfStreamStep] = Field(
        default_factory=list, description="Backlog-only blocking steps (full dam / full partition)."
    )
    enrich: Enrichment | None = None
    sink: DeltaSink | KafkaSink = Field(discriminator="kind")
    locations: Locations
    checkpoint_interval: timedelta = Field(
        default=timedelta(seconds=5), description="Live phase: micro-batch trigger (and checkpoint) interval."
    )
    maintenance: Maintenance = Field(default_factory=Maintenance)
    max_future: timedelta | None = Field(
        default=DEFAULT_MAX_FUTURE,
        description="A record whose event time is more than this after its source version's commit time is "
        "quarantined (reason 'future') and does not move the watermark, so one far-future event cannot turn "
        "every later record late. None turns the guard off.",
    )
    min_event_time: datetime | None = Field(
        default=None,
        description="A record whose event time is before this is quarantined (reason 'past'). None: no bound. "
        "Naive datetimes are UTC.",
    )
    checkpoint_interval_during_backlog: timedelta = Field(
        default=timedelta(0),
        description="FLIP-309: 0 = the backlog runs as one batch job with no checkpoints; otherwise (>= "
        "checkpoint_interval) it commits a handoff after each increment of at most this much source time "
        "(commit time), so a crash re-runs at most one increment.",
    )
    # Catalog only (what an orchestrator shows of the pipeline's tables); not part of the fingerprint.
    description: str | None = Field(
        default=None, description="What the pipeline computes, shown on each of its assets."
    )
    owners: list[str] = Field(
        default_factory=list, description="Who owns the pipeline's tables: e-mail addresses or 'team:<name>'."
    )
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="Labels of the pipeline's tables (key: letters, digits, '_', '-', '.', optionally one "
        "'prefix/'; value: at most 63 of the same characters, or empty).",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return name(v, "pipeline name")

    @field_validator("key_columns")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        for col in v:
            user_column(col, "key column")
        if len(set(v)) != len(v):
            raise ValueError(f"key columns must be unique; got {v}")
        return v

    @field_validator("event_time")
    @classmethod
    def _event_time(cls, v: str) -> str:
        return user_column(v, "event_time")

    @field_validator("watermark_delay")
    @classmethod
    def _delay(cls, v: timedelta) -> timedelta:
        return not_negative(v, "watermark_delay")

    @field_validator("max_future")
    @classmethod
    def _max_future(cls, v: timedelta | None) -> timedelta | None:
        return None if v is None else not_negative(v, "max_future", none="no guard")

    @field_validator("min_event_time")
    @classmethod
    def _min_event_time(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            from datetime import UTC

            return v.replace(tzinfo=UTC)
        return v

    @field_validator("checkpoint_interval")
    @classmethod
    def _interval(cls, v: timedelta) -> timedelta:
        return positive(v, "checkpoint_interval")

    @field_validator("owners")
    @classmethod
    def _owners(cls, v: list[str]) -> list[str]:
        for owner in v:
            if not (_EMAIL.match(owner) or _TEAM.match(owner)):
                raise ValueError(
                    f"owner {owner!r} is neither an e-mail address nor 'team:<name>' (e.g. 'team:data-eng')"
                )
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _TAG_KEY.match(key):
                raise ValueError(
                    f"tag key {key!r} is not valid: letters, digits, '_', '-', '.', at most 63 of them, optionally "
                    "after one 'prefix/'"
                )
            if not _TAG_VALUE.match(value):
                raise ValueError(
                    f"tag {key!r}: value {value!r} is not valid: at most 63 letters, digits, '_', '-', '.'"
                )
        return v

    @model_validator(mode="after")
    def _cross_fields(self) -> Pipeline:
        derived = [s.name for s in self.steps if s.kind == "derive"]
        for field, columns in (("key_columns", list(self.key_columns)), ("event_time", [self.event_time])):
            made = [c for c in columns if c in derived]
            if made:
                raise ValueError(
                    f"{field} {made} are made by a record step (Derive), but the key columns and the event time are "
                    "checked on the records as the source holds them, before the record steps run (a record with a "
                    "null key or event time is quarantined). Use a column the source has, or derive the column "
                    "upstream, in the source table itself"
                )
        backlog, live = self.checkpoint_interval_during_backlog, self.checkpoint_interval
        if backlog != timedelta(0) and backlog < live:
            raise ValueError(
                f"checkpoint_interval_during_backlog ({backlog.total_seconds()}s) must be 0 (no checkpoints "
                f"during backlog) or >= checkpoint_interval ({live.total_seconds()}s)"
            )
        kind = self.operator
        if isinstance(self.source, KafkaSource | HybridSource) and backlog != timedelta(0):
            raise ValueError(
                "checkpoint_interval_during_backlog > 0 builds the backlog from increments, which a "
                f"{self.source.kind} source does not support (a Kafka backlog has no commit times; a hybrid "
                "source's backlog ends at its handoff); set it to 0"
            )
        if backlog != timedelta(0) and not self.supports_increments:
            raise ValueError(
                f"checkpoint_interval_during_backlog ({backlog.total_seconds()}s) makes the backlog commit in "
                f"increments of at most that much source time, and this pipeline's backlog cannot be built from "
                f"increments: {self.no_increments_because}; set it to 0"
            )
        if self.sink.mode == "changelog" and not kind.upserts:
            upserting = [model.model_fields["kind"].default for model in OPERATOR_MODELS if model.upserts]
            raise ValueError(
                "sink.mode 'changelog' is for operators that replace a key's row as it changes "
                f"({', '.join(upserting)}); {kind.kind} appends each result once already: "
                "use sink.mode 'upsert' (the default)"
            )
        outputs = [a.name for a in getattr(self.operator, "aggregations", [])]
        clash = sorted(set(outputs) & set(self.key_columns))
        if clash:
            raise ValueError(f"aggregation names {clash} clash with key columns {self.key_columns}")
        for i, step in enumerate(self.steps):
            if step.kind in FULL_PARTITION_KINDS:
                raise ValueError(
                    f"steps[{i}] ({step.kind}) is a full-partition operator: it emits only after its input "
                    "ends, and the live phase's input never ends. Run it in an end_of_stream step (backlog "
                    "only) and join its output with 'enrich'."
                )
        names = [s.name for s in self.end_of_stream]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"end_of_stream step names must be unique; repeated: {dupes}")
        if self.enrich is not None and self.enrich.step not in names:
            raise ValueError(f"enrich.step {self.enrich.step!r} is not an end_of_stream step; steps: {names}")
        if kind.windowed:
            clash = sorted(set(self.key_columns) & {WINDOW_START, WINDOW_END})
            if clash:
                raise ValueError(f"key columns {clash} are reserved for the window's bounds")
        if kind.two_inputs:
            used = [f for f in ("steps", "end_of_stream", "enrich") if getattr(self, f)]
            if used:
                raise ValueError(
                    f"{self.operator.kind} has two inputs; {used} would apply to one of them only and are not "
                    "supported with two-input operators. Prepare the inputs upstream."
                )
            shared = sorted(_read_by(self.operator.right) & _read_by(self.source))  # pyright: ignore[reportAttributeAccessIssue]
            if shared:
                raise ValueError(
                    f"{self.operator.kind}: right source is the pipeline's own source ({', '.join(shared)}): "
                    "join a second table or topic"
                )
        if kind.needs_ms_delay and self.watermark_delay % timedelta(milliseconds=1):
            raise ValueError(
                f"watermark_delay must be a whole number of milliseconds for a {self.operator.kind} operator "
                f"(Spark's watermark has millisecond resolution); got {self.watermark_delay}"
            )
        if self.event_time in self.key_columns:
            raise ValueError(f"event_time {self.event_time!r} cannot also be a key column")
        if (problem := changes_problem(self)) is not None:
            raise ValueError(problem)
        return self

    @property
    def reads_changes(self) -> bool:
        """Whether the source is a keyed aggregation's results, read as changes (each may take a row back)."""
        return bool(getattr(self.source, "reads_changes", False))

    @property
    def state_keys(self) -> list[str]:
        """Columns that identify a row of the state (and of the sink): the keys, plus the window bounds."""
        if self.operator.windowed:
            return [*self.key_columns, WINDOW_START, WINDOW_END]
        return list(self.key_columns)

    @property
    def no_increments_because(self) -> str | None:
        """Why the backlog cannot be caught up by increments (None: it can, every operator kind and every source: an
        aggregation merges pieces, the other kinds move their state on through their live step; a topic continues
        from the base handoff's end offsets)."""
        if self.end_of_stream:
            return (
                f"its end_of_stream steps {[s.name for s in self.end_of_stream]} consume the whole backlog 0..V in one "
                "run"
            )
        return None

    @property
    def supports_increments(self) -> bool:
        """Whether the backlog can be caught up by increments (and committed in increments,
        ``checkpoint_interval_during_backlog``): :attr:`no_increments_because` says why not."""
        return self.no_increments_because is None

    @property
    def supports_slices(self) -> bool:
        """Whether the backlog can be built from daily slices computed apart: only an aggregation (its state merges)
        over one Delta source (a topic has no commit days) without end-of-stream steps."""
        return (
            self.supports_increments
            and self.operator.takes_increments
            and not self.inputs.two
            and isinstance(self.source, DeltaSource)
        )

    @property
    def inputs(self) -> Inputs:
        """The pipeline's inputs: its source, and the second source of a two-input operator."""
        op = self.operator
        right = (Input(RIGHT_LABEL, "right source", op.right),) if isinstance(op, IntervalJoin | CoGroup) else ()
        return Inputs((Input(SOURCE_LABEL, "source", self.source), *right))

    @property
    def right_source(self) -> DeltaSource | KafkaSource | HybridSource | PipelineSource | None:
        """The second input of a two-input operator."""
        right = self.inputs.right
        return None if right is None else right.spec

    @property
    def delay_us(self) -> int:
        return int(self.watermark_delay / timedelta(microseconds=1))

    @property
    def max_future_us(self) -> int | None:
        return None if self.max_future is None else int(self.max_future / timedelta(microseconds=1))

    @property
    def min_event_time_us(self) -> int | None:
        if self.min_event_time is None:
            return None
        return int(
            (self.min_event_time - datetime(1970, 1, 1, tzinfo=self.min_event_time.tzinfo)) / timedelta(microseconds=1)
        )

    def state_spec(self) -> dict:
        """The part of the definition that shapes the state; its hash is the pipeline fingerprint."""
        return {
            "name": self.name,
            "source": self.source.state_spec(),
            "key_columns": list(self.key_columns),
            "event_time": self.event_time,
            "watermark_delay_us": self.delay_us,
            "operator": self._operator_spec(),
            # Only when used, so that pipelines without them keep their fingerprint.
            **({"steps": [step.model_dump(mode="json") for step in self.steps]} if self.steps else {}),
            **(
                {"end_of_stream": [step.model_dump(mode="json") for step in self.end_of_stream]}
                if self.end_of_stream
                else {}
            ),
            **({"enrich": self.enrich.model_dump(mode="json")} if self.enrich else {}),
            # The sink's shape: a changelog sink's handoff and live writes differ (a new backlog to switch modes).
            **({"sink_mode": self.sink.mode} if self.sink.mode != "upsert" else {}),
            # A topic sink's results are published from the handoff on: another topic needs them all (a new backlog).
            **({"sink_topic": self.sink.topic} if isinstance(self.sink, KafkaSink) else {}),
            # Avro records: the topic's consumers need every result in the new format (a new backlog).
            **(
                {"sink_value_format": self.sink.value_format.value}
                if isinstance(self.sink, KafkaSink) and self.sink.value_format != "json"
                else {}
            ),
            **({"max_future_us": self.max_future_us} if self.max_future != DEFAULT_MAX_FUTURE else {}),
            **({"min_event_time_us": self.min_event_time_us} if self.min_event_time is not None else {}),
            "state_schema_version": STATE_SCHEMA_VERSION,
            "operator_version": OPERATOR_VERSION,
        }

    def _operator_spec(self) -> dict:
        """The operator's part of the state spec: a join bucket shapes no state, and a second input counts by what it
        reads, not where its broker is (a Delta input's spec is its whole declaration, as it always was)."""
        spec = self.operator.model_dump(mode="json", exclude={"bucket"})
        if self.operator.two_inputs:
            spec["right"] = self.operator.right.state_spec()  # pyright: ignore[reportAttributeAccessIssue]
        return spec

    def fingerprint(self) -> str:
        return fingerprint_of(self.state_spec())


class PipelineSource(DeltaSource):
    """Another pipeline's results as this pipeline's source, named by the pipeline (not its paths): its sink table,
    read as a :class:`DeltaSource` where the upstream writes it (``path`` is the upstream's ``sink.path``, under the
    same storage root), so that arrival order, and with it lateness and the watermark W(v), is the upstream's commit
    order. The engine creates the sinks of the kinds whose results are appended (windows, sessions, process functions,
    interval joins, co-groups) with their change data feed on from the first version.

    The downstream's backlog runs once the upstream has handed off (before: a SourceError naming the upstream's
    backlog), and its live phase follows the upstream's commits. A keyed aggregation's results are replaced per key:
    they are read as changes (:mod:`phases._internal.definition.change_inputs`), from an upsert sink declared with
    ``change_feed=True``."""

    kind: Literal["pipeline"] = "pipeline"  # type: ignore[assignment]
    upstream: Pipeline = Field(description="The pipeline whose results this one reads.")
    path: str = Field(default="", description="Set from the upstream: its sink's path (leave it out).")

    @model_validator(mode="before")
    @classmethod
    def _upstream_sink(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "upstream" not in data:
            return data
        upstream = data["upstream"]
        sink = getattr(upstream, "sink", None)
        if sink is None and isinstance(upstream, dict):
            sink = upstream.get("sink")
        declared = getattr(sink, "path", None) if not isinstance(sink, dict) else sink.get("path")
        given = data.get("path")
        if given not in (None, "", declared):
            raise ValueError(
                f"source.path is the upstream pipeline's sink ({declared!r}), read where the upstream writes it; "
                f"leave it out (given {given!r})"
            )
        return {**data, "path": declared} if declared else data

    @model_validator(mode="after")
    def _readable_results(self) -> PipelineSource:
        sink, name = self.upstream.sink, self.upstream.name
        if self.upstream.operator.upserts and not (sink.mode == "upsert" and sink.change_feed):
            raise ValueError(
                f"upstream pipeline {name!r} is a keyed aggregation: its results are read as changes of its sink "
                f"(each replaced row taken back, the new one added), which needs its sink in mode 'upsert' with "
                f"change_feed=True (it is mode {sink.mode!r}, change_feed={sink.change_feed}). Declare that on "
                f"{name!r}'s sink; a sink it has written already keeps its properties: ALTER TABLE "
                f"delta.`{sink.path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true) as well"
            )
        return self

    @property
    def reads_changes(self) -> bool:
        """The upstream is a keyed aggregation: its results are a table replaced per key, read as changes."""
        return self.upstream.operator.upserts

    @property
    def location(self) -> str:
        return f"the results of pipeline {self.upstream.name!r} ({self.path})"

    def state_spec(self) -> dict:
        # The upstream by name and where it writes: a redeploy of the upstream changes its results, not this
        # declaration (the live phase and the backlog follow the upstream's table).
        spec: dict[str, str | int] = {"kind": self.kind, "upstream": self.upstream.name, "path": self.path}
        if self.starting_version:
            spec["starting_version"] = self.starting_version
        return spec


# A PipelineSource may be a pipeline's source or a two-input operator's right input; it is defined after both.
IntervalJoin.model_rebuild(_types_namespace={"PipelineSource": PipelineSource})
CoGroup.model_rebuild(_types_namespace={"PipelineSource": PipelineSource})
Pipeline.model_rebuild()


def fingerprint_of(state_spec: dict) -> str:
    """The fingerprint of a state spec (:meth:`Pipeline.state_spec`): its hash."""
    blob = json.dumps(state_spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _read_by(spec: DeltaSource | KafkaSource | HybridSource) -> set[str]:
    """What a source reads: Delta tables by path, Kafka topics by name (an archive handing over: both)."""
    if isinstance(spec, KafkaSource):
        return {f"kafka topic {spec.topic!r}"}
    if isinstance(spec, HybridSource):
        return _read_by(spec.backlog) | _read_by(spec.live)  # pyright: ignore[reportArgumentType]
    return {spec.path}
