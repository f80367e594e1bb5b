"""One backlog and one live phase per pipeline at a time: a lease file per pipeline and role.

A lease is a small JSON file, ``<locations.root>/leases/<pipeline>.<role>.json``, created with the file system's
create-if-absent (atomic on local disks and HDFS). It names its holder: the run, host, process and since
when. While held, a daemon thread refreshes the file's modification time (the heartbeat). A second start
finds the file and is refused with a :class:`LeaseHeld` error naming the holder; the running phase never
notices. Releasing deletes the file.

A holder that died without releasing (kill -9, a lost machine) leaves its file behind. Taking it over is
explicit (``take_over=True``) and safe: it is allowed only when the holder is gone (same host and its
process is not running, or no heartbeat for ``stale_after_s``). The old file is first renamed away
(only one of two racing takers can rename it) and a new one created.

Within one process a lease is re-entrant for the same holder (a slice range holds the backlog lease
for each of its slices).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from phases._internal import spark_internals, uris
from phases._internal.errors import LeaseHeld
from phases._internal.placement import Placement

ROLES = ("backlog", "live", "redeploy")
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0


@dataclass
class Lease:
    pipeline: str
    role: str
    holder: str
    host: str
    pid: int
    since_us: int
    path: str

    def describe(self, heartbeat_us: int | None = None) -> str:
        since = datetime.fromtimestamp(self.since_us / 1e6, tz=UTC).isoformat(timespec="seconds")
        beat = ""
        if heartbeat_us is not None:
            beat = f", last heartbeat {max(0.0, (time.time_ns() // 1000 - heartbeat_us) / 1e6):.0f} s ago"
        return f"{self.holder} since {since} (host {self.host}, pid {self.pid}{beat})"


_held: dict[str, tuple[Lease, int, threading.Event]] = {}
_lock = threading.Lock()


class _LocalStore:
    """Local paths and ``file:`` URIs (converted to paths by the caller): ``O_CREAT | O_EXCL`` makes creation
    atomic."""

    def create(self, path: str, body: str) -> bool:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(body)
        return True

    def read(self, path: str) -> tuple[str, int] | None:
        try:
            with open(path) as f:
                return f.read(), os.stat(path).st_mtime_ns // 1000
        except FileNotFoundError:
            return None

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)

    def touch(self, path: str) -> None:
        os.utime(path)


class _HadoopStore:
    """Other URIs through Hadoop's FileSystem: ``create(overwrite=false)`` is atomic on HDFS; on object
    stores it is as atomic as the connector's conditional create."""

    def __init__(self, spark: SparkSession):
        self.spark = spark
        self.jvm = spark_internals.jvm(spark)

    def _fs(self, path: str):
        return spark_internals.hadoop_path(self.spark, path)

    @staticmethod
    def _put(out, body: str) -> None:
        try:
            out.write(bytearray(body.encode()))
        finally:
            out.close()

    def create(self, path: str, body: str) -> bool:
        fs, p = self._fs(path)
        fs.mkdirs(p.getParent())
        try:
            out = fs.create(p, False)
        except Exception:  # noqa: BLE001 - FileAlreadyExistsException through py4j
            return False
        self._put(out, body)
        return True

    def read(self, path: str) -> tuple[str, int] | None:
        fs, p = self._fs(path)
        try:
            status, stream = fs.getFileStatus(p), fs.open(p)
        except Exception:  # noqa: BLE001 - FileNotFoundException through py4j
            return None
        try:
            reader = self.jvm.java.io.BufferedReader(self.jvm.java.io.InputStreamReader(stream, "UTF-8"))
            return reader.readLine() or "", int(status.getModificationTime()) * 1000
        finally:
            stream.close()

    def delete(self, path: str) -> None:
        fs, p = self._fs(path)
        fs.delete(p, False)

    def touch(self, path: str) -> None:
        fs, p = self._fs(path)
        if uris.is_object_store(path):
            # Object stores keep no settable modification time (S3A's setTimes does nothing): the heartbeat
            # rewrites the object, which a PUT replaces whole (a reader sees the old body or the new one).
            found = self.read(path)
            if found is not None:
                self._put(fs.create(p, True), found[0])
            return
        fs.setTimes(p, int(time.time() * 1000), -1)


