"""What every operator kind is and does, in both phases: :class:`OperatorKind`.

A kind says what it supports (two inputs, backlog increments, window-keyed state, millisecond delays),
builds its logic for the sources' schemas, hands over its backlog (:class:`HandoffWrite`: the state table and
the sink, written by :meth:`phases._internal.backlog.runner.BacklogRunner.write_handoff`) and gives the live phase its
per-micro-batch step (:class:`LiveStep`). The drivers (:mod:`phases._internal.backlog.runner`,
:mod:`phases._internal.live.runner`, :mod:`phases._internal.live.micro_batch`) know no kind by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.definition import SOURCE_LABEL
from phases._internal.errors import PhaseStateError
from phases._internal.placement import Placement
from phases._internal.sources.reader import SourceReader
from phases._internal.state.keyed_store import LiveStateStore, StatePosition
from phases._internal.steps.end_of_stream import prepared_schema

if TYPE_CHECKING:
    from phases._internal.definition import OperatorModel, Pipeline
    from phases._internal.handoff.manifest import HandoffManifest
    from phases._internal.storage.live_writes import BatchWrites
    from phases._internal.tagging import TaggedRange

Watermarks = dict[str, int | None]  # per live input label (``Input.label``: the source, the right source)


@dataclass(frozen=True)
class HandoffCounts:
    state_rows: int  # rows of the handed-over state table
    aggregated: int  # on-time records the operator took in versions 0..V (a record once)
    sink_rows: int  # rows in the sink after the handoff


def counted(df: DataFrame, name: str, **sums: Column) -> tuple[DataFrame, Observation]:
    """``df`` observed: its row count (``rows``) and the given sums arrive with the action that writes it,
    instead of a second scan of what was written (``observation.get`` after the action)."""
    observation = Observation(name)
    metrics = [F.count(F.lit(1)).alias("rows"), *(column.alias(alias) for alias, column in sums.items())]
    return df.observe(observation, *metrics), observation


def table_counts(spark: SparkSession, path: str, **sums: Column) -> dict[str, Any]:
    """The row count (``rows``) and the given sums of the Delta table at ``path``, by a scan."""
    metrics = [F.count(F.lit(1)).alias("rows"), *(column.alias(alias) for alias, column in sums.items())]
    return spark.read.format("delta").load(path).agg(*metrics).collect()[0].asDict()


def observed(observation: Observation, scan: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The metrics :func:`counted` observed, or ``scan()`` when the action ran without the observed node:
    Spark's adaptive execution replaces a subtree it finds empty, and the metrics with it (an empty row)."""
    return observation.get if spark_internals.observation_has_row(observation) else scan()


class HandoffWrite(Protocol):
    """One backlog's writes, in the order :meth:`phases._internal.backlog.runner.BacklogRunner.write_handoff` calls
    them."""

    def write_state(self, path: str) -> None:
        """Writes the state to hand over to a fresh table at ``path``."""

    def write_sink(self, path: str) -> None:
        """Writes the backlog's results to the sink (a re-run replaces, never duplicates)."""

    def write_live_state(self, store_root: str) -> None:
        """Writes the live phase's starting state (version 1 of the run's state store under ``store_root``: the rows of
        the state table just written, from the handoff's cache rather than read back), so that the switch replays
        nothing."""

    def counts(self, spark: SparkSession, state_path: str, sink_path: str) -> HandoffCounts: ...

    def close(self) -> None:
        """Releases what the writes cached (called also when a write failed)."""


class Pieces(Protocol):
    """A state built from pieces (catch-up increments, daily slices): a kind whose state is a mergeable aggregate.
    A piece is one row per state key; pieces of disjoint version ranges merge into the state of their union."""

    @property
    def schema(self) -> T.StructType:  # pyright: ignore[reportReturnType]
        """A piece's columns (the state's)."""

    @property
    def rows(self) -> Column:  # pyright: ignore[reportReturnType]
        """The aggregate of a piece's rows that counts the records it took."""

    def of(self, records: DataFrame) -> DataFrame:  # pyright: ignore[reportReturnType]
        """The piece of a version range's on-time records (as the operator sees them)."""

    def merge(self, pieces: DataFrame) -> DataFrame:  # pyright: ignore[reportReturnType]
        """Pieces (rows of :attr:`schema`, several per key) merged into one row per key."""


