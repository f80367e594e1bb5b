"""The live run's plan: everything the micro-batch driver needs, decided once by
:class:`phases._internal.live.runner.LiveRunner` and handed to
:class:`phases._internal.live.micro_batch.IncrementalLive`: the operator kind and its logic, the inputs and their
readers, the progress the run starts from (the switch's: where the handoff left each input), and the run's paths. Also
what a live run records of its progress (:class:`Progress`, one per micro-batch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from phases._internal import uris
from phases._internal.coordination import progress_log
from phases._internal.definition import RIGHT_LABEL, SOURCE_LABEL, DeltaSource, Pipeline
from phases._internal.errors import DefinitionError, PhaseStateError, SchemaChangeError
from phases._internal.handoff.manifest import HandoffManifest
from phases._internal.lateness import watermark_after
from phases._internal.operators.base import OperatorKind
from phases._internal.operators.registry import kind_of
from phases._internal.placement import Placement
from phases._internal.schema_changes import way_out as schema_way_out
from phases._internal.sources.reader import SourceReader, open_inputs
from phases._internal.state.keyed_store import StatePosition
from phases._internal.storage import table_stats

STREAMING_ONLY = "streaming-only"  # the run name of one streaming job over all versions (no handoff)


@dataclass(frozen=True)
class InputProgress:
    """How far one input is applied."""

    complete_below: int  # every version of the input below this one is applied
    running_max_us: int | None  # max valid event time of those versions (W(v) = this - delay)
    held_version: int | None  # a version read only in part, held in the input's pending table


@dataclass(frozen=True)
class Progress:
    """What the live phase had applied after micro-batch ``batch_id`` (-1: the switch). The unprefixed
    input fields are the pipeline's source; ``right_*`` a two-input operator's second source."""

    batch_id: int
    complete_below: int
    running_max_us: int | None
    closed_us: int | None  # windows/sessions/co-group windows ending at or before this were emitted
    held_version: int | None
    at_us: int = 0
    right_complete_below: int | None = None
    right_running_max_us: int | None = None
    right_held_version: int | None = None
    # A Kafka source: the end offsets (partition -> offset) after this batch; with the previous record's, the
    # offset ranges of the batch's arrival chunk (the live half of the arrival-chunk log).
    source_offsets: dict[str, int] | None = None
    right_source_offsets: dict[str, int] | None = None  # ... and a Kafka right input's
    # The query generation that wrote the record: its micro-batch 0 is the log's batch ``query_base``
    # (:mod:`phases._internal.live.resume`; a new one starts when the checkpoint was lost).
    query_base: int = 0
    # The operator's state in the run's state store after this batch: the store layout and its version
    # (:mod:`phases._internal.state.keyed_store`; None: the state is still the handoff's, not yet in a store).
    state_layout: str | None = None
    state_version: int | None = None
    # The newest micro-batch whose write each of the run's tables holds, by write (``what`` of
    # :mod:`phases._internal.storage.live_writes`): a start refuses tables restored to before it. None: a record from
    # before
    # the log kept it.
    writes: dict[str, int] | None = None

    @property
    def state(self) -> StatePosition | None:
        if self.state_layout is None or self.state_version is None:
            return None
        return StatePosition(self.state_layout, self.state_version)

    def offsets_of(self, label: str) -> dict[int, int] | None:
        """A Kafka input's end offsets after this batch (partition -> offset), None for a Delta input."""
        offsets = getattr(self, f"{label}_source_offsets" if label else "source_offsets")
        return None if offsets is None else {int(p): int(o) for p, o in offsets.items()}

    def of(self, label: str) -> InputProgress:
        prefix = f"{label}_" if label else ""
        return InputProgress(
            getattr(self, f"{prefix}complete_below"),
            getattr(self, f"{prefix}running_max_us"),
            getattr(self, f"{prefix}held_version"),
        )

    @staticmethod
    def of_inputs(
        batch_id: int,
        inputs: dict[str, InputProgress],
        closed_us: int | None,
        at_us: int = 0,
        offsets: dict[str, dict[str, int]] | None = None,
        query_base: int = 0,
        state: StatePosition | None = None,
        writes: dict[str, int] | None = None,
    ) -> Progress:
        fields: dict = {
            "writes": writes,
            "batch_id": batch_id,
            "closed_us": closed_us,
            "at_us": at_us,
            "query_base": query_base,
            "state_layout": state.layout if state else None,
            "state_version": state.version if state else None,
        }
        for label, inp in inputs.items():
            prefix = f"{label}_" if label else ""
            fields[f"{prefix}source_offsets"] = (offsets or {}).get(label)
            fields[f"{prefix}complete_below"] = inp.complete_below
            fields[f"{prefix}running_max_us"] = inp.running_max_us
            fields[f"{prefix}held_version"] = inp.held_version
        return Progress(**fields)

    def record(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_record(record: dict) -> Progress:
        names = {f.name for f in dataclasses.fields(Progress)}
        return Progress(**{k: v for k, v in record.items() if k in names})

    def without_held(self) -> Progress:
        """The same positions with no version held in part (a new query reads such a version again whole)."""
        held = {"held_version": None}
        if self.right_complete_below is not None:
            held["right_held_version"] = None
        return dataclasses.replace(self, **held)


@dataclass(frozen=True)
class LiveInput:
    """One source the live query reads: the pipeline's (label ``""``) or a two-input operator's right one."""

    label: str
    source: SourceReader

    def suffix(self, what: str) -> str:
        return f"{what}_{self.label}" if self.label else what


@dataclass(frozen=True)
class LivePaths:
    """Where one live run keeps its tables and files."""

    run_name: str  # the handoff's manifest id, or STREAMING_ONLY
    state: str  # the state table (the handoff's)
    sink: str
    checkpoints: str  # the run's streaming checkpoints: one folder per query generation
    run_root: str  # the run's folder: its progress log and the inputs' held-back rows
    state_store: str  # the run's state stores (:meth:`phases._internal.placement.Placement.state_store`)

    @property
    def progress_log(self) -> str:
        return f"{self.run_root}/{progress_log.FOLDER}"

    def pending(self, inp: LiveInput) -> str:
        """The input's table of rows held back until their version is complete."""
        return f"{self.run_root}/{inp.suffix('pending')}"


@dataclass
class LivePlan:
    """One live run of a pipeline: its kind and logic (rebuilt after a schema change), its inputs, the progress it
    starts from, and its paths. ``placement``: the definition (``pipeline``) and where it runs."""

    placement: Placement
    kind: OperatorKind
    logic: Any
    inputs: list[LiveInput]
    start: Progress
    paths: LivePaths
    max_files_per_trigger: int | None = None
    handoff: HandoffManifest | None = None  # what the live phase starts from (None: one streaming job)

    @classmethod
    def of(
        cls,
        spark: SparkSession,
        where: Placement,
        handoff: HandoffManifest | None,
        *,
        max_files_per_trigger: int | None = None,
    ) -> LivePlan:
        """The plan of the live phase of ``handoff`` (None: one streaming job over every version)."""
        pipeline = where.definition
        if handoff is None and pipeline.enrich is not None:
            raise PhaseStateError(
                f"pipeline {pipeline.name!r} enriches with end-of-stream step {pipeline.enrich.step!r}, which emits "
                "only after the backlog ends: it has no single-streaming-job form; start it from a handoff"
            )
        readers = open_inputs(spark, where, positions=handoff.positions if handoff else None)
        inputs = [LiveInput(label, reader) for label, reader in readers.items()]
        run_name = handoff.manifest_id if handoff else STREAMING_ONLY
        paths = LivePaths(
            run_name=run_name,
            state=handoff.state_path if handoff else uris.join(where.state_root, STREAMING_ONLY),
            sink=where.sink_path,
            checkpoints=where.live_checkpoint(run_name),
            run_root=where.live_run(run_name),
            state_store=where.state_store(run_name),
        )
        kind = kind_of(pipeline)
        start = _switch_progress(pipeline, kind, handoff)
        plan = cls(where, kind, None, inputs, start, paths, max_files_per_trigger, handoff)
        try:
            plan.logic = plan.build_logic(spark)
        except DefinitionError as exc:
            changed = _source_changes_since(where, handoff) if handoff is not None else []
            if not changed:
                raise
            raise SchemaChangeError(
                f"pipeline {pipeline.name!r}: the source's schema changed since the handoff ({'; '.join(changed)}) "
                f"and its operator cannot take it: {exc}. {schema_way_out(pipeline.name)}"
            ) from exc
        return plan

    def build_logic(self, spark: SparkSession) -> Any:
        """The operator's logic for the inputs' current schemas (as the operator sees them)."""
        return self.kind.logic_for(spark, self.placement, (i.source for i in self.inputs))

    @property
    def pipeline(self) -> Pipeline:
        """The definition, as declared."""
        return self.placement.definition

    @property
    def source(self) -> SourceReader:
        """The reader of the pipeline's own source."""
        return self.inputs[0].source


def _source_changes_since(where: Placement, handoff: HandoffManifest) -> list[str]:
    """The columns of the pipeline's Delta source whose type differs between the handoff's version and now (read
    from the Delta log with delta-rs), as "column 'c': <then> -> <now>"."""
    source = where.definition.source
    if not isinstance(source, DeltaSource):
        return []
    path = where.source_path(source)
    then = table_stats.column_types(path, handoff.source_version)
    now = table_stats.column_types(path)
    return [f"column {name!r}: {then[name]} -> {now[name]}" for name in then if name in now and now[name] != then[name]]


def _switch_progress(pipeline: Pipeline, kind: OperatorKind, handoff: HandoffManifest | None) -> Progress:
    """The live phase's first progress record: where the handoff left each input (batch -1)."""
    h, p = handoff, pipeline
    if h is None:
        right = {"right_complete_below": 0} if p.inputs.two else {}
        return Progress(batch_id=-1, complete_below=0, running_max_us=None, closed_us=None, held_version=None, **right)  # pyright: ignore[reportArgumentType]
    watermarks = {SOURCE_LABEL: h.final_watermark_us}
    right = {}
    if p.inputs.two:
        right = {
            "right_complete_below": h.right_source_version + 1,
            "right_running_max_us": h.right_max_event_time_us,
        }
        watermarks[RIGHT_LABEL] = watermark_after(h.right_max_event_time_us, p.delay_us)
    return Progress(
        batch_id=-1,
        complete_below=h.source_version + 1,
        running_max_us=h.backlog_max_event_time_us,
        closed_us=kind.closing(watermarks),
        held_version=None,
        state_layout=h.state_store_layout,
        state_version=h.state_store_version,
        **right,
    )
