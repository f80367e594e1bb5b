"""Where the engine keeps its own tables (:class:`Locations`) and how it keeps them from growing
(:class:`Maintenance`): two parts of a pipeline's declaration that shape no state."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from phases._internal import uris
from phases._internal.definition.fields import _Model

# The engine's folders under a generation's root: one set of names, for the declaration (:class:`Locations`) and for
# where it runs (:class:`phases._internal.placement.Placement`).
STATE_FOLDER, MANIFESTS_FOLDER, QUARANTINE_FOLDER = "state", "manifests", "quarantine"
CHECKPOINTS_FOLDER, LIVE_FOLDER = "checkpoints", "live"


class Locations(_Model):
    """Where the engine keeps its own tables. Everything lives under ``root`` unless overridden. The paths below are
    generation 0's as declared (not resolved under a storage root); the engine reads them from its placement."""

    root: str = Field(min_length=1)

    def _sub(self, name: str) -> str:
        return uris.join(self.root, name)

    @property
    def state_root(self) -> str:
        return self._sub(STATE_FOLDER)

    @property
    def manifests(self) -> str:
        return self._sub(MANIFESTS_FOLDER)

    @property
    def quarantine(self) -> str:
        return self._sub(QUARANTINE_FOLDER)

    @property
    def checkpoints(self) -> str:
        return self._sub(CHECKPOINTS_FOLDER)

    def live_run(self, run_name: str) -> str:
        """The live phase's own tables of one run (its progress and the held-back part of a split version)."""
        return uris.join(self.root, LIVE_FOLDER, run_name)


class Maintenance(_Model):
    """How the engine keeps its tables from growing without bound (:mod:`phases._internal.storage.maintenance`). Not
    part of the fingerprint: it shapes no state."""

    auto_compact: bool = Field(
        default=True,
        description="Compaction of the sink's small files: Delta auto compaction on an upserted sink (every live "
        "micro-batch rewrites it); a changelog sink is bin-packed by its background compaction instead.",
    )
    retain: timedelta = Field(
        default=timedelta(days=7),
        description="VACUUM retention of the engine's tables and the sink; Delta refuses less than its 7-day "
        "safety interval unless spark.databricks.delta.retentionDurationCheck.enabled is false.",
    )
