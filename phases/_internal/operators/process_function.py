"""Keyed process functions: user code with per-key state and event-time timers, run by both phases.

A user subclasses :class:`KeyedProcessFunction`::

    class Sessions(KeyedProcessFunction):
        output_schema = "session_start timestamp, session_end timestamp, events long"

        def process(self, key, rows, ctx):
            ...  # read/write ctx.value("..."), ctx.list("..."), ctx.map("..."); ctx.register_timer(t)
            yield {"session_start": ..., "session_end": ..., "events": ...}

        def on_timer(self, key, timestamp, ctx):
            ...

Semantics (the same in the backlog, after the switch, and in one streaming job over all the data). Source
versions arrive in commit order; ``W(v)`` is the watermark in force for version ``v``
(:mod:`phases._internal.lateness`). For every key, and every version ``v`` that holds on-time rows of it:

1. the key's timers with time ``<= W(v)`` fire, earliest first (``on_timer``; a timer registered while
   firing fires in the same round when it is also due);
2. ``process(key, rows, ctx)`` runs once with the key's rows of ``v``, ordered by event time (ties by
   the rows' values).

Timers also fire, without rows, as soon as the watermark passes them: at the end of the backlog up to the
final backlog watermark (FLIP-140 / FLIP-327), in the live phase when Spark's watermark passes them.
Timers have millisecond resolution (Spark's). State values must be JSON-like (None, bool, int, float,
str, lists, dicts with str keys) or datetimes; map-state keys must be str, int, float or bool.

:class:`KeyDriver` is the one implementation of these rules; the backlog runner (sorted partitions,
``mapInArrow``) and the live runner (``transformWithState``) only load and store what it holds.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from phases._internal.errors import DefinitionError, ProcessFunctionError
from phases._internal.runtime.user_code import load_function

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAP_KEY_TYPES = (str, int, float, bool)


class KeyedProcessFunction:
    """Base class of user process functions. Set ``output_schema`` (Spark DDL of the output columns; the
    pipeline's key columns are added in front) and implement :meth:`process` (and :meth:`on_timer` when
    registering timers). Instances must not keep per-key data in attributes: use ``ctx`` state."""

    output_schema: ClassVar[str] = ""

    def process(self, key: tuple, rows: list[dict], ctx: ProcessContext) -> Iterable[dict] | None:
        raise NotImplementedError

    def on_timer(self, key: tuple, timestamp: datetime, ctx: ProcessContext) -> Iterable[dict] | None:
        return None


# --- time and JSON codec -----------------------------------------------------------------------------


def to_us(value: datetime) -> int:
    """Microseconds since the epoch; a naive datetime is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - EPOCH) // _ONE_US


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


