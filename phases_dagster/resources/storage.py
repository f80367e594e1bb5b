"""Where a pipeline's Delta tables live, as a swappable Dagster resource.

Pipeline definitions may use relative paths (source, sink, engine locations); the storage resource
resolves them under its ``root``, which defaults to ``.data/dagster`` in the Dagster project's folder (the working
directory of Dagster's processes), or the ``PHASES_DATA_ROOT`` environment variable. Absolute paths and URIs are
kept as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from phases import Pipeline, Placement, place


def default_root() -> str:
    return os.environ.get("PHASES_DATA_ROOT") or str(Path.cwd() / ".data" / "dagster")


class StorageResource(dg.ConfigurableResource):
    """Root of the Delta tables (sink, state, manifests, quarantine, checkpoints) of every pipeline."""

    root: str = Field(default_factory=default_root, description="Folder or URI relative paths resolve under.")
    kafka_bootstrap_servers: str | None = Field(
        default_factory=lambda: os.environ.get("PHASES_KAFKA_BOOTSTRAP_SERVERS") or None,
        description="The deployment's Kafka brokers (host:port,...): Kafka sources are pointed at them instead of the "
        "address in their definition. Default: PHASES_KAFKA_BOOTSTRAP_SERVERS, else the definition's own.",
    )

    def placement(self, pipeline: Pipeline) -> Placement:
        """Where the pipeline runs, placed once (:func:`phases.place`): its relative paths under ``root``, its topics
        at the deployment's brokers, the generation that serves it (the one a swap under way started from: what the
        sensors, checks and the catalog show). Reads the redeploy log with delta-rs. The engine's runners take it as
        it is, and refuse at their start to write the sink during a swap. The definition itself is not changed."""
        return place(None, pipeline, root=self.root, kafka_bootstrap_servers=self.kafka_bootstrap_servers, strict=False)
