"""File-system checks through Hadoop's FileSystem, so that any URI Spark can write to works."""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import tempfile

from pyspark.sql import SparkSession

from phases._internal import spark_internals, uris
from phases._internal.spark_internals import hadoop_path as _fs_path

log = logging.getLogger(__name__)


def exists(spark: SparkSession, path: str) -> bool:
    if _is_local(path):
        return os.path.exists(path)
    fs, p = _fs_path(spark, path)
    return bool(fs.exists(p))


def delete(spark: SparkSession, path: str) -> None:
    fs, p = _fs_path(spark, path)
    if fs.exists(p):
        fs.delete(p, True)


def file_count(spark: SparkSession, path: str) -> int:
    """The number of files under ``path`` at any depth (0 when it does not exist)."""
    fs, p = _fs_path(spark, path)
    return int(fs.getContentSummary(p).getFileCount()) if fs.exists(p) else 0


def has_files(spark: SparkSession, pattern: str) -> bool:
    """True when the glob ``pattern`` matches at least one file. A plain path whose folder has no wildcard, and whose
    name has only ``*`` and ``?``, is matched in its folder by the OS (no JVM round trips: every live start and many
    writes ask it); anything else through Hadoop's ``globStatus``."""
    folder, name = os.path.split(pattern)
    if _is_local(pattern) and not any(c in folder for c in _WILDCARDS) and not any(c in name for c in _HADOOP_ONLY):
        try:
            with os.scandir(folder or ".") as entries:
                return any(fnmatch.fnmatchcase(e.name, name) for e in entries)
        except (FileNotFoundError, NotADirectoryError):
            return False
    fs, p = _fs_path(spark, pattern)
    found = fs.globStatus(p)
    return found is not None and len(found) > 0


def read_text(spark: SparkSession, path: str) -> str:
    """The whole text file at ``path`` (local paths directly, other URIs through Hadoop's FileSystem)."""
    return spark_internals.read_text(spark, path)


def list_names(spark: SparkSession, path: str) -> list[str]:
    """Names of the entries directly under ``path`` (empty when it does not exist)."""
    if _is_local(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    fs, p = _fs_path(spark, path)
    if not fs.exists(p):
        return []
    return sorted(str(status.getPath().getName()) for status in fs.listStatus(p))


def size_bytes(spark: SparkSession, path: str) -> int:
    """The bytes of every file under ``path`` (0 when it does not exist)."""
    if _is_local(path):
        local = uris.local_path(path)
        return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(local) for name in names)
    fs, p = _fs_path(spark, path)
    return int(fs.getContentSummary(p).getLength()) if fs.exists(p) else 0


def remove_orphan_checksums(path: str) -> list[str]:
    """Removes the hidden checksum files (``.<name>.crc``, Hadoop's local file system) under a local Delta table's log
    whose file is gone, and returns their paths. They are left behind when a commit's JSON is removed by hand (a
    restore of older files): Delta would write that version again, and Hadoop would check it against the stale
    checksum (``ChecksumException``). Object stores keep no such files: nothing to do there."""
    if not _is_local(path):
        return []
    log = os.path.join(uris.local_path(path), "_delta_log")
    if not os.path.isdir(log):
        return []
    names = set(os.listdir(log))
    removed = []
    for name in sorted(names):
        if name.startswith(".") and name.endswith(".crc") and name[1 : -len(".crc")] not in names:
            os.remove(os.path.join(log, name))
            removed.append(os.path.join(log, name))
    return removed


def sweep_orphan_checksums(*paths: str) -> list[str]:
    """:func:`remove_orphan_checksums` of each table, naming each file removed in a warning: every engine write to a
    Delta table goes through this first (the sink, the quarantine, the state, the log tables, compacted tables)."""
    removed = []
    for path in dict.fromkeys(paths):
        for name in remove_orphan_checksums(path):
            log.warning("removed %s: the checksum of a commit file that is gone (a removed or restored commit)", name)
            removed.append(name)
    return removed


_HADOOP_ONLY = "[{\\"  # Hadoop's glob syntax that fnmatch reads otherwise (classes, alternations, escapes)
_WILDCARDS = "*?" + _HADOOP_ONLY  # all of Hadoop's glob syntax


def _is_local(path: str) -> bool:
    """A plain path: the OS answers directly (URIs, ``file:`` ones too, go through Hadoop's FileSystem)."""
    return uris.scheme(path) is None


def create_once(spark: SparkSession, path: str, text: str) -> bool:
    """Writes ``text`` to ``path`` unless a file is there already; True when it wrote.

    The file appears whole or not at all: it is written under a temporary name in the same folder and renamed
    into place (as Spark writes its own commit log). Local paths use the OS directly (no JVM round trips)."""
    if _is_local(path):
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        if os.path.exists(path):
            return False
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            os.link(tmp, path)  # fails if another writer put the file there in between: keep theirs
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    jvm = spark_internals.jvm(spark)
    fs, p = _fs_path(spark, path)
    if fs.exists(p):
        return False
    tmp = jvm.org.apache.hadoop.fs.Path(p.getParent(), f".{p.getName()}.{jvm.java.util.UUID.randomUUID()}.tmp")
    out = fs.create(tmp, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()
    renamed = bool(fs.rename(tmp, p))
    if not renamed:
        fs.delete(tmp, False)
    return renamed


def delete_file(spark: SparkSession, path: str) -> None:
    """Deletes the file at ``path`` if it is there."""
    if _is_local(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    fs, p = _fs_path(spark, path)
    fs.delete(p, False)


def rename(spark: SparkSession, source: str, target: str) -> None:
    """Moves the file ``source`` to ``target`` (the target must not exist)."""
    if _is_local(source):
        os.rename(source, target)
        return
    fs, p = _fs_path(spark, source)
    if not fs.rename(p, spark_internals.jvm(spark).org.apache.hadoop.fs.Path(target)):
        raise OSError(f"could not rename {source} to {target}")
