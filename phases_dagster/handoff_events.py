"""What Dagster's event log knows of a pipeline's latest handoff (the backlog materialization's metadata), and the
handoff of the generation that serves (after a redeploy, the next generation's, read from its manifests)."""

from dataclasses import dataclass
from typing import Any

import dagster as dg

from phases import Placement
from phases.inspect import newest_handoff_row, watermark_after


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


def of_manifest(handoff, delay_us: int, run_id: str = "") -> Handoff:
    """A :class:`phases.HandoffManifest` as the sensors' :class:`Handoff`."""
    right_max = handoff.right_max_event_time_us
    return Handoff(
        manifest_id=handoff.manifest_id,
        fingerprint=handoff.fingerprint,
        source_version=handoff.source_version,
        final_watermark_us=handoff.final_watermark_us,
        run_id=run_id,
        source_position=handoff.source_position,
        right_source_version=handoff.right_source_version,
        right_watermark_us=watermark_after(right_max, delay_us) if right_max is not None else None,
        right_source_position=handoff.right_source_position,
    )


def read_handoff(instance: dg.DagsterInstance, key: dg.AssetKey) -> Handoff | None:
    records = instance.fetch_materializations(key, limit=1).records
    if not records:
        return None
    meta = records[0].asset_materialization.metadata
    if "handoff" not in meta:  # a materialization that recorded no handoff
        return None
    fields: dict[str, Any] = meta["handoff"].value  # type: ignore[assignment]  # exact fields in one JSON entry
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


def serving_handoff(instance: dg.DagsterInstance, where: Placement, backlog_key: dg.AssetKey) -> Handoff | None:
    """The handoff the serving generation's live phase runs from (``where``: the storage resource's placement). Until a
    redeploy that is the backlog materialization's; after a swap, the serving generation's newest manifest (read
    with delta-rs), which no backlog materialization names: the health sensor and the live checks then watch, judge
    and relaunch that generation's live runs."""
    latest = read_handoff(instance, backlog_key)
    if not where.redeployed:
        return latest
    newest = newest_handoff_row(where)
    if newest is None or (latest is not None and newest["manifest_id"] == latest.manifest_id):
        return latest
    right_max = newest.get("right_max_event_time_us")
    return Handoff(
        manifest_id=newest["manifest_id"],
        fingerprint=newest["fingerprint"],
        source_version=int(newest["source_version"]),
        final_watermark_us=newest.get("final_watermark_us"),
        run_id=latest.run_id if latest is not None else "",
        source_position=newest.get("source_position") or None,
        right_source_version=newest.get("right_source_version"),
        right_watermark_us=watermark_after(right_max, where.definition.delay_us) if right_max is not None else None,
        right_source_position=newest.get("right_source_position") or None,
    )