def _store(spark: SparkSession, path: str):
    return _LocalStore() if uris.is_local(path) else _HadoopStore(spark)


def lease_path(where: Placement, role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"lease role {role!r} is not one of {ROLES}")
    return where.lease(role)


def _read(store, path: str) -> tuple[Lease, int] | None:
    """(lease, heartbeat µs) of the file at ``path``, or None when there is none."""
    found = store.read(path)
    if found is None or not found[0]:
        return None
    return Lease(**json.loads(found[0]), path=path), found[1]


def _body(lease: Lease) -> str:
    return json.dumps({k: v for k, v in lease.__dict__.items() if k != "path"})


def _alive(lease: Lease, heartbeat_us: int, stale_after_s: float) -> bool:
    if lease.host == socket.gethostname():
        try:
            os.kill(lease.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return (time.time_ns() // 1000 - heartbeat_us) / 1e6 < stale_after_s


def _heartbeat(store, path: str, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        try:
            store.touch(path)
        except Exception:  # noqa: BLE001 - released, taken over, or the session stopped
            return


def acquire(
    spark: SparkSession,
    where: Placement,
    role: str,
    holder: str,
    *,
    take_over: bool = False,
    stale_after_s: float = STALE_AFTER_S,
    heartbeat_s: float = HEARTBEAT_S,
) -> Lease:
    """Takes the pipeline's ``role`` lease for ``holder`` or raises :class:`LeaseHeld` naming its holder."""
    path = lease_path(where, role)
    store = _store(spark, path)
    if isinstance(store, _LocalStore):
        path = uris.local_path(path)
    what = {"backlog": "backlog", "live": "live phase", "redeploy": "redeploy"}[role]
    with _lock:
        if path in _held and _held[path][0].holder == holder:
            lease, count, stop = _held[path]
            _held[path] = (lease, count + 1, stop)
            return lease
        mine = Lease(where.name, role, holder, socket.gethostname(), os.getpid(), time.time_ns() // 1000, path)
        for _ in range(2):
            if store.create(path, _body(mine)):
                stop = threading.Event()
                threading.Thread(target=_heartbeat, args=(store, path, stop, heartbeat_s), daemon=True).start()
                _held[path] = (mine, 1, stop)
                return mine
            found = _read(store, path)
            if found is None:
                continue  # released between our create and read: try once more
            other, beat = found
            if not take_over and not _alive(other, beat, stale_after_s):
                gone = (
                    "its process is gone"
                    if other.host == socket.gethostname()
                    else f"it has sent no heartbeat for {stale_after_s:g} s"
                )
                raise LeaseHeld(
                    f"pipeline {where.name!r}: its {what} lease is held by {other.describe(beat)}, but {gone} "
                    f"(killed, or its machine lost). Taking it over is safe: start again with take_over=True "
                    f"(lease file {path})."
                )
            if not take_over:
                raise LeaseHeld(
                    f"pipeline {where.name!r}: its {what} is held by {other.describe(beat)}; a second one is "
                    f"refused and the running one goes on. Stop that run first. If its process is gone "
                    f"(killed, machine lost), start again with take_over=True (lease file {path})."
                )
            if _alive(other, beat, stale_after_s):
                raise LeaseHeld(
                    f"pipeline {where.name!r}: cannot take over its {what} lease: the holder "
                    f"{other.describe(beat)} is still alive (its process runs, or its heartbeat is younger than "
                    f"{stale_after_s:g} s). Stop it first."
                )
            _remove_dead(store, path, other, stale_after_s, where.name, what)
            take_over = False  # the dead holder's file is out of the way; now create ours
        raise LeaseHeld(f"pipeline {where.name!r}: could not take the {what} lease at {path}")


def _remove_dead(store, path: str, dead: Lease, stale_after_s: float, pipeline: str, what: str) -> None:
    """Deletes the dead holder's file, guarded by a takeover lock so that of two racing takers only one
    deletes, and only the file it judged dead (not a lease a faster taker has created since)."""
    lock = f"{path}.takeover"
    stale = _read(store, lock)
    if stale is not None and not _alive(stale[0], stale[1], stale_after_s):
        store.delete(lock)  # a taker that died half-way
    me = Lease(pipeline, "takeover", uuid.uuid4().hex, socket.gethostname(), os.getpid(), time.time_ns() // 1000, lock)
    if not store.create(lock, _body(me)):
        raise LeaseHeld(f"pipeline {pipeline!r}: another run is taking over the {what} lease right now ({path})")
    try:
        current = _read(store, path)
        if current is not None:
            if (current[0].holder, current[0].since_us) != (dead.holder, dead.since_us):
                raise LeaseHeld(
                    f"pipeline {pipeline!r}: the {what} lease changed hands while taking it over; it is now held "
                    f"by {current[0].describe(current[1])}"
                )
            store.delete(path)
    finally:
        store.delete(lock)


def release(spark: SparkSession, lease: Lease) -> None:
    """Drops one hold of ``lease``; the last one stops the heartbeat and deletes the file if it is still ours."""
    with _lock:
        entry = _held.get(lease.path)
        if entry is None or entry[0].holder != lease.holder:
            return
        held, count, stop = entry
        if count > 1:
            _held[lease.path] = (held, count - 1, stop)
            return
        del _held[lease.path]
        stop.set()
        store = _store(spark, lease.path)
        found = _read(store, lease.path)
        if found is not None and found[0].holder == held.holder and found[0].since_us == held.since_us:
            store.delete(lease.path)


def holder(spark: SparkSession, where: Placement, role: str) -> tuple[Lease, bool] | None:
    """The holder of the pipeline's ``role`` lease and whether it is alive (None: the lease is free)."""
    path = lease_path(where, role)
    store = _store(spark, path)
    if isinstance(store, _LocalStore):
        path = uris.local_path(path)
    found = _read(store, path)
    if found is None:
        return None
    return found[0], _alive(found[0], found[1], STALE_AFTER_S)


# --- stop requests ----------------------------------------------------------------------------------------------
# A run asks the holder of a pipeline's live lease to stop (a redeploy, before it swaps the sink): a small JSON file
# beside the lease file, which the running live phase polls (:mod:`phases._internal.live.runner`). It names who asks and
# why.


@dataclass(frozen=True)
class StopRequest:
    requested_by: str
    reason: str
    at_us: int


def _stop_path(spark: SparkSession, where: Placement, role: str):
    path = lease_path(where, role).removesuffix(".json") + ".stop.json"
    store = _store(spark, path)
    return store, uris.local_path(path) if isinstance(store, _LocalStore) else path


def request_stop(spark: SparkSession, where: Placement, role: str, requested_by: str, reason: str) -> StopRequest:
    """Asks the run holding the pipeline's ``role`` lease to stop at its next micro-batch boundary."""
    store, path = _stop_path(spark, where, role)
    request = StopRequest(requested_by, reason, time.time_ns() // 1000)
    store.delete(path)
    store.create(path, json.dumps(request.__dict__))
    return request


def stop_request(spark: SparkSession, where: Placement, role: str) -> StopRequest | None:
    """The pending request to stop the pipeline's ``role`` run, if any."""
    store, path = _stop_path(spark, where, role)
    found = store.read(path)
    if found is None or not found[0]:
        return None
    try:
        return StopRequest(**json.loads(found[0]))
    except (ValueError, TypeError):
        return None


def clear_stop_request(spark: SparkSession, where: Placement, role: str) -> None:
    store, path = _stop_path(spark, where, role)
    store.delete(path)


class hold:  # noqa: N801 - used as a context manager, like open()
    """``with hold(spark, pipeline, "backlog", holder): ...`` acquires and always releases."""

    def __init__(self, spark: SparkSession, where: Placement, role: str, holder: str, **kwargs):
        self.spark, self.where, self.role, self.holder, self.kwargs = spark, where, role, holder, kwargs
        self.lease: Lease | None = None

    def __enter__(self) -> Lease:
        self.lease = acquire(self.spark, self.where, self.role, self.holder, **self.kwargs)
        return self.lease

    def __exit__(self, *exc) -> None:
        if self.lease is not None:
            release(self.spark, self.lease)
