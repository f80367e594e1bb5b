"""Spark's state store (RocksDB, changelog checkpointing) used as a library: per-key state with point lookups.

The live phase's keyed state lives in one such store per run instead of a Delta table that every micro-batch
would scan. The JVM side is the engine's helper (``jvm/``, package ``org.apache.spark.sql.phases``). A store's
:class:`StoreLayout` says what it keeps and opens its own store type, with only the operations it supports:

- :class:`CombinedLayout` -> :class:`KeyedStateStore` (``update``: the changed keys) for keyed aggregations;
- :class:`OrderedLayout` -> :class:`OrderedStateStore` (``update_and_close``: rows closed at a bound) for windows and
  co-groups;
- :class:`SessionLayout` -> :class:`SessionStateStore` (``update_and_close`` by Spark's session rule) for sessions;
- :class:`RowLayout` -> :class:`RowStateStore` (``lookup``, ``replace``; timers indexed) for process functions and
  interval joins.

Every store: rows are its layout's columns; ``partitions`` store partitions, a key in the one
``repartition(partitions, keys)`` sends it to (the same every micro-batch, so a key always meets its own state);
version ``v`` is the state after ``v`` updates: an update at ``v`` loads ``v`` and commits ``v + 1`` (a replayed
update loads the same ``v`` again, so it writes what the first attempt wrote); version 1 is written from the
handoff's state (:meth:`StoreBase.write`), version 0 is the empty store. Combining happens in the JVM by SQL
expressions bound there: no Python runs per record.

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

from phases._internal import spark_internals
from phases._internal.errors import StateStoreError
from phases._internal.runtime.session import LIVE_STATE_PARTITIONS
from phases._internal.storage import fs

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
        self._handle.release()  # pyright: ignore[reportAttributeAccessIssue]

    @property
    def profile(self) -> dict[str, int]:
        """Where the update's task time went, summed over its store tasks: ``rowsMs`` (reading its rows, the
        shuffle read included, combining them, the store's gets and puts), ``commitMs``, and every figure RocksDB
        reports for a task (``rocksdbLoadLatencyMs``, ``rocksdbGetLatency``, ``rocksdbPutLatency`` and their counts,
        ``rocksdbReadBlockCacheMissCount``, the commit's steps, ...). Empty for a lookup, which commits nothing."""
        # The map's text in one call into the JVM ("{name=value, ...}": names are identifiers, values integers); a
        # dict() of the map itself takes a call per key and per value (about 170 for a RocksDB store's).
        text = str(self._handle.profiled().toString()).strip("{}")  # pyright: ignore[reportAttributeAccessIssue]
        return {k.strip(): int(v) for k, v in (item.split("=", 1) for item in text.split(", ") if item)}

    @property
    def new_keys(self) -> int | None:
        """How many of the changed keys the store did not hold before (a combining update's; None for the other
        layouts). Counted by the tasks that also count :attr:`StoreUpdate.changed_keys` (the job that caches the
        rows): Spark applies a result task's accumulator updates once, from the attempt whose result it keeps, so the
        two agree. An upsert sink holds a row for every key the store holds, so when the two are equal no changed key
        is in the sink and its rows are appended (:func:`phases._internal.storage.tables.upsert_write`)."""
        return self.profile.get(NEW_KEYS)

    def profile_summary(self) -> dict[str, int]:
        """The :attr:`profile`'s main figures under short names (:data:`PROFILE_FIGURES`)."""
        profile = self.profile
        return {short: profile[name] for short, name in PROFILE_FIGURES.items() if name in profile}


NEW_KEYS = "newKeys"  # a combining update's profile figure: the keys it added (the helper's StoreProfile.NewKeys)

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
    "new_keys": NEW_KEYS,
    "bulk_rows": "bulkRows",
    "bulk_ms": "bulkWriteMs",
}


