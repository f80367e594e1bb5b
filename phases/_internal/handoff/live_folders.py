"""Where a live run keeps its files, in its generation's folder (:class:`phases._internal.placement.Placement`): the
streaming checkpoints
(``checkpoints/<run>/...``), the run's folder with its progress log and held-back rows. The backlog reads it to
tell whether the live phase of a handoff has started."""

from __future__ import annotations

from pyspark.sql import SparkSession

from phases._internal.coordination import progress_log
from phases._internal.placement import Placement


def live_started(spark: SparkSession, where: Placement, manifest_id: str) -> bool:
    """True once the live phase of ``manifest_id`` has recorded its switch (its first progress record)."""
    return progress_log.live_started(spark, where.live_run(manifest_id))