_ONE_US = timedelta(microseconds=1)
_SCALARS = (bool, int, float, str, datetime)


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, datetime):
        return {"$ts": to_us(value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    if isinstance(value, Mapping):
        _check_keys(value, where)
        return {k: _encode(v, where) for k, v in value.items()}
    raise _not_a_state_value(value, where)


def _check(value: Any, where: str) -> None:
    """What :func:`_encode` refuses, refused the same way, without building the encoded copy (a state write checks
    its value at once, so that the error names the write; the value is encoded once, when the key's state is
    dumped)."""
    if value is None or isinstance(value, _SCALARS):
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            if not (v is None or isinstance(v, _SCALARS)):
                _check(v, where)
        return
    if isinstance(value, Mapping):
        _check_keys(value, where)
        for v in value.values():
            _check(v, where)
        return
    raise _not_a_state_value(value, where)


def _check_keys(value: Mapping, where: str) -> None:
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise ProcessFunctionError(f"{where}: dict keys in state must be strings; got {bad[:3]!r}")


def _not_a_state_value(value: Any, where: str) -> ProcessFunctionError:
    return ProcessFunctionError(
        f"{where}: {type(value).__name__} is not a valid state value (None, bool, int, float, str, list, "
        "dict with str keys, datetime)"
    )


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and "$ts" in value:
            return from_us(value["$ts"])
        return {k: _decode(v) for k, v in value.items()}
    return value


# --- state handles -----------------------------------------------------------------------------------


class ValueState:
    def __init__(self, store: dict, name: str):
        self._store, self._name = store, name

    def get(self, default: Any = None) -> Any:
        return self._store.get(self._name, default)

    def set(self, value: Any) -> None:
        _check(value, f"value state {self._name!r}")
        self._store[self._name] = value

    def clear(self) -> None:
        self._store.pop(self._name, None)


class ListState:
    def __init__(self, store: dict, name: str):
        self._store, self._name = store, name

    def get(self) -> list:
        return list(self._store.get(self._name, []))

    def append(self, value: Any) -> None:
        _check(value, f"list state {self._name!r}")
        self._store.setdefault(self._name, []).append(value)

    def set(self, values: Iterable[Any]) -> None:
        values = list(values)
        _check(values, f"list state {self._name!r}")
        if values:
            self._store[self._name] = values
        else:
            self.clear()

    def clear(self) -> None:
        self._store.pop(self._name, None)


class MapState:
    def __init__(self, store: dict, name: str):
        self._store, self._name = store, name

    def _map(self) -> dict:
        return self._store.get(self._name, {})

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map().get(key, default)

    def __contains__(self, key: Any) -> bool:
        return key in self._map()

    def put(self, key: Any, value: Any) -> None:
        if not isinstance(key, _MAP_KEY_TYPES):
            raise ProcessFunctionError(
                f"map state {self._name!r}: key {key!r} is {type(key).__name__}; valid key types: str, int, float, bool"
            )
        _check(value, f"map state {self._name!r}")
        self._store.setdefault(self._name, {})[key] = value

    def remove(self, key: Any) -> None:
        m = self._map()
        m.pop(key, None)
        if not m:
            self.clear()

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def keys(self) -> list:
        return list(self._map())

    def clear(self) -> None:
        self._store.pop(self._name, None)


class ProcessContext:
    """What a process function sees of its key: state variables and timers."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.lists: dict[str, list] = {}
        self.maps: dict[str, dict] = {}
        self.timer_ms: list[int] = []  # sorted, unique

    def value(self, name: str) -> ValueState:
        return ValueState(self.values, name)

    def list(self, name: str) -> ListState:
        return ListState(self.lists, name)

    def map(self, name: str) -> MapState:
        return MapState(self.maps, name)

    def register_timer(self, when: datetime) -> None:
        """Fires ``on_timer(key, when)`` once the watermark reaches ``when`` (millisecond resolution)."""
        ms = to_us(when) // 1000
        i = bisect.bisect_left(self.timer_ms, ms)
        if i == len(self.timer_ms) or self.timer_ms[i] != ms:
            self.timer_ms.insert(i, ms)

    def delete_timer(self, when: datetime) -> None:
        ms = to_us(when) // 1000
        i = bisect.bisect_left(self.timer_ms, ms)
        if i < len(self.timer_ms) and self.timer_ms[i] == ms:
            del self.timer_ms[i]

    def timers(self) -> list[datetime]:
        return [from_us(ms * 1000) for ms in self.timer_ms]

    # --- (de)serialization: the state handed over by the backlog and kept by the live phase ---------
    def dump_state(self) -> str | None:
        """The key's state as JSON, or None when it holds nothing (timers are kept apart)."""
        if not (self.values or self.lists or self.maps):
            return None
        blob = {
            "v": _encode(self.values, "value state"),
            "l": _encode(self.lists, "list state"),
            "m": {
                name: [[k, _encode(v, f"map state {name!r}")] for k, v in m.items()] for name, m in self.maps.items()
            },
        }
        return json.dumps(blob, separators=(",", ":"))

    def load_state(self, blob: str | None, timer_ms: Iterable[int]) -> None:
        self.values, self.lists, self.maps = {}, {}, {}
        if blob:
            data = json.loads(blob)
            self.values = _decode(data.get("v", {}))
            self.lists = _decode(data.get("l", {}))
            self.maps = {name: {k: _decode(v) for k, v in pairs} for name, pairs in data.get("m", {}).items()}
        self.timer_ms = sorted(set(int(t) for t in timer_ms))


class KeyDriver:
    """Runs one key's process function under the two-phase rules (see the module doc). Rows arrive with
    timestamp columns as microseconds (``ts_columns``); the user sees UTC datetimes."""

    def __init__(
        self,
        function: KeyedProcessFunction,
        key_columns: list[str],
        output_columns: list[str],
        ts_columns: Iterable[str],
        event_time: str,
    ):
        self.function = function
        self.key_columns = key_columns
        self.output_columns = output_columns
        self._output_set = set(output_columns)
        self.ts_columns = list(ts_columns)
        self.event_time = event_time
        self.ctx = ProcessContext()
        self.key: tuple = ()

    def start(self, key: tuple, state: str | None, timer_ms: Iterable[int]) -> None:
        self.key = key
        self.ctx.load_state(state, timer_ms)

    def fire_due(self, watermark_us: int | None) -> list[dict]:
        """Fires the key's timers <= ``watermark_us``, earliest first, until none is due."""
        out: list[dict] = []
        if watermark_us is None:
            return out
        timers = self.ctx.timer_ms
        while timers and timers[0] * 1000 <= watermark_us:
            ms = timers.pop(0)
            out.extend(self._collect(self.function.on_timer(self.key, from_us(ms * 1000), self.ctx), "on_timer"))
        return out

    def process(self, rows: list[dict], *, by_event_time: bool = False) -> list[dict]:
        """Calls ``process`` with one version's rows of the key (raw: timestamps in µs), ordered by event time, ties
        by the rows' values. ``by_event_time``: the rows come ordered by event time already, so only rows that share
        one are ordered by value (a row's values as sorted JSON cost more than the rest of its handling)."""
        if len(rows) > 1 and (not by_event_time or self._has_ties(rows)):
            rows = sorted(rows, key=self._order)
        for col in self.ts_columns:
            for row in rows:
                value = row.get(col)
                if value is not None:
                    row[col] = from_us(value)
        return self._collect(self.function.process(self.key, rows, self.ctx), "process")

    def _has_ties(self, rows: list[dict]) -> bool:
        et = self.event_time
        return any(a[et] >= b[et] for a, b in itertools.pairwise(rows))

    def _order(self, row: dict) -> tuple:
        return (row[self.event_time], json.dumps(row, sort_keys=True, default=str))

    def _collect(self, produced: Iterable[dict] | None, where: str) -> list[dict]:
        if produced is None:
            return []
        out = []
        keys = dict(zip(self.key_columns, self.key, strict=True))
        for row in produced:
            if not isinstance(row, Mapping):
                raise ProcessFunctionError(
                    f"{type(self.function).__name__}.{where} for key {self.key!r} yielded {type(row).__name__}; "
                    "yield dicts of the output columns"
                )
            unknown = row.keys() - self._output_set
            if unknown:
                raise ProcessFunctionError(
                    f"{type(self.function).__name__}.{where} for key {self.key!r} yielded columns "
                    f"{sorted(unknown)} that are not in its output_schema; output columns: {self.output_columns}"
                )
            out.append({**keys, **{c: row.get(c) for c in self.output_columns}})
        return out

    def state(self) -> tuple[str | None, list[int]]:
        return self.ctx.dump_state(), list(self.ctx.timer_ms)


def load_process_function(path: str) -> KeyedProcessFunction:
    """Imports ``package.module:Class`` and instantiates it (no arguments)."""
    cls = load_function(path)
    if not (isinstance(cls, type) and issubclass(cls, KeyedProcessFunction)):
        raise DefinitionError(f"process function {path!r} is not a subclass of phases.KeyedProcessFunction")
    if not cls.output_schema:
        raise DefinitionError(f"process function {path!r} has no output_schema (Spark DDL of its output columns)")
    return cls()


def group_runs(items: Iterable[Any], key) -> Iterator[tuple[Any, list]]:
    """Consecutive runs of ``items`` with equal ``key(item)`` (like itertools.groupby, materialized)."""
    run: list = []
    current: Any = object()
    for item in items:
        k = key(item)
        if run and k != current:
            yield current, run
            run = []
        current = k
        run.append(item)
    if run:
        yield current, run
