"""Another pipeline's results as a source (:class:`phases._internal.definition.PipelineSource`): the upstream's
consumer-facing sink, read as a Delta table's change feed (:mod:`phases._internal.sources.delta`), whose commit
versions are the upstream's writes: its handoff's, then one per live micro-batch.

The downstream may start only once the upstream has handed off: before that its sink holds nothing, or a backlog's
partial write. :meth:`PipelineResultsSource.check` refuses then, naming the upstream's backlog."""

from __future__ import annotations

from pyspark.sql import SparkSession

from phases._internal.definition import PipelineSource
from phases._internal.deployment import settle
from phases._internal.errors import ManifestError, SourceError
from phases._internal.handoff import manifest
from phases._internal.placement import Placement
from phases._internal.sources.delta import DeltaTableSource


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
