"""What Dagster's event log knows of a pipeline's latest handoff: the backlog materialization's metadata."""

from dataclasses import dataclass

import dagster as dg


@dataclass(frozen=True)
class Handoff:
    """The latest backlog materialization, as its metadata records it."""

    manifest_id: str
    fingerprint: str
    source_version: int
    final_watermark_us: int | None
    run_id: str
    source_position: str | None = None  # a Kafka source's chunk plan (its end offsets)
    right_source_version: int | None = None  # two-input operators: the right source's handoff version
    right_watermark_us: int | None = None  # ... and its final watermark
    right_source_position: str | None = None  # ... and a Kafka right input's chunk plan


def read_handoff(instance: dg.DagsterInstance, key: dg.AssetKey) -> Handoff | None:
    records = instance.fetch_materializations(key, limit=1).records
    if not records:
        return None
    meta = records[0].asset_materialization.metadata
    if "handoff" not in meta:  # a materialization that recorded no handoff
        return None
    fields = meta["handoff"].value  # exact fields in one JSON entry
    return Handoff(
        manifest_id=fields["manifest_id"],
        fingerprint=fields["fingerprint"],
        source_version=int(fields["source_version"]),
        final_watermark_us=fields.get("final_watermark_us"),
        run_id=records[0].run_id,
        source_position=fields.get("source_position") or None,
        right_source_version=fields.get("right_source_version"),
        right_watermark_us=fields.get("right_final_watermark_us"),
        right_source_position=fields.get("right_source_position") or None,
    )
