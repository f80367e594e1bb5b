"""Where a live run keeps its files, under the pipeline's locations: the streaming checkpoints
(``checkpoints/<run>/...``), the run's folder with its progress log and held-back rows. The backlog reads it to
tell whether the live phase of a handoff has started."""

from __future__ import annotations

from pyspark.sql import SparkSession

from phases._internal import uris
from phases._internal.coordination import progress_log
from phases._internal.definition import Pipeline


def live_checkpoint_root(pipeline: Pipeline, run_name: str) -> str:
    return uris.join(pipeline.locations.checkpoints, run_name)


def state_store_root(pipeline: Pipeline, run_name: str) -> str:
    """The live run's state stores (one folder per layout, :mod:`phases._internal.state.keyed_store`). The backlog
    writes the handoff's version 1 there before the manifest names the run."""
    return f"{pipeline.locations.live_run(run_name)}/state-store"


def live_started(spark: SparkSession, pipeline: Pipeline, manifest_id: str) -> bool:
    """True once the live phase of ``manifest_id`` has recorded its switch (its first progress record)."""
    return progress_log.live_started(spark, pipeline.locations.live_run(manifest_id))
