"""The keyed aggregation (``keyed_aggregate``): per key, the monoid buffers of the pipeline's aggregations
(:mod:`phases._internal.operators.aggregation`), merged in the backlog, in catch-up increments and daily slices, and by
every live micro-batch; the sink holds one row per key, upserted live.

:class:`AggregationHandoff` is the handoff of the whole aggregation family (windows and sessions hand over
only their open windows and emit the closed ones)."""

from __future__ import annotations

import logging

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.definition import SOURCE_LABEL, WINDOW_END, KeyedAggregate, Pipeline
from phases._internal.errors import DefinitionError, SchemaChangeError
from phases._internal.handoff.manifest import HandoffManifest
from phases._internal.lateness import VERSION, watermark_after
from phases._internal.operators.aggregation import MAX_TS, ROWS, KeyedAggregationLogic, WindowedAggregationLogic
from phases._internal.operators.base import (
    HandoffCounts,
    OperatorKind,
    StoreStep,
    counted,
    observed,
    table_counts,
)
from phases._internal.records import CHANGE_TYPE
from phases._internal.runtime.session import adaptive_execution_off
from phases._internal.schema_changes import changes, way_out
from phases._internal.state.keyed_store import CombinedLayout, LiveStateStore
from phases._internal.storage import changelog, tables

log = logging.getLogger(__name__)


class AggregationHandoff:
    """The handoff of merged aggregation buffers ``state`` (one row per key, or per key and window).

    Keyed aggregation: the state is every key's buffers; the sink is overwritten with all keys. Windows and
    sessions: those whose end is <= the final watermark are emitted to the sink (an increment on top of
    ``base`` replaces just the windows that closed since ``base``, so a re-run never duplicates) and only
    the open ones are handed over."""

    def __init__(
        self,
        spark: SparkSession,
        logic: KeyedAggregationLogic,
        state: DataFrame,
        watermark_us: int | None,
        base: HandoffManifest | None,
        live: type[AggregationStoreStep],
    ):
        self.spark, self.logic, self.watermark, self.base, self.live = spark, logic, watermark_us, base, live
        self.windowed = isinstance(logic, WindowedAggregationLogic)
        # Cached: the state table, the store's version 1 and the sink are written from it. The store takes it as the
        # aggregation left it, hashed by key, without a second shuffle (KeyedStateStore's grouped route). Planned
        # without adaptive execution, as the state table's write is (:meth:`write_state`): the aggregation's reduce
        # stage caches the rows and writes the table in one pass.
        with adaptive_execution_off(spark):
            self.state = state.persist()
        self.rows_merged = 0
        self.keys = 0  # rows of the handed-over state

    def write_state(self, path: str) -> None:
        with adaptive_execution_off(self.spark):
            self._write_state(path)

    def _write_state(self, path: str) -> None:
        merged = self.state
        observation = None
        if self.windowed:
            self.rows_merged = int(merged.agg(F.sum(ROWS)).collect()[0][0] or 0)
            merged = merged.filter(~self.logic.closed(merged, self.watermark))  # pyright: ignore[reportAttributeAccessIssue]
        else:
            # Keyed: the state is every key; its key and row counts come from the write itself (no re-scan).
            merged, observation = counted(merged, "handoff state", merged=F.sum(ROWS))
        merged.write.format("delta").mode("errorifexists").save(path)
        self.state_path = path
        if observation is not None:
            metrics = observed(observation, lambda: table_counts(self.spark, path, merged=F.sum(ROWS)))
            self.keys, self.rows_merged = int(metrics["rows"]), int(metrics["merged"] or 0)

    def write_live_state(self, store_root: str) -> None:
        """Version 1 of the run's state store: the rows of the state table just written, from the cache."""
        self.live.open_store(self.spark, self.logic, store_root).write_start(self.live.start_rows(self._handed_over()))

    def _handed_over(self) -> DataFrame:
        """The state table's rows (cached): every key, or the windows still open."""
        return self.state.filter(~self.logic.closed(self.state, self.watermark)) if self.windowed else self.state  # pyright: ignore[reportAttributeAccessIssue]

    def write_sink(self, path: str) -> None:
        logic, spark = self.logic, self.spark
        state_table = self._handed_over()
        writer = None
        if not self.windowed and logic.pipeline.sink.mode == "changelog":
            # Every key's row, as the handoff's (batch -1): the changelog starts over from this handoff.
            changelog.ensure(spark, path, logic.output_schema)
            out = changelog.rows(logic.finalize(state_table), changelog.HANDOFF_BATCH)
            writer = out.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        elif not self.windowed:
            # Over changes, a key whose every row was taken back has no result (its buffers count none).
            out = logic.finalize(state_table.filter(F.col(ROWS) > 0) if logic.pipeline.reads_changes else state_table)
        else:
            self.keys = int(table_counts(spark, self.state_path)["rows"])
            out = logic.finalize(self.state.filter(logic.closed(self.state, self.watermark)))  # pyright: ignore[reportAttributeAccessIssue]
            lower = self.base.final_watermark_us if self.base is not None else None
            if lower is not None:
                where = f"{WINDOW_END} > timestamp_micros({lower})"
                if self.watermark is not None:
                    where += f" AND {WINDOW_END} <= timestamp_micros({self.watermark})"
                tables.ensure(spark, path, logic.output_schema, **tables.sink_properties(change_feed=True))
                writer = out.write.format("delta").mode("overwrite").option("replaceWhere", where)
        if writer is None:
            writer = out.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
            # a new table's properties (an existing one keeps its own)
            writer = writer.options(**tables.sink_properties(self.windowed or logic.pipeline.sink.change_feed))
        writer.save(path)

    def counts(self, spark: SparkSession, state_path: str, sink_path: str) -> HandoffCounts:
        # Keyed: the sink was overwritten with one row per state key. Windowed: count the emitted windows.
        sink_rows = table_counts(spark, sink_path)["rows"] if self.windowed else self.keys
        # Rows aggregated: a record counts once per window it falls into.
        before_rows, before_state_rows = 0, 0
        if self.base is not None:
            before_rows = self.base.aggregated_rows
            before_state_rows = int(table_counts(spark, self.base.state_path, merged=F.sum(ROWS))["merged"] or 0)
        aggregated = before_rows + (self.rows_merged - before_state_rows) // self.logic.windows_per_record
        return HandoffCounts(self.keys, aggregated, int(sink_rows))

    def close(self) -> None:
        self.state.unpersist()