class LiveStep(Protocol):
    """One micro-batch of the live phase, after validation and lateness: ``records`` are each input's
    on-time records of the complete versions (None: none), ``closing_us`` the watermark that closes
    windows, sessions and timers after the batch. Every write goes through ``writes``
    (:class:`~phases._internal.storage.live_writes.BatchWrites`: idempotent per micro-batch), and what the sink gets is
    computed from the store version the batch loads, so a replayed batch writes exactly what the first did.

    Every kind's live state is in the run's state store (:class:`StoreStep`; the handoff's state table stays as
    written): a step gets the position the previous progress record names (``state``; None: the handoff's state,
    not in the store yet) and returns the position after the batch, which the batch's progress record names."""

    def apply_inputs(
        self,
        spark: SparkSession,
        records: dict[str, DataFrame | None],
        watermarks: Watermarks,
        closing_us: int | None,
        writes: BatchWrites,
        state: StatePosition | None = None,
    ) -> StatePosition | None: ...

    def release(self) -> int:
        """Unloads the step's state store from the executors once the query has stopped (its newest snapshot
        uploaded first); returns the store partitions unloaded."""
        ...


Logic = TypeVar("Logic")  # a kind's logic object: schemas, lift/merge/finalize or its pass


class OperatorKind(ABC, Generic[Logic]):
    """Base of the operator kinds (one module each under :mod:`phases._internal.operators`).

    A kind runs the operator its definition model declares (:attr:`spec`); the model's shape flags (two inputs,
    windows, millisecond delays, mergeable state) are the kind's too. What the kind adds is declared here:
    whether it reads each record's W(v), how it builds its logic, passes over the backlog, hands a merged state
    over (increments), steps through a live micro-batch and takes up a source's schema change."""

    spec: ClassVar[type[OperatorModel]]  # the definition model of the operator this kind runs
    per_record_watermarks: ClassVar[bool] = True  # reads each record's W(v) (``_watermark_us``): timers
    state_event_time: ClassVar[str | None] = None  # the state column of each row's greatest event time, if any

    @property
    def name(self) -> str:
        """The definition's ``operator.kind``."""
        return self.spec.model_fields["kind"].default

    @property
    def two_inputs(self) -> bool:
        return self.spec.two_inputs

    @property
    def windowed(self) -> bool:
        """State and sink rows are identified by the window bounds too."""
        return self.spec.windowed

    @property
    def needs_ms_delay(self) -> bool:
        return self.spec.needs_ms_delay

    @property
    def supports_increments(self) -> bool:
        """Catch-up increments, daily slices, backlog checkpoints: the state is a mergeable aggregate."""
        return self.spec.takes_increments

    @property
    def no_increments_because(self) -> str:
        """Why the kind takes no increments, for the error."""
        return self.spec.no_increments_because

    @abstractmethod
    def logic(self, spark: SparkSession, pipeline: Pipeline, schemas: list[T.StructType]) -> Logic:
        """The operator's logic for its inputs' record schemas (as the operator sees them)."""

    def logic_for(self, spark: SparkSession, where: Placement, readers: Iterable[SourceReader]) -> Logic:
        """The logic for the inputs ``readers`` read (their current schemas, after the pipeline's record steps)."""
        schemas = [prepared_schema(spark, where, r.schema()) for r in readers]
        return self.logic(spark, where.definition, schemas)

    def state_schema(self, logic: Logic) -> T.StructType:
        return logic.state_schema  # pyright: ignore[reportAttributeAccessIssue]

    @abstractmethod
    def backlog(self, spark: SparkSession, pipeline: Pipeline, logic: Logic, inputs: list[TaggedRange]) -> HandoffWrite:
        """The backlog pass over the inputs' tagged versions 0..V (one per input)."""

    def pieces(self, logic: Logic) -> Pieces:
        """How pieces of the state are made and merged: only a kind whose :attr:`supports_increments` says so."""
        raise PhaseStateError(f"operator kind {self.name!r} takes no increments: {self.no_increments_because}")

    def handoff(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        logic: Logic,
        state: DataFrame,
        max_us: int | None,
        base: HandoffManifest | None = None,
    ) -> HandoffWrite:
        """The handoff of a merged state built from pieces (an increment on top of ``base``, or slices): only a
        kind whose :attr:`supports_increments` says so."""
        raise PhaseStateError(f"operator kind {self.name!r} takes no increments: {self.no_increments_because}")

    @abstractmethod
    def live_step(self, logic: Logic, state_path: str, sink_path: str, store_root: str) -> LiveStep:
        """The live phase's per-micro-batch step over the state (the handoff's table; the run's state stores under
        ``store_root``) and the sink."""

    def closing(self, watermarks: Watermarks) -> int | None:
        """The watermark that closes windows, sessions and timers: the input's own."""
        return watermarks[SOURCE_LABEL]

    def schema_change_sources(
        self, spark: SparkSession, pipeline: Pipeline, logic: Logic, records: T.StructType, state_path: str
    ) -> dict[str, str]:
        """Checks the operator's state against the source's current schema (``records``: as the operator sees
        them); raises SchemaChangeError when it cannot take a change. Returns state/sink column -> source
        column for the widening of those tables (none: their columns widen like the source's)."""
        return {}


