"""What a pipeline may do with another pipeline's results read as changes: a keyed aggregation's results
(:class:`phases._internal.definition.PipelineSource` over an upsert sink), where each upstream write replaces a key's
row, so that every change is the old row taken back and the new one added.

Such a source is the upstream's current table, kept up to date. What a downstream computes over it must take back what
a change replaces: a keyed aggregation of counts, sums and averages does (each taken-back row counts -1); a minimum,
a maximum or a reduce over rows no longer there cannot, nor can a window or a session that has already emitted its
result. Record steps must treat a row the same way when it is taken back as when it was added: a filter or a derived
column does; a partition operator (user code over a batch of rows) and an enrichment (a lookup whose table changes)
need not. Lateness does not apply: a change corrects the current table, it is never late; nor does ``max_future``
(it compares a row with its version's commit time, which differs between a row's addition and its taking back)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

DEFAULT_MAX_FUTURE = timedelta(days=1)  # a pipeline's max_future unless it says otherwise

RETRACTABLE = ("count", "sum", "avg")  # aggregation kinds that take a row back exactly
ROW_STEPS = ("filter", "derive")  # record steps that treat a row alike whether it is added or taken back


def changes_problem(pipeline: Any) -> str | None:
    """Why ``pipeline`` (a :class:`phases._internal.definition.Pipeline` being validated) cannot consume the changes
    it reads (None: it can, or it reads none)."""
    right = getattr(pipeline.operator, "right", None)
    if getattr(right, "reads_changes", False):
        return (
            f"operator.right reads the changes of pipeline {right.upstream.name!r} (a keyed aggregation): a "  # pyright: ignore[reportOptionalMemberAccess]
            f"{pipeline.operator.kind} cannot take back a row it has joined. Read the upstream's results as the "
            "pipeline's source, with a keyed_aggregate operator"
        )
    if not getattr(pipeline.source, "reads_changes", False):
        return None
    upstream = pipeline.source.upstream.name  # pyright: ignore[reportAttributeAccessIssue]
    reading = f"source reads the changes of pipeline {upstream!r} (a keyed aggregation: each change takes a row back)"
    if pipeline.operator.kind != "keyed_aggregate":
        return (
            f"{reading}; a {pipeline.operator.kind} cannot take back a result it has emitted. Use a keyed_aggregate "
            f"operator with aggregations of kind {list(RETRACTABLE)}"
        )
    kept = [f"{a.name} ({a.kind.value})" for a in pipeline.operator.aggregations if a.kind.value not in RETRACTABLE]  # pyright: ignore[reportAttributeAccessIssue]
    if kept:
        return (
            f"{reading}; aggregations {kept} cannot take a row back (a minimum, a maximum or a reduce would need rows "
            f"no longer kept). Over changes, aggregations are of kind {list(RETRACTABLE)}"
        )
    steps = [f"steps[{i}] ({s.kind})" for i, s in enumerate(pipeline.steps) if s.kind not in ROW_STEPS]
    if steps:
        return (
            f"{reading}; {steps} may treat a row differently when it is taken back than when it was added. Over "
            f"changes, record steps are of kind {list(ROW_STEPS)}"
        )
    if pipeline.enrich is not None or pipeline.end_of_stream:
        return (
            f"{reading}; enrich and end_of_stream look rows up in a table that changes between a row's addition and "
            "its taking back. Leave them out"
        )
    if pipeline.max_future not in (None, DEFAULT_MAX_FUTURE):
        return (
            f"{reading}; max_future compares a row with its version's commit time, which differs between a row's "
            "addition and its taking back. Leave it at its default (not applied over changes) or set None; "
            "min_event_time, which looks only at the row, may stay"
        )
    if pipeline.sink.kind != "delta" or pipeline.sink.mode != "upsert":
        return (
            f"{reading}; a key whose rows are all taken back is deleted from the sink, which a {pipeline.sink.kind} "
            f"sink in {pipeline.sink.mode!r} mode does not record. Use a DeltaSink in mode 'upsert'"
        )
    return None