@dataclass(frozen=True)
class StoreLayout:
    """What a store keeps, and so which of the helper's store classes holds it: ``keys`` -> ``values``. Each layout
    opens a store of its own type, with only the operations that layout supports. Its description (and so the folder
    name a run's state gets, :class:`LiveStateStore`) names the columns and what orders them."""

    keys: tuple[str, ...]
    values: tuple[str, ...]

    def columns(self) -> list[str]:
        """The rows the store takes and returns, in this order."""
        return [*self.keys, *self.values]

    def described(self) -> dict:
        return {"keys": list(self.keys), "values": list(self.values)}

    def open(self, spark: SparkSession, path: str, schema: T.StructType, partitions: int, run_id: str) -> StoreBase:
        raise NotImplementedError

    @staticmethod
    def from_description(described: dict) -> StoreLayout:
        """The layout a description (``_seeded.json``) names."""
        keys, values = tuple(described["keys"]), tuple(described["values"])
        if "sessions" in described:
            start, end = described["sessions"]
            return SessionLayout(keys, values, start, end)
        if described.get("whole_rows"):
            return RowLayout(keys, values, described.get("timers"))
        if "order" in described:
            return OrderedLayout(keys, values, described["order"])
        return CombinedLayout(keys, values)


@dataclass(frozen=True)
class CombinedLayout(StoreLayout):
    """Key -> values combined by SQL; an update returns the changed keys (keyed aggregations)."""

    def open(self, spark, path, schema, partitions, run_id) -> KeyedStateStore:
        return KeyedStateStore(spark, path, self, schema, partitions, run_id)


@dataclass(frozen=True)
class OrderedLayout(StoreLayout):
    """As :class:`CombinedLayout`, the keys stored in the order of the long key column ``order``, so that an update
    closes the rows at or below a bound by an ordered read of each partition's start (windows by their end,
    co-groups)."""

    order: str = ""

    def described(self) -> dict:
        return {**super().described(), "order": self.order}

    def open(self, spark, path, schema, partitions, run_id) -> OrderedStateStore:
        return OrderedStateStore(spark, path, self, schema, partitions, run_id)


@dataclass(frozen=True)
class SessionLayout(StoreLayout):
    """Session windows: ``keys`` are the group keys, (``start``, ``end``) the long session columns (microseconds). A
    key's open sessions are read by a prefix scan and merged with a batch's records by Spark's session rule; the rows
    an update takes and returns are keys, start, end and values."""

    start: str = ""
    end: str = ""

    def columns(self) -> list[str]:
        return [*self.keys, self.start, self.end, *self.values]

    def described(self) -> dict:
        return {**super().described(), "sessions": [self.start, self.end]}

    def open(self, spark, path, schema, partitions, run_id) -> SessionStateStore:
        return SessionStateStore(spark, path, self, schema, partitions, run_id)


@dataclass(frozen=True)
class RowLayout(StoreLayout):
    """Whole rows by key, looked up and replaced by the caller (their new values computed outside the store: a process
    function's Python pass, an interval join's held rows). ``timers``: a value column of timers (array of long, epoch
    milliseconds), indexed in time order so that a lookup finds the keys with a due timer without a scan."""

    timers: str | None = None

    def described(self) -> dict:
        described = {**super().described(), "whole_rows": True}
        if self.timers is not None:
            described["timers"] = self.timers
        return described

    def open(self, spark, path, schema, partitions, run_id) -> RowStateStore:
        return RowStateStore(spark, path, self, schema, partitions, run_id)


