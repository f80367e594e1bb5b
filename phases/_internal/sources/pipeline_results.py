"""Another pipeline's results as a source (:class:`phases._internal.definition.PipelineSource`): the upstream's
consumer-facing sink, read as a Delta table's change feed (:mod:`phases._internal.sources.delta`), whose commit
versions are the upstream's writes: its handoff's, then one per live micro-batch.

The downstream may start only once the upstream has handed off: before that its sink holds nothing, or a backlog's
partial write. :meth:`PipelineResultsSource.check` refuses then, naming the upstream's backlog.

**A rewrite upstream.** The upstream's results are appended, except when it writes them whole again: a ``reset`` of its
backlog, a redeploy's swap, a combine of daily slices (an overwrite that replaces files). Such a commit is a new
history of the results, not records that arrive: the downstream's backlog reads the versions up to the newest one as
one snapshot of it (one arrival: the rewrite's) and the versions after it through the change feed; a catch-up
increment or a live micro-batch that would read a rewrite stops instead, naming it and the way out (this pipeline's
backlog again, ``reset=True``), rather than quarantining the replaced results as non-append changes.

**A keyed aggregation upstream** (:attr:`PipelineSource.reads_changes`): its sink is its current table, replaced per
key, and every commit is changes to it: a MERGE's updated rows as their old row (taken back) and their new one, a
rewrite (a reset, a swap) as every old row taken back and every new one added. Nothing is a rewrite to stop at: the
changes say exactly what became of each row. The backlog reads the table as of its end version (its rows are the net
changes of every version before: one arrival), increments and the live phase its change feed."""

from __future__ import annotations

from pyspark.sql import SparkSession

from phases._internal.definition import PipelineSource
from phases._internal.deployment import settle
from phases._internal.errors import ManifestError, PhaseStateError, SourceError
from phases._internal.handoff import manifest
from phases._internal.placement import Placement
from phases._internal.sources.delta import DeltaTableSource
from phases._internal.storage import table_stats

# Files per micro-batch over changes: so many that Delta's admission control never splits a version.
WHOLE_VERSIONS_FILES = 2**31 - 1


class PipelineResultsSource(DeltaTableSource):
    """The upstream's sink as a Delta source, once the upstream has handed off."""

    def __init__(self, spark: SparkSession, spec: PipelineSource, path: str, upstream: Placement):
        """``path``: the upstream's consumer-facing sink; ``upstream``: where the upstream runs
        (:meth:`phases._internal.placement.Placement.upstream`)."""
        super().__init__(spark, spec, path)
        self.spec, self.upstream = spec, upstream
        self._handed_off = False  # the upstream's handoff, once seen, is not read again by this reader

    def check(self) -> None:
        """Fails with SourceError unless the upstream has handed off (a manifest of its serving generation) and its
        sink records its change data feed."""
        if not self._handed_off:
            self._require_handoff()
            self._handed_off = True
        super().check()

    def require_change_feed(self, end_version: int) -> None:
        """As a Delta source's, from the newest rewrite up to ``end_version`` on (read as one snapshot of it); none
        over changes (the backlog reads the table as of ``end_version``)."""
        if self.spec.reads_changes:
            return
        self._from_newest_rewrite(end_version)
        if self.starting_version == end_version + 1:  # the head is a rewrite: the snapshot is all there is to read
            return
        super().require_change_feed(end_version)

    def read_backlog(self, end_version: int, start_version: int = 0):
        """As a Delta source's; a full read (``start_version`` 0) takes the versions up to the newest rewrite as one
        snapshot of it; a range from ``start_version`` > 0 (a catch-up increment) that holds a rewrite stops."""
        if start_version == 0 and self.spec.reads_changes:
            self.starting_version = end_version + 1  # the table as of end_version: the net changes, one arrival
        elif start_version == 0:
            self._from_newest_rewrite(end_version)
        elif not self.spec.reads_changes:
            self.check_versions(start_version, end_version)
        return super().read_backlog(end_version, start_version)

    def check_versions(self, first: int, last: int) -> None:
        """Raises PhaseStateError when a version in first..last rewrote the upstream's results (see the module); never
        over changes."""
        if self.spec.reads_changes:
            return
        found = table_stats.rewrites(self.spark, self.path, max(first, 1), last)
        if not found:
            return
        version, operation = found[0]
        name = self.spec.upstream.name
        raise PhaseStateError(
            f"pipeline {name!r} wrote its results again at version {version} of {self.path} ({operation}: a reset of "
            "its backlog, a redeploy's swap, or a combine of its daily slices): what this pipeline applied was built "
            "over the results before it. Nothing of that version was applied. To follow it: stop this pipeline's live "
            "phase, then run its backlog again with reset=True (BacklogRunner(spark, pipeline).run(reset=True), or its "
            "backlog job with reset: true): it reads the new results"
        )

    def _from_newest_rewrite(self, end_version: int) -> None:
        """Moves the effective ``starting_version`` past the newest rewrite at or before ``end_version``."""
        found = table_stats.rewrites(self.spark, self.path, max(self.spec.starting_version, 1), end_version)
        self.starting_version = (
            max(self.spec.starting_version, found[-1][0] + 1) if found else self.spec.starting_version
        )

    @property
    def whole_versions(self) -> bool:
        """Whether every live micro-batch reads whole versions (over changes: see :meth:`read_live`)."""
        return self.spec.reads_changes

    def read_live(self, after_version: int | None, max_files_per_trigger: int | None = None):
        """As a Delta source's; over changes, whole versions per micro-batch, whatever ``max_files_per_trigger``:
        Delta's offset after a version of change files stays at that version's last file rather than moving to the
        next version, so a version read in part could not be told from one read whole."""
        if not self.spec.reads_changes:
            return super().read_live(after_version, max_files_per_trigger)
        return super().read_live(after_version, WHOLE_VERSIONS_FILES)

    def log_bounds(self, first: int, last: int, event_time: str, keys: list[str]) -> list | None:
        """As a Delta source's; none over changes (the log's bounds are of added files, not of the changes)."""
        return None if self.spec.reads_changes else super().log_bounds(first, last, event_time, keys)

    def declaration(self, starting_version: int | str) -> str:
        return f"PipelineSource(upstream={self.spec.upstream.name}, starting_version={starting_version})"

    def _require_handoff(self) -> None:
        name = self.spec.upstream.name
        serving = settle(self.spark, self.upstream, strict=False)
        try:
            manifest.latest(self.spark, serving.manifests, name)
        except ManifestError as exc:
            raise SourceError(
                f"source: the results of pipeline {name!r} ({self.path}) are not there yet: {name!r} has not handed "
                f"off ({exc}). Nothing was read. Run the backlog of {name!r} first (BacklogRunner(spark, "
                f"{name}).run(), or its backlog job in Dagster); this pipeline's backlog then reads what it wrote"
            ) from exc
