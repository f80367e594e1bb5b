"""An independent, plain-Python reference of the pipeline's semantics (no Spark, no engine code).

Lateness by arrival order of versions: W(v) = max event time of valid records in versions < v, minus the
delay; a record with event time <= W(v) is late. Aggregations follow SQL semantics (nulls ignored,
sum/min/max/avg of no values are null).
"""

from __future__ import annotations

from collections import defaultdict
from functools import reduce

Row = tuple[str | None, int | None, int | None]  # key, event time (µs), value


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
            if key is None:
                quarantined.append((version, row, "null key column 'key'"))
                continue
            if ts is None:
                quarantined.append((version, row, "null event time column 'ts'"))
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
