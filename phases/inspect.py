"""What an orchestrator reads of a pipeline without running it: its handoff, how far its live phase got, what waits
in its sources, and figures of its tables.

The Dagster layer (``phases_dagster``) uses only these names and those of :mod:`phases`; a user's own orchestration
(Airflow, a cron job, a plain script) uses the same. Functions without a ``spark`` parameter read with delta-rs and
PyArrow (no JVM): a sensor or a health check can call them every few seconds. ``where`` is a
:class:`phases.Placement`: the definition as declared and where it runs, made once by :func:`phases.place`, which
reads the redeploy log (``spark`` None: with delta-rs) and names the serving generation. A function that needs only
the declaration takes the :class:`phases.Pipeline`.

The handoff: :func:`latest_handoff`, :func:`newest_handoff_row`, :func:`check_handoff_matches`.

The live phase: :func:`live_started`, :func:`latest_live_progress`, :func:`applied_position`, :func:`unapplied`,
:func:`state_store_folder`, :class:`LiveMeter` and :class:`LiveReport` (its figures while it runs).

Sources: :func:`source_heads` (:class:`SourceHead`), :func:`input_lags` (:class:`InputLag`).

Tables: :func:`table_exists`, :func:`table_version`, :func:`table_stats` (:class:`TableStats`, :class:`Column`),
:func:`value_counts`, :func:`quarantined_rows`, :func:`folder_bytes`.

The backlog: :func:`reporting_progress` (:class:`BacklogProgress`), :class:`SliceRecord`; the operator:
:func:`state_event_time`; the lateness rule: :func:`watermark_after`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from phases._internal.backlog.progress import Snapshot as BacklogProgress
from phases._internal.backlog.progress import reported as reporting_progress
from phases._internal.backlog.slices import SliceRecord
from phases._internal.coordination import progress_log
from phases._internal.definition import Pipeline
from phases._internal.deployment import Placement, place
from phases._internal.handoff import live_folders, manifest
from phases._internal.handoff.manifest import HandoffManifest
from phases._internal.lateness import watermark_after
from phases._internal.live.report import LiveMeter, LiveReport
from phases._internal.operators.registry import kind_of
from phases._internal.sources.head import SourceHead, source_heads
from phases._internal.sources.kafka import ChunkPlan
from phases._internal.sources.lag import InputLag, Unapplied, input_lags
from phases._internal.sources.lag import unapplied as _unapplied
from phases._internal.storage import fs, quarantine, tables
from phases._internal.storage import table_stats as _table_stats
from phases._internal.storage.table_stats import Column, TableStats
from phases._internal.topics import sink as topic_sinks
from phases._internal.topics.reading import TopicFigures, topic_figures

__all__ = [
    "AppliedPosition",
    "BacklogProgress",
    "Column",
    "HandoffManifest",
    "HandoffPosition",
    "InputLag",
    "LiveMeter",
    "LiveReport",
    "SliceRecord",
    "SourceHead",
    "TopicFigures",
    "TableStats",
    "Unapplied",
    "applied_position",
    "check_handoff_matches",
    "folder_bytes",
    "input_lags",
    "latest_handoff",
    "latest_live_progress",
    "live_started",
    "newest_handoff_row",
    "quarantined_rows",
    "read_placed_topic",
    "reporting_progress",
    "source_heads",
    "state_event_time",
    "state_store_folder",
    "result_topic",
    "table_exists",
    "table_stats",
    "table_version",
    "unapplied",
    "value_counts",
    "watermark_after",
]


# --- the handoff and the generation that serves ----------------------------------------------------------------------


def latest_handoff(spark: SparkSession, where: Placement, manifest_id: str | None = None) -> HandoffManifest:
    """The pipeline's newest handoff manifest (or the one with ``manifest_id``). Raises
    :class:`phases._internal.errors.ManifestError` when there is none, it is partial, or a newer one superseded it."""
    return manifest.latest(spark, where.manifests, where.name, manifest_id)


def newest_handoff_row(where: Placement) -> dict | None:
    """The pipeline's newest manifest as the row its manifests table holds (the fields of :class:`HandoffManifest`),
    read with delta-rs; None when there is none."""
    rows = _table_stats.rows(where.manifests, where=("pipeline", where.name)) or []
    return max(rows, key=lambda row: row["created_at_us"], default=None)


def check_handoff_matches(spark: SparkSession, handoff: HandoffManifest, where: Placement) -> None:
    """Raises :class:`phases._internal.errors.ManifestError` saying what differs between the handoff and the
    placed definition (its fingerprint, unless the redeploy log records the change as an amendment of the handoff;
    the state's schema; the state table)."""
    manifest.check_matches(spark, handoff, where, where.redeploys.amended)


# --- the live phase ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppliedPosition:
    """How far the live phase of a handoff has applied its source: every version below ``version + 1`` and, for a
    Kafka source, the end ``offsets`` per partition. ``recorded``: from the live phase's own progress record (else
    from the handoff: the live phase has not recorded its switch yet)."""

    version: int
    offsets: dict[int, int] | None
    recorded: bool


def live_started(spark: SparkSession, where: Placement, manifest_id: str) -> bool:
    """True once the live phase of ``manifest_id`` has recorded its switch (its first progress record)."""
    return live_folders.live_started(spark, where, manifest_id)


def latest_live_progress(where: Placement, manifest_id: str) -> tuple[int, dict] | None:
    """(micro-batch id, progress record) of the live phase of ``manifest_id``'s newest record, without Spark; None
    before its first."""
    return progress_log.latest_without_spark(where.live_run(manifest_id))


class HandoffPosition(Protocol):
    """Where a handoff left the source: a :class:`HandoffManifest`, or an orchestrator's record of one."""

    manifest_id: str
    source_version: int
    source_position: str | None


def applied_position(where: Placement, handoff: HandoffPosition) -> AppliedPosition:
    """What the live phase of ``handoff`` has applied, from its newest progress record or, before its first, from the
    handoff (its source version, and a Kafka source's chunk plan)."""
    record = latest_live_progress(where, handoff.manifest_id)
    if record is not None:
        offsets = record[1].get("source_offsets")
        return AppliedPosition(
            int(record[1]["complete_below"]) - 1,
            {int(p): int(o) for p, o in offsets.items()} if offsets else None,
            True,
        )
    offsets = ChunkPlan.from_json(handoff.source_position).end if handoff.source_position else None
    return AppliedPosition(handoff.source_version, offsets, False)


def unapplied(where: Placement, applied: AppliedPosition) -> Unapplied:
    """How much of the pipeline's source is after ``applied``, and since when the oldest of it waits."""
    return _unapplied(where, applied_version=applied.version, applied_offsets=applied.offsets)


def state_store_folder(where: Placement, manifest_id: str, layout: str) -> str:
    """The folder of the live phase's state store of ``layout`` (one per state layout of the run)."""
    return f"{where.state_store(manifest_id)}/{layout}"


# --- tables ---------------------------------------------------------------------------------------------------------


def table_exists(spark: SparkSession, path: str) -> bool:
    """True when ``path`` holds a Delta table with at least one commit."""
    return tables.exists(spark, path)


def table_version(path: str) -> int | None:
    """The table's newest commit version, without Spark; None when ``path`` holds no Delta table."""
    return _table_stats.head_version(path)


def table_stats(path: str, *, max_of: tuple[str, ...] = ()) -> TableStats | None:
    """The table's version, schema, rows, files and bytes as its log records them (and the greatest value of each
    column in ``max_of``), without Spark; None when ``path`` holds no Delta table."""
    return _table_stats.stats(path, max_of=max_of)


def value_counts(path: str, column: str, *, where: tuple[str, str] | None = None) -> dict[str, int] | None:
    """How many rows hold each value of the string ``column`` (``where``: only rows whose column ``where[0]`` equals
    ``where[1]``), without Spark; None when ``path`` holds no Delta table."""
    return _table_stats.value_counts(path, column, where=where)


def quarantined_rows(spark: SparkSession, where: Placement, phase: str | None = None) -> int:
    """The rows the pipeline quarantined (``phase``: ``backlog`` or ``live`` only)."""
    return quarantine.count(spark, where.quarantine, where.name, phase)


def folder_bytes(spark: SparkSession, path: str) -> int:
    """The bytes of every file under ``path`` (0 when it does not exist)."""
    return fs.size_bytes(spark, path)


# --- the operator --------------------------------------------------------------------------------------------------


def state_event_time(pipeline: Pipeline) -> str | None:
    """The state column holding each key's greatest event time, for operators whose state keeps one."""
    return kind_of(pipeline).state_event_time


def result_topic(where: Placement, *, timeout_s: float = 30.0) -> TopicFigures | None:
    """A topic sink's figures (None for a Delta sink), of the one topic consumers read, whichever generation serves:
    its partitions' last stable offsets and the newest committed write's marker: the handoff, the last micro-batch
    published (-1: the handoff's results, or a redeploy's swap) and the records the handoff's writes published in
    all. Read without a producer: no writer is fenced."""
    from phases._internal.definition import KafkaSink

    sink = where.definition.sink
    if not isinstance(sink, KafkaSink):
        return None
    return topic_figures(
        where.sink_brokers,
        where.topic(),
        where.name,
        client_config=sink.client_options,
        timeout_s=timeout_s,
    )


def read_topic(
    spark: SparkSession, pipeline: Pipeline, *, with_change_columns: bool = False, timeout_s: float = 60.0
) -> DataFrame:
    """What a ``read_committed`` consumer of the pipeline's result topic reads, folded as its mode says, with the
    columns and types of the engine's table of the results: for a keyed aggregation the current row per key, for the
    other operators every result once (``with_change_columns`` keeps a changelog's ``_batch_id``,
    ``_source_version`` and ``_op``). The topic is that of the generation that serves the pipeline (after a redeploy,
    that generation's own topic). For reconciliation and tests: it reads the whole topic through the driver. A
    pipeline placed elsewhere than declared: :func:`read_placed_topic`."""
    return read_placed_topic(
        spark, place(None, pipeline, strict=False), with_change_columns=with_change_columns, timeout_s=timeout_s
    )


def read_placed_topic(
    spark: SparkSession, where: Placement, *, with_change_columns: bool = False, timeout_s: float = 60.0
) -> DataFrame:
    """:func:`read_topic` of the result topic of the placement's generation."""
    return topic_sinks.read_topic(spark, where, with_change_columns=with_change_columns, timeout_s=timeout_s)
