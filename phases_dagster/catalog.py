"""Catalog metadata of a pipeline's tables in Dagster's standard keys: what the asset pages show.

``dagster/table_name`` and ``dagster/uri`` name the table, ``dagster/column_schema`` fills the Columns tab (from
the Delta schema), ``dagster/row_count`` is plotted; owners, tags, kinds and the code version (the pipeline
fingerprint: a new one means the state must be rebuilt) come from the pipeline definition. Everything here reads
Delta logs with delta-rs: no Spark.
"""

from datetime import datetime
from pathlib import Path

import dagster as dg

from phases import PhasesError, Pipeline, Placement, inspect


def spec_kwargs(pipeline: Pipeline, description: str, *, kinds: set[str] | None = None) -> dict:
    """The AssetSpec fields every asset of ``pipeline`` shares."""
    about = f"{description}\n\n{pipeline.description}" if pipeline.description else description
    return {
        "group_name": pipeline.name,
        "description": about,
        "owners": list(pipeline.owners),
        "tags": dict(pipeline.tags),
        "kinds": kinds or {"delta"},
    }


def uri(path: str) -> dg.MetadataValue:
    """A local folder as a path entry; anything with a scheme as a URL."""
    return dg.MetadataValue.url(path) if "://" in path else dg.MetadataValue.path(str(Path(path)))


def definition_metadata(pipeline: Pipeline, path: str, table: str) -> dict:
    """Metadata known from the definition alone (shown before the first materialization)."""
    return {"dagster/table_name": f"{pipeline.name}.{table}", "dagster/uri": uri(path)}


def column_schema(columns: tuple[inspect.Column, ...]) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=c.name,
                type=c.type,
                constraints=dg.TableColumnConstraints(nullable=c.nullable),
            )
            for c in columns
        ]
    )


def table_metadata(pipeline: Pipeline, path: str, table: str) -> dict:
    """Standard metadata of a Delta table as its log says now: name, URI, schema, row count, version."""
    meta = definition_metadata(pipeline, path, table)
    stats = inspect.table_stats(path)
    if stats is None:
        return {**meta, "delta_version": "none (no table yet)"}
    meta["dagster/column_schema"] = column_schema(stats.columns)
    if stats.rows is not None:
        meta["dagster/row_count"] = stats.rows
    meta["delta_version"] = str(stats.version)  # an id, not a measurement: text, so it is not plotted
    meta["files"] = stats.files
    if stats.commit_time is not None:
        meta["committed_at"] = dg.MetadataValue.timestamp(stats.commit_time)
    return meta


def sink_metadata(where: Placement) -> dict:
    """The sink's metadata: its Delta table's, and a topic sink's topic (its name, the partitions' last stable
    offsets, the records the handoff's writes published and the last micro-batch published, -1 for the handoff's
    results). A topic that cannot be read is said so, not raised: the run's own steps raise for a broken sink."""
    meta = table_metadata(where.definition, where.sink_path, "sink")
    try:
        topic = inspect.result_topic(where, timeout_s=10)
    except PhasesError as exc:
        return {**meta, "topic_error": str(exc)}
    if topic is None:
        return meta
    meta["topic"] = topic.topic
    meta["topic_end_offsets"] = dg.MetadataValue.json({str(p): o for p, o in topic.end_offsets.items()})
    if topic.marker is not None:
        meta["topic_handoff"] = topic.marker.handoff
        meta["topic_last_batch"] = topic.marker.batch
        if topic.marker.records is not None:
            meta["topic_records"] = topic.marker.records
    return meta


def quarantine_metadata(placed: Placement) -> dict:
    """The quarantine by reason and by phase (the pipeline's rows; read from those columns alone, no Spark)."""
    where = ("pipeline", placed.name)
    reasons = inspect.value_counts(placed.quarantine, "reason", where=where)
    if reasons is None:
        return {}
    phases = inspect.value_counts(placed.quarantine, "phase", where=where) or {}
    ordered = dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return {
        "rows_by_reason": dg.MetadataValue.json(ordered),
        "late_rows": sum(n for reason, n in reasons.items() if reason.startswith("late")),
        "backlog_rows": phases.get("backlog", 0),
        "live_rows": phases.get("live", 0),
    }


def timestamp(at: datetime | None) -> dg.MetadataValue:
    return dg.MetadataValue.timestamp(at) if at is not None else dg.MetadataValue.text("none")


def head_metadata(head: inspect.SourceHead) -> dict:
    """A source observation: where its head is (the data version) and its newest event time."""
    if head.error is not None:
        return {"input": head.label, "dagster/uri": uri(head.location), "error": head.error}
    meta: dict = {"input": head.label, "dagster/uri": uri(head.location), "position": head.position}
    if head.rows is not None:
        meta["dagster/row_count"] = head.rows
    meta["max_event_time"] = timestamp(head.max_event_time)
    meta["max_event_time_basis"] = head.basis
    if head.end_offsets is not None:
        meta["end_offsets"] = dg.MetadataValue.json({str(p): o for p, o in sorted(head.end_offsets.items())})
    return meta
