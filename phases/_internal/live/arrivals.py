"""What a Kafka input's arrival chunks were, in both phases: the backlog's chunk plans and each live micro-batch's
offsets (:func:`arrival_chunks`), the arrival order W(chunk) was computed over."""

from __future__ import annotations

from phases._internal.coordination.progress_log import ProgressLog
from phases._internal.definition import SOURCE_LABEL, DeltaSource, Pipeline
from phases._internal.errors import PhaseStateError
from phases._internal.handoff.manifest import HandoffManifest
from phases._internal.live.plan import Progress
from phases._internal.sources.kafka import ChunkPlan


def arrival_chunks(
    pipeline: Pipeline, handoff: HandoffManifest | None, log: ProgressLog, label: str = SOURCE_LABEL
) -> dict[int, dict[int, tuple[int, int]]]:
    """A Kafka input's arrival-chunk log (``label``: the source's, or a two-input operator's right input's):
    chunk -> {partition: (from offset, until offset)}, for the backlog's chunks (the manifest's plan) and the
    live micro-batches still in the progress log (the newest
    :data:`phases._internal.coordination.progress_log.RETAIN`). What W(chunk) was computed over: a reference replays
    exactly these."""
    spec = next(i.spec for i in pipeline.inputs if i.label == label)
    if isinstance(spec, DeltaSource):
        raise PhaseStateError(
            f"pipeline {pipeline.name!r}: input {label or 'source'!r} reads a Delta table: its arrival order "
            "is versions"
        )
    chunks: dict[int, dict[int, tuple[int, int]]] = {}
    previous: dict[int, int] = {}
    if handoff is not None:
        plan = ChunkPlan.from_json(handoff.positions[label])  # pyright: ignore[reportArgumentType]
        # The backlog's plan and those of its catch-up increments; a hybrid source's first plan is its archive's
        # handoff, whose chunks are the archive's versions, not offset ranges.
        segments = plan.segments if spec.kind == "kafka" else plan.segments[1:]
        for segment in segments:
            for chunk in range(segment.first, segment.last + 1):
                lo, hi = segment.offsets(chunk, chunk)
                chunks[chunk] = {p: (lo[p], hi[p]) for p in segment.end}
        previous = dict(plan.end)
    records = [Progress.from_record(log.read(b)) for b in log.batch_ids() if b >= 0]  # pyright: ignore[reportArgumentType]
    for before, after in zip([None, *records], records, strict=False):
        end = after.offsets_of(label)
        if end is None:
            continue
        if before is not None and before.offsets_of(label) is not None:
            previous = before.offsets_of(label)  # pyright: ignore[reportAssignmentType]
        chunks[after.of(label).complete_below - 1] = {p: (previous.get(p, 0), o) for p, o in end.items()}
    return chunks
