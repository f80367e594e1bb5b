"""Where a live run keeps its files, in its generation's folder (:class:`phases._internal.placement.Placement`): the
streaming checkpoints
(``checkpoints/<run>/...``), the run's folder with its progress log and held-back rows. The backlog reads it to
tell whether the live phase of a handoff has started."""

from __future__ import annotations

from pyspark.sql import SparkSession

from phases._internal import uris
from phases._internal.coordination import progress_log
from phases._internal.placement import Placement


def live_checkpoint_root(where: Placement, run_name: str) -> str:
    return uris.join(where.checkpoints, run_name)


def state_store_root(where: Placement, run_name: str) -> str:
    """The live run's state stores (one folder per layout, :mod:`phases._internal.state.keyed_store`). The backlog
    writes the handoff's version 1 there before the manifest names the run."""
    return f"{where.live_run(run_name)}/state-store"


def live_started(spark: SparkSession, where: Placement, manifest_id: str) -> bool:
    """True once the live phase of ``manifest_id`` has recorded its switch (its first progress record)."""
    return progress_log.live_started(spark, where.live_run(manifest_id))
