"""The live pass of a process operator: ``transformWithState`` (row API, event time) around the same
:class:`~phases.process_function.KeyDriver` the backlog uses.

The operator's input is the union of the handed-over state (one *seed* row per key that holds state or
timers, ``_kind = 'state'``) and the tagged live records (``_kind = 'row'``). The seeds are the data of the
first micro-batch, so the switch's immediate checkpoint holds them in Spark's state store; they carry the
backlog's maximum event time as their event time, so after that batch Spark's watermark is the final
backlog watermark. A key's JSON state lives in one value state, its timers are Spark timers (so they also
fire for keys that get no more records).

Per key and batch the driver gets the key's records version by version and fires the key's timers due by
each version's watermark W(v) first; Spark fires the rest (keys without records) through
``handleExpiredTimer`` when its watermark passes them. Spark's watermark never exceeds W(v) (it is taken
over the same on-time records), so both routes fire a timer before the first record it must precede.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from phases.lateness import VERSION, WATERMARK_US
from phases.process_function import KeyDriver, group_runs
from phases.process_operator import KIND, STATE, TIMERS, ProcessLogic

SEED, RECORD = "state", "row"
STATE_VAR = "state"
ENGINE_COLUMNS = (KIND, VERSION, WATERMARK_US, STATE, TIMERS)


class LiveProcessor(StatefulProcessor):
    """Holds only picklable settings; the user's function is imported in the Python worker (``init``)."""

    def __init__(self, logic: ProcessLogic):
        self.logic = logic
        self.driver: KeyDriver | None = None

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState(STATE_VAR, "json string")
        self.driver = self.logic.driver()

    def _start(self, key: tuple, seed: dict | None) -> list[int]:
        """Loads the key into the driver; returns the timers Spark holds for it now."""
        held = sorted(self.handle.listTimers())
        if seed is not None:
            self.driver.start(key, seed[STATE], seed[TIMERS] or ())
        else:
            blob = self.state.get()[0] if self.state.exists() else None
            self.driver.start(key, blob, held)
        return held

    def _store(self, held: list[int]) -> None:
        blob, timers = self.driver.state()
        if blob is None:
            self.state.clear()
        else:
            self.state.update((blob,))
        now = set(timers)
        for ms in held:
            if ms not in now:
                self.handle.deleteTimer(ms)
        for ms in now.difference(held):
            self.handle.registerTimer(ms)

    def _rows(self, produced: list[dict]) -> Iterator[Row]:
        for out in produced:
            for c in self.logic.output_ts:
                value = out.get(c)
                if isinstance(value, datetime) and value.tzinfo is None:
                    out[c] = value.replace(tzinfo=UTC)
            yield Row(**out)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        rows = [r.asDict() for r in rows]
        seeds = [r for r in rows if r[KIND] == SEED]
        held = self._start(tuple(key), seeds[0] if seeds else None)
        records = sorted((r for r in rows if r[KIND] == RECORD), key=lambda r: r[VERSION])
        produced: list[dict] = []
        for _, version_rows in group_runs(records, lambda r: r[VERSION]):
            watermark = version_rows[0][WATERMARK_US]
            user_rows = [{c: v for c, v in r.items() if c not in ENGINE_COLUMNS} for r in version_rows]
            produced += self.driver.fire_due(watermark)
            produced += self.driver.process(user_rows)
        self._store(held)
        return self._rows(produced)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:
        # Fires every timer of the key due by Spark's watermark (in order, with any they register); Spark's
        # later calls for timers fired here find them gone and fire nothing.
        held = self._start(tuple(key), None)
        produced = self.driver.fire_due(timerValues.getCurrentWatermarkInMs() * 1000)
        self._store(held)
        return self._rows(produced)

    def close(self) -> None:
        pass
