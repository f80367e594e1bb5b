"""An independent, plain-Python reference of the pipeline's semantics (no Spark, no engine code).

Lateness by arrival order of versions: W(v) = max event time of valid records in versions < v, minus the
delay; a record with event time <= W(v) is late. Aggregations follow SQL semantics (nulls ignored,
sum/min/max/avg of no values are null).

Validity: a record needs a key and an event time, and its event time must not be more than the pipeline's
``max_future`` (default one day) after its version's commit. The tests commit their versions now, with
event times offsets from 2026-01-01; a record at or after :data:`FUTURE_AFTER_US` (2090) stands for one far
in the future of its commit, every other one is well before its commit.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from functools import reduce

Row = tuple[str | None, int | None, int | None]  # key, event time (µs after 2026-01-01), value

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
FUTURE_AFTER_US = int((datetime(2090, 1, 1, tzinfo=UTC) - _EPOCH) / timedelta(microseconds=1))
FAR_FUTURE_US = int((datetime(2099, 1, 1, tzinfo=UTC) - _EPOCH) / timedelta(microseconds=1))
FUTURE_REASON = "future: event time more than 1 day after its version's commit (max_future)"


def invalid_reason(key: str | None, ts: int | None) -> str | None:
    """Why a record is not valid (quarantined, never moving the watermark), or None."""
    if key is None:
        return "null key column 'key'"
    if ts is None:
        return "null event time column 'ts'"
    if ts >= FUTURE_AFTER_US:
        return FUTURE_REASON
    return None


def run(versions: dict[int, list[Row]], delay_us: int) -> tuple[dict[str, dict], list[tuple[int, Row, str]]]:
    """(results by key, quarantined (version, row, reason)) for versions processed in order."""
    running: int | None = None
    values: dict[str, list[int | None]] = defaultdict(list)
    quarantined: list[tuple[int, Row, str]] = []
    for version in sorted(versions):
        mark = None if running is None else running - delay_us
        vmax = None
        for row in versions[version]:
            key, ts, value = row
            reason = invalid_reason(key, ts)
            if reason is not None:
                quarantined.append((version, row, reason))
                continue
            vmax = ts if vmax is None else max(vmax, ts)
            if mark is not None and ts <= mark:
                quarantined.append((version, row, "late: event time <= watermark"))
                continue
            values[key].append(value)
        if vmax is not None:
            running = vmax if running is None else max(running, vmax)
    results = {}
    for key, vals in values.items():
        present = [v for v in vals if v is not None]
        results[key] = {
            "n": len(vals),
            "n_value": len(present),
            "total": sum(present) if present else None,
            "lo": min(present) if present else None,
            "hi": max(present) if present else None,
            "mean": sum(present) / len(present) if present else None,
            "xor": reduce(lambda a, b: a ^ b, present) if present else None,
        }
    return results, quarantined


def windows_of(ts: int, size_us: int, slide_us: int) -> list[tuple[int, int]]:
    """The [start, end) windows holding ``ts``: epoch-aligned, ``size / slide`` of them."""
    last_start = ts - ts % slide_us
    return [(s, s + size_us) for s in range(last_start - size_us + slide_us, last_start + 1, slide_us)]


def run_windows(
    versions: dict[int, list[Row]], delay_us: int, size_us: int, slide_us: int
) -> tuple[dict[tuple[str, int, int], dict], int | None]:
    """(emitted windows -> {n, total, hi}, final watermark): a window is emitted once the final watermark
    (max valid event time - delay) reaches its end; lateness as in :func:`run`."""
    running: int | None = None
    values: dict[tuple[str, int, int], list[int | None]] = defaultdict(list)
    for version in sorted(versions):
        mark = None if running is None else running - delay_us
        vmax = None
        for key, ts, value in versions[version]:
            if invalid_reason(key, ts) is not None:
                continue
            vmax = ts if vmax is None else max(vmax, ts)
            if mark is not None and ts <= mark:
                continue
            for start, end in windows_of(ts, size_us, slide_us):
                values[(key, start, end)].append(value)
        if vmax is not None:
            running = vmax if running is None else max(running, vmax)
    final = None if running is None else running - delay_us
    emitted = {}
    for (key, start, end), vals in values.items():
        if final is None or end > final:
            continue
        present = [v for v in vals if v is not None]
        emitted[(key, start, end)] = {
            "n": len(vals),
            "total": sum(present) if present else None,
            "hi": max(present) if present else None,
        }
    return emitted, final


def run_process(versions: dict[int, list[Row]], delay_us: int, function, to_datetime) -> list[dict]:
    """Output rows of a keyed process function under the documented rules, by plain iteration: per version,
    for every key with on-time rows, its timers <= W(v) fire (earliest first, repeatedly), then ``process``
    gets the key's rows ordered by (event time, row); at the end timers <= the final watermark fire.

    Uses the user-facing state container (``ProcessContext``) but none of the engine's sequencing.
    ``to_datetime`` maps the test's µs offsets to the datetimes records hold.
    """
    import json

    from phases._internal.operators.process_function import ProcessContext, from_us, to_us

    contexts: dict[str, ProcessContext] = {}
    out: list[dict] = []

    def emit(key: str, produced) -> None:
        for row in produced or []:
            out.append({"key": key, **row})

    def fire(key: str, mark: int | None) -> None:
        ctx = contexts[key]
        while mark is not None and ctx.timer_ms and ctx.timer_ms[0] * 1000 <= mark:
            ms = ctx.timer_ms.pop(0)
            emit(key, function.on_timer((key,), from_us(ms * 1000), ctx))

    running: int | None = None
    for version in sorted(versions):
        mark = None if running is None else running - delay_us
        vmax, on_time = None, defaultdict(list)
        for key, ts, value in versions[version]:
            if invalid_reason(key, ts) is not None:
                continue
            vmax = ts if vmax is None else max(vmax, ts)
            if mark is not None and ts <= mark:
                continue
            on_time[key].append((key, ts, value))
        # W(v) in Unix µs, the engine's clock
        unix_mark = None if mark is None else to_us(to_datetime(0)) + mark
        for key, rows in on_time.items():
            contexts.setdefault(key, ProcessContext())
            fire(key, unix_mark)

            def order(r):
                raw = {"key": r[0], "ts": to_us(to_datetime(r[1])), "value": r[2]}
                return (raw["ts"], json.dumps(raw, sort_keys=True))

            ordered = sorted(rows, key=order)
            dicts = [{"key": k, "ts": to_datetime(t), "value": v} for k, t, v in ordered]
            emit(key, function.process((key,), dicts, contexts[key]))
        if vmax is not None:
            running = vmax if running is None else max(running, vmax)
    if running is not None:
        final = to_us(to_datetime(0)) + running - delay_us
        for key in contexts:
            fire(key, final)
    return out


def on_time(versions: dict[int, list[Row]], delay_us: int) -> tuple[list[Row], int | None]:
    """(valid on-time records in arrival order, final watermark) of one input, lateness as in :func:`run`."""
    running: int | None = None
    kept: list[Row] = []
    for version in sorted(versions):
        mark = None if running is None else running - delay_us
        vmax = None
        for key, ts, value in versions[version]:
            if invalid_reason(key, ts) is not None:
                continue
            vmax = ts if vmax is None else max(vmax, ts)
            if mark is None or ts > mark:
                kept.append((key, ts, value))
        if vmax is not None:
            running = vmax if running is None else max(running, vmax)
    return kept, None if running is None else running - delay_us


def run_interval_join(left: dict, right: dict, delay_us: int, lower_us: int, upper_us: int) -> list[tuple]:
    """Every (key, left ts, left value, right ts, right value) of on-time records of each input with
    ``left.ts + lower <= right.ts <= left.ts + upper``."""
    lrows, _ = on_time(left, delay_us)
    rrows, _ = on_time(right, delay_us)
    return sorted(
        (
            (lk, lt, lv, rt, rv)
            for lk, lt, lv in lrows
            for rk, rt, rv in rrows
            if lk == rk and lt + lower_us <= rt <= lt + upper_us
        ),
        key=repr,
    )


def run_co_group(left: dict, right: dict, delay_us: int, size_us: int, function, to_datetime) -> list[dict]:
    """The function's rows for every (key, tumbling window) whose end is <= both inputs' final watermarks,
    with the window's on-time records of each input ordered by (event time, row)."""
    import json

    lrows, lwm = on_time(left, delay_us)
    rrows, rwm = on_time(right, delay_us)
    if lwm is None or rwm is None:
        return []
    closing = min(lwm, rwm)
    windows: dict[tuple[str, int], tuple[list, list]] = defaultdict(lambda: ([], []))
    for side, rows in ((0, lrows), (1, rrows)):
        for key, ts, value in rows:
            windows[(key, ts - ts % size_us)][side].append({"key": key, "ts": to_datetime(ts), "value": value})

    def order(row: dict) -> tuple:
        return (row["ts"], json.dumps(row, sort_keys=True, default=str))

    out = []
    for (key, start), (lefts, rights) in windows.items():
        if start + size_us > closing:
            continue
        start_dt, end_dt = to_datetime(start), to_datetime(start + size_us)
        for row in function((key,), start_dt, end_dt, sorted(lefts, key=order), sorted(rights, key=order)) or []:
            out.append({"key": key, "window_start": start_dt, "window_end": end_dt, **row})
    return out


def run_sessions(versions: dict[int, list[Row]], delay_us: int, gap_us: int) -> dict[tuple[str, int, int], dict]:
    """Emitted sessions (key, start, end) -> {n, total, hi}: a record opens [ts, ts + gap); sessions that
    touch or overlap merge; a session is emitted once the final watermark reaches its end."""
    rows, final = on_time(versions, delay_us)
    by_key: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_key[row[0]].append(row)
    emitted = {}
    for key, records in by_key.items():
        sessions: list[list] = []  # [start, end, values]
        for _, ts, value in sorted(records, key=lambda r: r[1]):
            if sessions and ts <= sessions[-1][1]:
                sessions[-1][1] = max(sessions[-1][1], ts + gap_us)
                sessions[-1][2].append(value)
            else:
                sessions.append([ts, ts + gap_us, [value]])
        for start, end, values in sessions:
            if final is None or end > final:
                continue
            present = [v for v in values if v is not None]
            emitted[(key, start, end)] = {
                "n": len(values),
                "total": sum(present) if present else None,
                "hi": max(present) if present else None,
            }
    return emitted
