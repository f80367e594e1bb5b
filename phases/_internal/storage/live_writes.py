"""The idempotent writes of a live micro-batch, and how a resume reads them back.

Every write a live micro-batch makes names the run and the batch: the app id ``<pipeline>:<run>:<what>``
(:func:`app_id`, ``what`` one of :data:`LIVE_WRITES`) and the **progress-log batch id**, which never restarts
(:mod:`phases._internal.live.resume`). Two ways to carry them:

- the quarantine, which other writers share (the backlog, other pipelines' runs), takes Delta's ``txnAppId`` /
  ``txnVersion``: Delta skips a write it already committed;
- the tables only the run writes while it lives (the sink, the pending versions of each input) take them in the
  commit's ``userMetadata`` (:func:`phases._internal.storage.tables.append_marked`). Delta 4.4 answers ``txnVersion``
  from a state reconstruction of the table's log (three Spark jobs: an append took 0.92 s with it, 0.25 s without, on a
  small table); a marked write skips it. Only the first micro-batch of a query can find its write already there
  (every batch writes after the previous batch's progress record, and a start resumes after the newest record),
  so only that one reads the table's log first (:meth:`BatchWrites.already_written`): its newest commit that
  changed rows is the batch's own when it got that far.

:func:`live_writes` reads both back: the newest micro-batch of a run that wrote a table.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from phases._internal.storage import table_stats, tables

# Every idempotent write a live micro-batch makes (``app_id(..., what)``): a resume reads them back from the tables.
LIVE_WRITES = ("upsert", "state", "closed", "sink", "pending", "pending_right", "quarantine", "quarantine_right")


def app_id(pipeline: str, run_name: str, what: str) -> str:
    """The app id of a live run's write ``what`` (Delta's ``txnAppId``, or a marked write's)."""
    return f"{pipeline}:{run_name}:{what}"


def live_writes(spark: SparkSession, path: str, pipeline: str, run_name: str) -> int | None:
    """The newest micro-batch of the live run that recorded a write in the table at ``path`` (None: none). Read
    with delta-rs; a log delta-rs cannot read (store settings given to Spark only) is read through Spark's."""
    app_ids = [app_id(pipeline, run_name, what) for what in LIVE_WRITES]
    found = table_stats.applied_transactions(spark, path, app_ids)
    return max(found.values()) if found else None


class BatchWrites:
    """The writes of micro-batch ``batch`` of live run ``run_name``. ``first`` is True for the first micro-batch
    of a query after a start: only it can find its writes already committed (a replay)."""

    def __init__(
        self,
        spark: SparkSession,
        pipeline: str,
        run_name: str,
        batch: int,
        *,
        first: bool,
        publish: Callable[[DataFrame, int, bool], object] | None = None,
    ):
        self.spark, self.pipeline, self.run_name, self.batch, self.first = spark, pipeline, run_name, batch, first
        # A topic sink's publish of the rows the sink gets (rows, batch, first): called before the sink's Delta write,
        # with its own record of what went out (phases._internal.topics.sink).
        self.publish = publish
        # The writes this batch left in its tables (``what`` -> the table's path): the progress record names them,
        # so that a start can tell a table restored to before them (:meth:`IncrementalLive.prepare`).
        self.committed: dict[str, str] = {}

    def app(self, what: str) -> str:
        return app_id(self.pipeline, self.run_name, what)

    def append_once(self, df: DataFrame, path: str, what: str, *, merge_schema: bool = False) -> None:
        """Appends ``df`` to a table other writers may share, skipped by Delta when already committed. Delta commits
        the write's transaction id even with no row, so the table always holds it."""
        tables.append_once(df, path, self.app(what), self.batch, merge_schema=merge_schema)
        self.committed[what] = path

    def append_owned(self, df: DataFrame, path: str, what: str, *, merge_schema: bool = False) -> None:
        """Appends ``df`` to a table only this run writes (its sink, its pending versions) as a marked write, unless
        this batch's write is already there. ``merge_schema`` lets the table take up columns ``df`` adds. The sink's
        rows (``what`` "sink") go to the pipeline's result topic first, when it has one."""
        if what == "sink" and self.publish is not None:
            self.publish(df, self.batch, self.first)
        if self.already_written(path):
            self.committed[what] = path
            return
        tables.append_marked(df, path, self.app(what), self.batch, merge_schema=merge_schema)
        self._note_commit(path, what)

    def sink_upsert(
        self,
        rows: DataFrame,
        path: str,
        keys: list[str],
        what: str,
        *,
        write: str = "merge",
        changed: int | None = None,
    ) -> None:
        """Upserts ``rows`` into the run's sink (one commit: ``write`` as
        :func:`phases._internal.storage.tables.upsert_marked`) as a marked write, unless already there; to the
        pipeline's result topic first, when it has one."""
        if self.publish is not None:
            self.publish(rows, self.batch, self.first)
        if self.already_written(path):
            self.committed[what] = path
            return
        tables.upsert_marked(self.spark, path, rows, keys, self.app(what), self.batch, write=write, changed=changed)
        self._note_commit(path, what)

    def _note_commit(self, path: str, what: str) -> None:
        """Notes the marked write if Delta committed it (Delta makes no commit for a marked write with no row)."""
        if table_stats.has_marked_write(path, self.app(what), self.batch):
            self.committed[what] = path

    def already_written(self, path: str) -> bool:
        """Whether the table at ``path`` holds a write of this batch or a later one (read only for a query's first
        micro-batch: a later one runs after its predecessor's progress record, so nothing of it is written)."""
        if not self.first:
            return False
        newest = live_writes(self.spark, path, self.pipeline, self.run_name)
        return newest is not None and newest >= self.batch