class StoreBase:
    """The store at ``path`` of a :class:`StoreLayout` (rows of the layout's columns, typed by ``schema``), in
    ``partitions`` partitions: what every layout's store does (write version 1, read a version, unload). Open one with
    ``layout.open(...)``; each layout's own operations are on its subclass."""

    _helper_class = ""  # the helper's class (org.apache.spark.sql.phases.<name>)

    def __init__(
        self,
        spark: SparkSession,
        path: str,
        layout: StoreLayout,
        schema: T.StructType,
        partitions: int,
        run_id: str | None = None,
    ):
        self.spark, self.path, self.layout, self.partitions = spark, path, layout, partitions
        self.keys, self.values = list(layout.keys), list(layout.values)
        # One id per opening: Spark keeps a store's provider loaded in its executor under (store, run id), so the
        # next micro-batch finds the version it needs already in memory.
        self.run_id = run_id or str(uuid.uuid4())
        helper = getattr(spark_internals.jvm(spark).org.apache.spark.sql.phases, self._helper_class)
        try:
            self._store = helper.open(spark_internals.java_session(spark), path, *self._open_arguments(schema))
        except (Py4JJavaError, PySparkException) as exc:
            raise StateStoreError(f"cannot open the state store {path}: {_java_message(exc)}") from exc

    def _open_arguments(self, schema: T.StructType) -> list:
        return [self.keys, self.values, schema.json(), self.partitions, self.run_id]

    def write(self, state: DataFrame) -> StoreUpdate:
        """Writes version 1 from ``state`` (one row per key, the layout's columns), whatever the store held."""
        return self._call("writeStart", 0, spark_internals.java_frame(state))

    def read(self, version: int) -> DataFrame:
        """Every row of the store at ``version`` (the layout's columns)."""
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

    def _call(self, method: str, version: int, *arguments, commits: bool = True) -> StoreUpdate:
        """The helper's ``method`` on the version the store holds after ``version`` updates; commits ``version + 1``
        unless ``commits`` is false (a lookup)."""
        try:
            handle = getattr(self._store, method)(*arguments)
        except (Py4JJavaError, PySparkException) as exc:
            raise self._failed(version, exc) from exc
        rows = spark_internals.frame_of(handle.frame(), self.spark)
        update = StoreUpdate(
            rows, int(handle.changedKeys()), int(handle.committedVersion()), handle, str(handle.route())
        )
        if commits and log.isEnabledFor(logging.DEBUG):
            summary = update.profile_summary()
            log.debug(
                "state store %s: version %d -> %d, %d rows out, %s",
                self.path,
                version,
                update.version,
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


class CombiningStore(StoreBase):
    """The stores that combine the batch's rows into their key's stored values (the helper's ``CombiningStore``, the
    base of its ``KeyedStateStore`` and ``OrderedStateStore``)."""


class KeyedStateStore(CombiningStore):
    """:class:`CombinedLayout`'s store (the helper's ``KeyedStateStore``)."""

    _helper_class = "KeyedStateStore"

    def update(self, partials: DataFrame, combine: list[str], version: int) -> StoreUpdate:
        """Combines ``partials`` (keys + values; a key's rows combine in turn) into version ``version``; commits
        ``version + 1`` and returns the changed keys' rows. ``combine``: per value column, SQL over ``t.`col```
        (stored) and ``s.`col``` (new)."""
        return self._call("update", version, spark_internals.java_frame(partials), combine, version)


class ClosingUpdate(StoreBase):
    """The call a store whose update also closes makes (the helper's ``updateAndClose`` of ``OrderedStateStore`` and
    ``SessionStateStore``): the batch's rows combined in, then the rows at or below a bound removed and returned, in
    one commit."""

    def update_and_close(self, rows: DataFrame, combine: list[str], version: int, close_at: int | None) -> StoreUpdate:
        """Combines ``rows`` into version ``version`` (an ordered store: by key, as :meth:`KeyedStateStore.update`
        does; a session store: each record's own session merged with its key's open sessions by Spark's session
        rule), then removes the rows (sessions) whose order column (end) is at or below ``close_at`` (None: none);
        commits ``version + 1`` and returns the rows it removed, with this update's values combined in."""
        return self._call("updateAndClose", version, spark_internals.java_frame(rows), combine, version, close_at)


class OrderedStateStore(CombiningStore, ClosingUpdate):
    """:class:`OrderedLayout`'s store (the helper's ``OrderedStateStore``)."""

    _helper_class = "OrderedStateStore"
    layout: OrderedLayout

    def _open_arguments(self, schema: T.StructType) -> list:
        return [*super()._open_arguments(schema), self.layout.order]


class SessionStateStore(ClosingUpdate):
    """:class:`SessionLayout`'s store (the helper's ``SessionStateStore``)."""

    _helper_class = "SessionStateStore"
    layout: SessionLayout

    def _open_arguments(self, schema: T.StructType) -> list:
        return [self.keys, self.layout.start, self.layout.end, self.values, schema.json(), self.partitions, self.run_id]


class RowStateStore(StoreBase):
    """:class:`RowLayout`'s store (the helper's ``RowStateStore``)."""

    _helper_class = "RowStateStore"
    layout: RowLayout

    def _open_arguments(self, schema: T.StructType) -> list:
        return [self.keys, self.values, self.layout.timers, schema.json(), self.partitions, self.run_id]

    def lookup(self, keys: DataFrame, version: int, due_at: int | None) -> StoreUpdate:
        """The rows at ``version`` of the keys in ``keys`` and, unless ``due_at`` is None, of every key with a timer
        due at it (epoch microseconds: a timer ``t`` ms is due when ``t * 1000 <= due_at``); cached until released;
        nothing is committed (the result's version is ``version``)."""
        if due_at is not None and self.layout.timers is None:
            raise StateStoreError(f"the state store {self.path} has no timers column: no timer can be due")
        keys_java = spark_internals.java_frame(keys)
        return self._call("lookup", version, keys_java, version, due_at, commits=False)

    def replace(self, rows: DataFrame, version: int) -> StoreUpdate:
        """The rows of the keys in ``rows`` (one per key) replaced at ``version`` (their timers' index entries too);
        commits ``version + 1``."""
        return self._call("replace", version, spark_internals.java_frame(rows), version)


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
    """A live run's state store for one state layout (a :class:`StoreLayout` with its columns' types, and
    partitions), under ``root/<layout>``: the layout is named by a hash of that description, so a schema change (a
    widened source type) moves the state to a new layout, written from the old one at the position the progress
    names.

    Version 1 of a layout is its starting state: the handoff's (the handoff's state table, or the rows the backlog
    passes when it writes it ahead), or the previous layout's state. ``_seeded.json`` is written once it is whole.

    ``partitions`` (None: chosen once): the run keeps the partitions of a layout it already wrote (otherwise a
    restart on another number of cores would rewrite its state), and a new run's store takes
    :func:`new_store_partitions`. ``store`` is the layout's own store type (:meth:`StoreLayout.open`)."""

    def __init__(
        self,
        spark: SparkSession,
        root: str,
        layout: StoreLayout,
        schema: T.StructType,
        partitions: int | None = None,
    ):
        self.spark, self.root, self.spec = spark, root, layout
        self.keys, self.values = list(layout.keys), list(layout.values)
        self.schema = T.StructType([schema[c] for c in layout.columns()])  # the rows the store takes and returns
        described = {**layout.described(), "schema": self.schema.jsonValue()}
        if partitions is None:
            partitions = self._written_partitions(described) or new_store_partitions(spark)
        self.partitions = partitions
        described["partitions"] = partitions
        self.description = json.dumps(described, sort_keys=True)
        self.layout = f"p{partitions}-{hashlib.sha256(self.description.encode()).hexdigest()[:12]}"
        self.store = layout.open(spark, f"{root}/{self.layout}", self.schema, partitions, None)  # pyright: ignore[reportArgumentType]

    def _written_partitions(self, described: dict) -> int | None:
        """The partitions of a layout of this run written before with the same columns (the first, by name)."""
        if not fs.exists(self.spark, self.root):
            return None
        for name in sorted(fs.list_names(self.spark, self.root)):
            seeded = self._seeded(name) if _LAYOUT.match(name) else None
            if seeded is not None and {k: v for k, v in seeded.items() if k != "partitions"} == described:
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
        old = StoreLayout.from_description(before).open(
            self.spark,
            f"{self.root}/{position.layout}",
            T.StructType.fromJson(before["schema"]),
            int(before["partitions"]),
            None,  # pyright: ignore[reportArgumentType]
        )
        self.write_start(old.read(position.version))
        return 1
