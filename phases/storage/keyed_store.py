"""Spark's state store (RocksDB, changelog checkpointing) used as a library: per-key state with point lookups.

The live phase's keyed state lives in one such store per run instead of a Delta table that every micro-batch
would scan. The JVM side is the engine's helper (``jvm/``, ``org.apache.spark.sql.phases.KeyedStateStore``):

- rows are keys + values; ``partitions`` store partitions, a key in the one ``repartition(partitions, keys)``
  sends it to (the same every micro-batch, so a key always meets its own state);
- version ``v`` is the state after ``v`` updates. :meth:`KeyedStore.update` at version ``v`` loads ``v``, combines
  each key's stored values with the new ones (SQL expressions bound in the JVM: no Python runs per record) and
  commits ``v + 1``. A replayed update loads the same ``v`` again, so it writes what the first attempt wrote;
- version 1 is written from the handoff's state (:meth:`KeyedStore.write`), version 0 is the empty store.

Spark's own watermark is not involved: the caller tags records by the version watermark before they get here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from phases import spark_internals
from phases.errors import StateStoreError
from phases.runtime.session import LIVE_STATE_PARTITIONS
from phases.storage import fs

log = logging.getLogger(__name__)

_LAYOUT = re.compile(r"^p[0-9]+-[0-9a-f]{12}$")  # a layout's folder: partitions, then the description's hash
SEEDED = "_seeded.json"  # a layout's version 1 is whole: its schema, keys, values and partitions


@dataclass(frozen=True)
class StatePosition:
    """Where an operator's live state is: a layout of the run's state store and a version of it (what a
    progress record names, so that the next micro-batch loads exactly that version)."""

    layout: str
    version: int


@dataclass
class StoreUpdate:
    """One update's result: the changed keys' new rows (cached until :meth:`release`) and counts."""

    rows: DataFrame
    changed_keys: int
    version: int  # the version committed
    _handle: object
    route: str = "shuffled"  # how the rows reached the store's partitions: grouped (no shuffle) or shuffled

    def release(self) -> None:
        self._handle.release()

    @property
    def profile(self) -> dict[str, int]:
        """Where the update's task time went, summed over its store tasks: ``rowsMs`` (reading its rows, the
        shuffle read included, combining them, the store's gets and puts), ``commitMs``, and every figure RocksDB
        reports for a task (``rocksdbLoadLatencyMs``, ``rocksdbGetLatency``, ``rocksdbPutLatency`` and their counts,
        ``rocksdbReadBlockCacheMissCount``, the commit's steps, ...). Empty for a lookup, which commits nothing."""
        return {str(k): int(v) for k, v in dict(self._handle.profiled()).items()}

    def profile_summary(self) -> dict[str, int]:
        """The :attr:`profile`'s main figures under short names (:data:`PROFILE_FIGURES`)."""
        profile = self.profile
        return {short: profile[name] for short, name in PROFILE_FIGURES.items() if name in profile}


# The main figures of a store update's profile: short name -> the helper's or RocksDB's name (milliseconds are task
# time summed over the store's tasks, which run in parallel).
PROFILE_FIGURES = {
    "tasks": "tasks",
    "rows_ms": "rowsMs",
    "commit_ms": "commitMs",
    "load_ms": "rocksdbLoadLatencyMs",
    "replay_ms": "rocksdbReplayChangeLogLatencyMs",
    "gets": "rocksdbGetCount",
    "get_ms": "rocksdbGetLatency",
    "puts": "rocksdbPutCount",
    "put_ms": "rocksdbPutLatency",
    "cache_misses": "rocksdbReadBlockCacheMissCount",
}


class KeyedStore:
    """The store at ``path``: ``keys`` -> ``values`` (columns of ``schema``), in ``partitions`` partitions.

    ``order``: a long key column the keys are stored in the order of (windows: their end), so that an update can
    close the rows at or below a bound by an ordered read of each partition's start (``close_at``).

    ``sessions``: the (start, end) long columns of session windows (microseconds): ``keys`` are then the group keys,
    a key's open sessions are read by a prefix scan and merged with a batch's records by Spark's session rule, and
    the rows an update takes and returns are keys, start, end and values (``org.apache.spark.sql.phases.
    SessionStateStore``).

    ``whole_rows``: the rows are read with :meth:`lookup` and replaced whole with :meth:`replace` (their new values
    computed outside the store: a process function's Python pass, an interval join's held rows; ``RowStateStore``);
    ``timers``: such a store's value column of timers (array of long, epoch milliseconds), indexed in time order so
    that a lookup finds the keys with a due timer without a scan."""

    def __init__(
        self,
        spark: SparkSession,
        path: str,
        keys: list[str],
        values: list[str],
        schema: T.StructType,
        partitions: int,
        run_id: str | None = None,
        order: str | None = None,
        sessions: tuple[str, str] | None = None,
        whole_rows: bool = False,
        timers: str | None = None,
    ):
        self.spark, self.path, self.keys, self.values, self.partitions = spark, path, keys, values, partitions
        self.whole_rows, self.timers = whole_rows or timers is not None, timers
        # One id per opening: Spark keeps a store's provider loaded in its executor under (store, run id), so the
        # next micro-batch finds the version it needs already in memory.
        self.run_id = run_id or str(uuid.uuid4())
        jvm = spark_internals.jvm(spark).org.apache.spark.sql.phases
        try:
            if self.whole_rows:
                self.order = None
                self._store = jvm.RowStateStore.open(
                    spark_internals.java_session(spark),
                    path,
                    keys,
                    values,
                    timers,
                    schema.json(),
                    partitions,
                    self.run_id,
                )
            elif sessions is not None:
                start, end = sessions
                self.order = end
                self._store = jvm.SessionStateStore.open(
                    spark_internals.java_session(spark),
                    path,
                    keys,
                    start,
                    end,
                    values,
                    schema.json(),
                    partitions,
                    self.run_id,
                )
            else:
                self.order = order
                self._store = jvm.KeyedStateStore.open(
                    spark_internals.java_session(spark),
                    path,
                    keys,
                    values,
                    schema.json(),
                    partitions,
                    self.run_id,
                    order,
                )
        except (Py4JJavaError, PySparkException) as exc:
            raise StateStoreError(f"cannot open the state store {path}: {_java_message(exc)}") from exc

    def update(self, partials: DataFrame, combine: list[str], version: int) -> StoreUpdate:
        """Combines ``partials`` (keys + values; a key's rows combine in turn) into version ``version``; commits
        ``version + 1`` and returns the changed keys' rows. ``combine``: per value column, SQL over ``t.`col```
        (stored) and ``s.`col``` (new)."""
        return self._update(partials, combine, version, emit=True)

    def update_and_close(
        self, partials: DataFrame, combine: list[str], version: int, close_at: int | None
    ) -> StoreUpdate:
        """Combines ``partials`` into version ``version`` like :meth:`update`, then removes the rows whose order
        column is at or below ``close_at`` (None: none); commits ``version + 1`` and returns the rows it removed
        (their values with this update's combined in)."""
        if self.order is None:
            raise StateStoreError(f"the state store {self.path} has no order column: it cannot close rows")
        return self._update(partials, combine, version, emit=False, close_at=close_at)

    def lookup(self, keys: DataFrame, version: int, due_at: int | None) -> StoreUpdate:
        """A whole-row store's rows at ``version`` of the keys in ``keys`` and, unless ``due_at`` is None, of every key
        with a timer due at it (epoch microseconds: a timer ``t`` ms is due when ``t * 1000 <= due_at``); cached until
        released; nothing is committed (the result's version is ``version``)."""
        self._need_whole_rows("look keys up")
        if due_at is not None and self.timers is None:
            raise StateStoreError(f"the state store {self.path} has no timers column: no timer can be due")
        try:
            handle = self._store.lookup(spark_internals.java_frame(keys), version, due_at)
        except (Py4JJavaError, PySparkException) as exc:
            raise self._failed(version, exc) from exc
        return StoreUpdate(
            spark_internals.frame_of(handle.frame(), self.spark), int(handle.changedKeys()), version, handle
        )

    def replace(self, rows: DataFrame, version: int) -> StoreUpdate:
        """A whole-row store's rows of the keys in ``rows`` (one per key) replaced at ``version`` (their timers' index
        entries too); commits ``version + 1``."""
        self._need_whole_rows("replace rows")
        return self._update(rows, [f"s.`{c}`" for c in self.values], version, emit=False)

    def _need_whole_rows(self, what: str) -> None:
        if not self.whole_rows:
            raise StateStoreError(
                f"the state store {self.path} combines values, it does not keep whole rows: it cannot {what}"
            )

    def write(self, state: DataFrame) -> StoreUpdate:
        """Writes version 1 from ``state`` (one row per key), whatever the store held."""
        return self._update(state, [f"s.`{c}`" for c in self.values], 0, emit=False)

    def _update(
        self, partials: DataFrame, combine: list[str], version: int, emit: bool, close_at: int | None = None
    ) -> StoreUpdate:
        try:
            handle = self._store.update(spark_internals.java_frame(partials), combine, version, emit, close_at)
        except (Py4JJavaError, PySparkException) as exc:
            raise self._failed(version, exc) from exc
        rows = spark_internals.frame_of(handle.frame(), self.spark)
        update = StoreUpdate(rows, int(handle.changedKeys()), version + 1, handle, str(handle.route()))
        if log.isEnabledFor(logging.DEBUG):
            summary = update.profile_summary()
            log.debug(
                "state store %s: version %d -> %d, %d rows out, %s",
                self.path,
                version,
                version + 1,
                update.changed_keys,
                summary,
                extra={"store_profile": summary},
            )
        return update

    def _failed(self, version: int, exc: Exception) -> StateStoreError:
        return StateStoreError(
            f"the state store {self.path} could not go from version {version} to {version + 1}: "
            f"{_java_message(exc)}. When its files were removed or damaged: restore the live run's folder "
            "(the store, the progress log and the checkpoint together, from one backup), or start over with "
            "BacklogRunner(spark, pipeline).run(reset=True)"
        )

    def read(self, version: int) -> DataFrame:
        """Every row of the store at ``version`` (keys + values)."""
        return spark_internals.frame_of(self._store.read(version), self.spark)

    def unload(self) -> int:
        """Unloads this opening's store from the executors (a stopped live phase's last step): each partition first
        uploads the newest snapshot its commits queued, so that the next opening loads it instead of replaying the
        changelogs since Spark's maintenance thread last ran; then it frees its memory. Returns the partitions
        unloaded (those loaded nowhere are skipped). The opening can still be used: its next update loads again."""
        try:
            return int(self._store.unload())
        except (Py4JJavaError, PySparkException) as exc:
            raise StateStoreError(f"could not unload the state store {self.path}: {_java_message(exc)}") from exc


def _java_message(exc: Exception) -> str:
    if isinstance(exc, Py4JJavaError):
        return str(exc.java_exception.toString()).splitlines()[0][:500]
    return str(exc).splitlines()[0][:500]


def new_store_partitions(spark: SparkSession) -> int:
    """A new live run's store partitions: the session's ``SparkSettings.live_state_partitions`` (by default its task
    slots). Each partition is one task of every micro-batch, which loads and commits its part of the store: more
    partitions than slots only queue."""
    configured = spark.conf.get(LIVE_STATE_PARTITIONS, None)
    return int(configured) if configured else spark.sparkContext.defaultParallelism


class LiveStateStore:
    """A live run's state store for one state layout (key and value columns and types, partitions), under
    ``root/<layout>``: the layout is named by a hash of the schema, so a schema change (a widened source
    type) moves the state to a new layout, written from the old one at the position the progress names.

    Version 1 of a layout is its starting state: the handoff's (``seed``: the handoff's state table, or the
    rows the backlog passes when it writes it ahead), or the previous layout's state. ``_seeded.json`` is
    written once it is whole.

    ``partitions`` (None: chosen once): the run keeps the partitions of a layout it already wrote (otherwise a
    restart on another number of cores would rewrite its state), and a new run's store takes
    :func:`new_store_partitions`."""

    def __init__(
        self,
        spark: SparkSession,
        root: str,
        keys: list[str],
        values: list[str],
        schema: T.StructType,
        partitions: int | None = None,
        order: str | None = None,
        sessions: tuple[str, str] | None = None,
        whole_rows: bool = False,
        timers: str | None = None,
    ):
        self.spark, self.root, self.keys, self.values = spark, root, keys, values
        columns = [*keys, *(sessions or ()), *values]  # the rows the store takes and returns
        self.schema = T.StructType([schema[c] for c in columns])
        layout = {"keys": keys, "values": values, "schema": self.schema.jsonValue()}
        # (A plain layout's description, and so its name, is as it was before orders and sessions existed.)
        if order is not None:
            layout["order"] = order
        if sessions is not None:
            layout["sessions"] = list(sessions)
        if whole_rows:
            layout["whole_rows"] = True
        if timers is not None:
            layout["timers"] = timers
        if partitions is None:
            partitions = self._written_partitions(layout) or new_store_partitions(spark)
        self.partitions = partitions
        layout["partitions"] = partitions
        described = json.dumps(layout, sort_keys=True)
        self.description = described
        self.layout = f"p{partitions}-{hashlib.sha256(described.encode()).hexdigest()[:12]}"
        self.store = KeyedStore(
            spark,
            f"{root}/{self.layout}",
            keys,
            values,
            self.schema,
            partitions,
            order=order,
            sessions=sessions,
            whole_rows=whole_rows,
            timers=timers,
        )

    def _written_partitions(self, layout: dict) -> int | None:
        """The partitions of a layout of this run written before with the same columns (the first, by name)."""
        if not fs.exists(self.spark, self.root):
            return None
        for name in sorted(fs.list_names(self.spark, self.root)):
            seeded = self._seeded(name) if _LAYOUT.match(name) else None
            if seeded is not None and {k: v for k, v in seeded.items() if k != "partitions"} == layout:
                return int(seeded["partitions"])
        return None

    def _seeded(self, layout: str) -> dict | None:
        path = f"{self.root}/{layout}/{SEEDED}"
        return json.loads(fs.read_text(self.spark, path)) if fs.exists(self.spark, path) else None

    def write_start(self, rows: DataFrame) -> None:
        """Writes version 1 from ``rows`` (one row per key, the layout's columns) and marks it whole."""
        marker = f"{self.root}/{self.layout}/{SEEDED}"
        fs.delete_file(self.spark, marker)
        written = self.store.write(
            rows.select(
                *[
                    rows[f"`{c}`"].cast(f.dataType).alias(c)
                    for c, f in zip(self.schema.fieldNames(), self.schema.fields, strict=True)
                ]
            )
        )
        written.release()
        log.info("state store %s/%s: version 1 written, its rows %s", self.root, self.layout, written.route)
        fs.create_once(self.spark, marker, self.description)

    def version_for(self, position: StatePosition | None, handoff_state: Callable[[], DataFrame]) -> int:
        """The version a micro-batch loads after ``position`` (None: the handoff's state, not in a store yet);
        writes version 1 of this layout first when the state is elsewhere."""
        if position is not None and position.layout == self.layout:
            return position.version
        if position is None:
            if self._seeded(self.layout) is None:  # else the backlog (or an earlier start) wrote it
                self.write_start(handoff_state())
            return 1
        before = self._seeded(position.layout)
        if before is None:
            raise StateStoreError(
                f"the live state is in layout {position.layout} of {self.root}, whose description "
                f"{position.layout}/{SEEDED} is gone; restore the run's folder or start over from the backlog"
            )
        old = KeyedStore(
            self.spark,
            f"{self.root}/{position.layout}",
            before["keys"],
            before["values"],
            T.StructType.fromJson(before["schema"]),
            int(before["partitions"]),
            order=before.get("order"),
            sessions=tuple(before["sessions"]) if "sessions" in before else None,
            whole_rows=bool(before.get("whole_rows")),
            timers=before.get("timers"),
        )
        self.write_start(old.read(position.version))
        return 1