ROWS_PER_FILE = 1_000_000  # changed keys per sink file a micro-batch writes


class AggregationStoreStep(StoreStep):
    """The aggregation family's live step on the store: buffers combined by the backlog's SQL."""

    logic: KeyedAggregationLogic

    def combine_sql(self) -> list[str]:
        """Per buffer, the stored one (``t``) combined with the batch's (``s``) by the backlog's SQL, as its type."""
        types = {f.name: f.dataType for f in self.logic.buffer_schema.fields}
        combined = self.logic.combine_set("t", "s")
        return [f"CAST(({combined[b]}) AS {types[b].simpleString()})" for b in self.logic.buffer_names]


class KeyedStoreStep(AggregationStoreStep):
    """Keyed aggregation with its live state in the run's state store (:mod:`phases._internal.state.keyed_store`): the
    batch's buffers merged per key, combined with each key's stored buffers by point lookups (the same SQL the
    backlog's merge and a MERGE's update use, run in the JVM), the store committed at the next version, then the
    changed keys, finalized, upserted into the sink (one MERGE, marked with the batch id).

    Replays: the version loaded is the one the previous progress record names, so a micro-batch replayed after
    a crash (after the store's commit, or after the sink's) computes the same rows again from the same version;
    a sink write already committed is skipped (its mark is read back)."""

    @classmethod
    def open_store(cls, spark: SparkSession, logic: KeyedAggregationLogic, store_root: str) -> LiveStateStore:
        """Per key its buffers and the newest source version that changed it (a changelog sink's
        ``_source_version``)."""
        version = T.StructField(changelog.SOURCE_VERSION, T.LongType())
        schema = T.StructType([*logic.buffer_schema.fields, version])
        values = [*logic.buffer_names, version.name]
        return LiveStateStore(spark, store_root, CombinedLayout(tuple(logic.keys), tuple(values)), schema)

    @staticmethod
    def start_rows(state: DataFrame) -> DataFrame:
        """Handed-over buffers: no live source version changed them yet."""
        return state.withColumn(changelog.SOURCE_VERSION, F.lit(None).cast("long"))

    def combine_sql(self) -> list[str]:
        """The buffers' combine, then the newest source version of the two."""
        newest = f"greatest(t.`{changelog.SOURCE_VERSION}`, s.`{changelog.SOURCE_VERSION}`)"
        return [*super().combine_sql(), newest]

    def has_work(self, records, closing_us) -> bool:
        return records[SOURCE_LABEL] is not None  # nothing closes

    def advance(self, spark, store, version, records, watermarks, closing_us, writes) -> int:
        logic, on_time = self.logic, records[SOURCE_LABEL]
        # Each record lifted into buffers goes to its key's store partition as it is: the store combines a key's
        # rows in turn (no aggregation, and no shuffle, before the one that routes keys to their partitions).
        lifted = logic.lift(on_time, carry=(VERSION,))  # pyright: ignore[reportArgumentType]
        partial = lifted.select(*logic.keys, *logic.buffer_names, F.col(VERSION).alias(changelog.SOURCE_VERSION))
        update = store.store.update(partial, self.combine_sql(), version)  # pyright: ignore[reportAttributeAccessIssue]
        try:
            # One file per ROWS_PER_FILE changed keys, not one per store partition.
            changed = update.rows.coalesce(max(1, -(-update.changed_keys // ROWS_PER_FILE)))
            if logic.pipeline.sink.mode == "changelog":
                out = changelog.rows(changed.select(*logic.finalize_columns(), changelog.SOURCE_VERSION), writes.batch)
                writes.append_owned(out, self.sink_path, "sink")
            else:
                new = update.new_keys  # collected from the update's tasks: read once
                write = tables.upsert_write(self.sink_path, logic.pipeline.sink.upsert_write, update.changed_keys, new)
                log.debug(
                    "sink %s: %d changed keys (%s new), written by %s", self.sink_path, update.changed_keys, new, write
                )
                rows = changed.select(*logic.finalize_columns(), *_gone(logic))
                writes.sink_upsert(
                    rows,
                    self.sink_path,
                    logic.keys,
                    "upsert",
                    write=write,
                    changed=update.changed_keys,
                )
        finally:
            update.release()
        return update.version


class AggregationPieces:
    """Pieces of an aggregation's state: the merged buffers of a version range, per key (and window)."""

    def __init__(self, logic: KeyedAggregationLogic):
        self.logic = logic

    @property
    def schema(self) -> T.StructType:
        return self.logic.buffer_schema

    @property
    def rows(self) -> Column:
        return F.sum(ROWS)

    def of(self, records: DataFrame) -> DataFrame:
        # Not sorted by key first: the merge is order-insensitive (commutative monoids), and Spark's hash
        # aggregation combines map-side before its shuffle, where a repartition by key shuffled every record.
        return self.logic.merge(self.logic.lift(records))

    def merge(self, pieces: DataFrame) -> DataFrame:
        return self.logic.merge_partials(pieces)


class KeyedAggregateKind(OperatorKind[KeyedAggregationLogic]):
    spec = KeyedAggregate
    state_event_time = MAX_TS
    per_record_watermarks = False  # lateness only; windows close on the final watermark
    logic_class = KeyedAggregationLogic
    step_class = KeyedStoreStep

    def logic(self, spark: SparkSession, pipeline: Pipeline, schemas: list[T.StructType]) -> KeyedAggregationLogic:
        return self.logic_class(pipeline, schemas[0])

    def state_schema(self, logic: KeyedAggregationLogic) -> T.StructType:
        return logic.buffer_schema

    def backlog(self, spark: SparkSession, pipeline: Pipeline, logic, inputs) -> AggregationHandoff:
        (tagged,) = inputs
        buffers = self.pieces(logic).of(tagged.prepared)
        return self.handoff(spark, pipeline, logic, buffers, tagged.running_max_us)

    def pieces(self, logic: KeyedAggregationLogic) -> AggregationPieces:
        return AggregationPieces(logic)

    def handoff(
        self,
        spark: SparkSession,
        pipeline: Pipeline,
        logic: KeyedAggregationLogic,
        state: DataFrame,
        max_us: int | None,
        base: HandoffManifest | None = None,
    ) -> AggregationHandoff:
        """The handoff of merged buffers: a whole backlog, an increment on top of ``base``, or slices."""
        watermark = watermark_after(max_us, pipeline.delay_us)
        return AggregationHandoff(spark, logic, state, watermark, base, live=self.step_class)

    def live_step(self, logic, state_path: str, sink_path: str, store_root: str):
        return self.step_class(logic, state_path, sink_path, store_root)

    def schema_change_sources(
        self, spark: SparkSession, pipeline: Pipeline, logic, records: T.StructType, state_path: str
    ) -> dict[str, str]:
        sources = _buffer_sources(logic)
        changed = changes(spark, state_path, logic.buffer_schema, sources)
        # Buffers of the very types the state table holds: its merge, combine and finalize are the ones that wrote
        # it, and the lift is a cast the buffer types' rules allow (KeyedAggregationLogic._buffers_for). Resolving
        # them again (about half of the schema check at a live start) proves nothing new.
        if changed is None or changed:
            _check_operator(spark, logic, records, pipeline.name, changed or [])
        return sources


def _gone(logic: KeyedAggregationLogic) -> list[Column]:
    """Over changes, whether a changed key's rows were all taken back: its sink row is deleted
    (:data:`phases._internal.storage.tables.GONE`)."""
    return [(F.col(ROWS) <= 0).alias(tables.GONE)] if logic.pipeline.reads_changes else []


def _buffer_sources(logic: KeyedAggregationLogic) -> dict[str, str]:
    """State and sink columns -> the source column each aggregation reads (for error messages)."""
    out: dict[str, str] = {}
    for agg in logic.aggregations:
        if agg.column is None:
            continue
        out[agg.name] = agg.column
        for name in logic.buffer_names:
            if name.startswith(f"{agg.name}__"):
                out[name] = agg.column
    return out


def _check_operator(
    spark: SparkSession, logic: KeyedAggregationLogic, records: T.StructType, pipeline: str, changed: list[str]
) -> None:
    """Resolves the operator's lift, merge, pairwise combine and finalize over ``records`` (no data read), so
    a source type the operator's expressions cannot take is found before any micro-batch runs."""
    try:
        if logic.pipeline.reads_changes and CHANGE_TYPE not in records.fieldNames():  # what the change feed adds
            records = T.StructType([*records.fields, T.StructField(CHANGE_TYPE, T.StringType())])
        empty = spark_internals.empty_frame(spark, records)
        state = logic.merge(logic.lift(empty))
        _ = logic.finalize(state).schema
        pair = state.alias("t").crossJoin(state.alias("s"))
        _ = pair.select(*[F.expr(sql).alias(name) for name, sql in logic.combine_set("t", "s").items()]).schema
    except (AnalysisException, DefinitionError) as exc:
        what = "; ".join(changed) if changed else records.simpleString()
        raise SchemaChangeError(
            f"pipeline {pipeline!r}: the source's schema changed ({what}) and its operator cannot take it: "
            f"{str(exc).splitlines()[0][:300]}. {way_out(pipeline)}"
        ) from exc
