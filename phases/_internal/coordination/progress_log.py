"""The live phase's progress log: one small JSON file per micro-batch, in the live run's folder.

A live micro-batch ends by recording what it applied (:class:`phases._internal.live.micro_batch.Progress`): how far each
input is applied, the running maximum event time, what the closing watermark emitted. The next micro-batch
starts from it, and the switch's record (batch -1) is the live phase's immediate checkpoint.

The record used to be a row appended to a Delta table: one more commit, 1.5–1.8 s of every micro-batch on
this kind of machine. It is now a file written the way Spark writes its own offset and commit logs: under a
temporary name, then renamed into place, so it is there whole or not at all. A micro-batch replayed after a
crash finds its record already there and keeps it (the replay applied nothing new). The newest
:data:`RETAIN` records are kept, as Spark keeps ``minBatchesToRetain`` of its own.
"""

from __future__ import annotations

import json

from pyspark.sql import SparkSession

from phases._internal import uris
from phases._internal.errors import ProgressRecordDamaged
from phases._internal.storage import fs

RETAIN = 100
FOLDER = "progress_log"  # under the live run's folder


def _batch_id(name: str) -> int | None:
    """The batch id of a record's file name (``<id>.json``), None for any other file."""
    stem, dot, ext = name.rpartition(".")
    return int(stem) if dot and ext == "json" and stem.lstrip("-").isdigit() else None


class ProgressLog:
    """The records of one live run under ``root`` (``<batch id>.json``)."""

    def __init__(self, spark: SparkSession, root: str):
        self.spark, self.root = spark, root.rstrip("/")

    def _path(self, batch_id: int) -> str:
        return f"{self.root}/{batch_id}.json"

    def batch_ids(self) -> list[int]:
        return sorted(i for name in fs.list_names(self.spark, self.root) if (i := _batch_id(name)) is not None)

    def write(self, batch_id: int, record: dict) -> None:
        """Records ``batch_id`` (kept as it is when already there) and drops records beyond retention."""
        fs.create_once(self.spark, self._path(batch_id), json.dumps(record, sort_keys=True))
        if batch_id - RETAIN >= 0:
            fs.delete_file(self.spark, self._path(batch_id - RETAIN))

    def read(self, batch_id: int) -> dict | None:
        """The record of ``batch_id``, None when there is none; :class:`ProgressRecordDamaged` when its file is
        not a whole record (truncated, half-written by a store without atomic renames, edited by hand)."""
        path = self._path(batch_id)
        if not fs.exists(self.spark, path):
            return None
        return parse(fs.read_text(self.spark, path), path)

    def latest(self) -> tuple[int, dict] | None:
        """(batch id, record) of the newest record, None when the log is empty."""
        ids = self.batch_ids()
        if not ids:
            return None
        return ids[-1], parse(fs.read_text(self.spark, self._path(ids[-1])), self._path(ids[-1]))

    def set_aside(self, batch_id: int) -> str:
        """Renames a damaged record out of the log (``<id>.json.damaged-<µs>``, kept for inspection); returns the
        new path."""
        import time

        target = f"{self._path(batch_id)}.damaged-{time.time_ns() // 1000}"
        fs.rename(self.spark, self._path(batch_id), target)
        return target


def parse(text: str, path: str) -> dict:
    """A record's JSON, or :class:`ProgressRecordDamaged` naming the file."""
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise ProgressRecordDamaged(
            f"progress record {path} is damaged ({exc}): it is not a whole record", path
        ) from exc
    if not isinstance(record, dict) or "batch_id" not in record or "complete_below" not in record:
        raise ProgressRecordDamaged(f"progress record {path} is damaged: it is not a progress record", path)
    return record


def live_started(spark: SparkSession, live_run_root: str) -> bool:
    """True once a live run under ``live_run_root`` has recorded its switch (its first progress record)."""
    return bool(ProgressLog(spark, f"{live_run_root.rstrip('/')}/{FOLDER}").batch_ids())


def latest_without_spark(live_run_root: str) -> tuple[int, dict] | None:
    """:meth:`ProgressLog.latest` without Spark, for sensors and health checks: local folders and object-store
    URIs alike (:func:`phases._internal.uris.pyarrow_filesystem`). None when the run has no record yet."""
    import pyarrow.fs as pafs

    filesystem, folder = uris.pyarrow_filesystem(uris.join(live_run_root, FOLDER))
    infos = filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    ids = sorted(b for i in infos if i.type == pafs.FileType.File and (b := _batch_id(i.base_name)) is not None)
    for batch_id in reversed(ids):  # a record deleted by retention between the listing and the read: the next
        try:
            with filesystem.open_input_stream(f"{folder}/{batch_id}.json") as stream:
                return batch_id, parse(stream.read().decode("utf-8"), f"{folder}/{batch_id}.json")
        except (FileNotFoundError, ProgressRecordDamaged):
            continue  # a damaged newest record: the live phase sets it aside at its next start
    return None
