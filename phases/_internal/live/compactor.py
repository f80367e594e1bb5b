"""The background compaction of a changelog sink while the live phase runs (``DeltaSink.compact_every``): never
inside a micro-batch, so a micro-batch only ever appends (:mod:`phases._internal.storage.changelog`). Each run also
tidies the changelog itself: its small files bin-packed and a checkpoint of its Delta log written."""

from __future__ import annotations

import logging
import threading

from pyspark import InheritableThread
from pyspark.sql import SparkSession

from phases._internal.placement import Placement
from phases._internal.runtime.session import background_jobs
from phases._internal.storage import changelog

log = logging.getLogger(__name__)


class Compactor:
    """Compacts the pipeline's changelog into its current table every ``sink.compact_every`` until stopped. A
    failed compaction is logged and tried again at the next interval (the reader is exact either way). ``last`` is
    the compaction of the latest run that finished, its tidying included; ``last_error`` the latest run's failure."""

    def __init__(self, spark: SparkSession, where: Placement):
        self.spark, self.placement, self.pipeline = spark, where, where.definition
        self._stop = threading.Event()
        self._thread: InheritableThread | None = None
        self.runs = 0
        self.last: changelog.Compaction | None = None
        self.last_error: str | None = None

    def start(self) -> Compactor:
        self._thread = InheritableThread(target=self._loop, name=f"{self.pipeline.name}-compactor", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        # In the background pool: while a micro-batch's tasks wait for a core, a compaction's wait (Spark's fair
        # scheduler; under its FIFO scheduler a compaction's stage took every core until all its tasks had started).
        with background_jobs(self.spark):
            self._compact_until_stopped()

    def _compact_until_stopped(self) -> None:
        every = self.pipeline.sink.compact_every.total_seconds()
        while not self._stop.wait(every):
            try:
                compaction = changelog.compact(self.spark, self.placement)
                changelog.tidy(self.spark, self.placement)
                # Published once the whole run is done: ``last`` names a run whose log checkpoint is written too.
                self.last, self.last_error = compaction, None
                self.runs += 1
            except Exception as exc:  # noqa: BLE001 - logged; the next interval tries again
                self.last_error = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
                log.warning(
                    "pipeline %s: compaction of %s failed: %s",
                    self.pipeline.name,
                    self.placement.sink_path,
                    self.last_error,
                )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=600)
            self._thread = None