class StoreStep:
    """A live step whose state is in the run's state store: how the store is laid out (:meth:`open_store`) and how the
    handoff's state table becomes its version 1 (:meth:`start_rows`), for the backlog's write ahead of the switch
    and for a live start that finds no version 1 (a streaming-only run).

    :meth:`apply_inputs` is the one micro-batch every kind runs: when the batch changes nothing (:meth:`has_work`),
    the position stays; else the store is opened, the version the position names is loaded (version 1 written first
    when missing), and the kind's :meth:`advance` moves the store on from it and writes the sink."""

    def __init__(self, logic, state_path: str, sink_path: str, store_root: str):
        self.logic, self.state_path, self.sink_path, self.store_root = logic, state_path, sink_path, store_root
        self._store: LiveStateStore | None = None

    @classmethod
    def open_store(cls, spark: SparkSession, logic, store_root: str) -> LiveStateStore:
        raise NotImplementedError

    @staticmethod
    def start_rows(state: DataFrame) -> DataFrame:
        """The handoff's state rows as the store's rows."""
        raise NotImplementedError

    def settled(self, rows: DataFrame, watermarks: Watermarks) -> DataFrame:
        """The store's rows as the backlog would hand them over at ``watermarks`` (a catch-up increment's state table):
        the same rows, unless the kind keeps rows a backlog would have dropped (:class:`IntervalJoinStoreStep`)."""
        return rows

    def release(self) -> int:
        """Unloads the store this step opened, if any (:meth:`phases._internal.state.keyed_store.StoreBase.unload`);
        the next micro-batch opens it again."""
        store, self._store = self._store, None
        return store.store.unload() if store is not None else 0

    def store(self, spark: SparkSession) -> LiveStateStore:
        if self._store is None:
            self._store = self.open_store(spark, self.logic, self.store_root)
        return self._store

    def start_version(self, spark: SparkSession, state: StatePosition | None) -> int:
        """The version this micro-batch loads (the handoff's state written as version 1 first, when missing)."""
        return self.store(spark).version_for(
            state, lambda: self.start_rows(spark.read.format("delta").load(self.state_path))
        )

    def apply_inputs(
        self,
        spark: SparkSession,
        records: dict[str, DataFrame | None],
        watermarks: Watermarks,
        closing_us: int | None,
        writes: BatchWrites,
        state: StatePosition | None = None,
    ) -> StatePosition | None:
        if not self.has_work(records, closing_us):
            return state
        store = self.store(spark)
        version = self.start_version(spark, state)
        return StatePosition(store.layout, self.advance(spark, store, version, records, watermarks, closing_us, writes))

    def has_work(self, records: dict[str, DataFrame | None], closing_us: int | None) -> bool:
        """Whether the micro-batch can change the state or the sink: records of an input, or a watermark that closes
        windows, sessions or timers."""
        return any(df is not None for df in records.values()) or closing_us is not None

    def advance(
        self,
        spark: SparkSession,
        store: LiveStateStore,
        version: int,
        records: dict[str, DataFrame | None],
        watermarks: Watermarks,
        closing_us: int | None,
        writes: BatchWrites,
    ) -> int:
        """The kind's part of a micro-batch: the store moved on from ``version`` (one update, or a lookup and a
        replace) and the sink written through ``writes``; returns the version the store holds after it."""
        raise NotImplementedError


class ClosingStoreStep(StoreStep):
    """The kinds whose state closes at the watermark (windows, sessions, co-groups): the batch's rows combined into
    the store and the rows the closing watermark passed removed in one update (an ordered or a session store), and
    those rows written to the sink. A subclass gives the batch's rows, ``combine_sql()`` (per value column, the stored
    value ``t`` combined with the batch's ``s``) and how the closed rows are written."""

    def batch_rows(self, spark: SparkSession, records: dict[str, DataFrame | None]) -> DataFrame | None:
        """The batch's records as the store's rows (None: the batch has none)."""
        raise NotImplementedError

    def write_closed(self, closed: DataFrame, count: int, writes: BatchWrites) -> None:
        """Writes the ``count`` rows the update closed (the store's columns) to the sink."""
        raise NotImplementedError

    def advance(self, spark, store, version, records, watermarks, closing_us, writes) -> int:
        rows = self.batch_rows(spark, records)
        if rows is None:
            rows = spark_internals.empty_frame(spark, store.schema)
        update = store.store.update_and_close(rows.select(*store.schema.names), self.combine_sql(), version, closing_us)  # pyright: ignore[reportAttributeAccessIssue]
        try:
            if update.changed_keys:
                self.write_closed(update.rows, update.changed_keys, writes)
        finally:
            update.release()
        return update.version
