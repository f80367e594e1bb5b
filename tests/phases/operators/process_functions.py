"""User process functions for the process-operator tests (importable by Spark's Python workers)."""

from __future__ import annotations

from datetime import timedelta

from phases._internal.operators.process_function import KeyedProcessFunction

GAP = timedelta(seconds=10)


class Sessions(KeyedProcessFunction):
    """Sessionization with every kind of state and an event-time timer: a key's session closes once no event
    came for ``GAP`` after its last one (a timer), or when an event arrives after the gap. Emits the session's
    bounds, its event count, the sum of its values and how many distinct values it saw."""

    output_schema = "session_start timestamp, session_end timestamp, events long, total long, distinct_values long"

    def process(self, key, rows, ctx):
        start, last, values, seen = ctx.value("start"), ctx.value("last"), ctx.list("values"), ctx.map("seen")
        for row in rows:
            ts = row["ts"]
            if last.get() is not None and ts > last.get() + GAP:
                yield from self._close(ctx)
            if start.get() is None or ts < start.get():
                start.set(ts)
            if last.get() is None or ts > last.get():
                if last.get() is not None:
                    ctx.delete_timer(last.get() + GAP)
                last.set(ts)
                ctx.register_timer(ts + GAP)
            values.append(row["value"])
            label = str(row["value"])
            seen.put(label, seen.get(label, 0) + 1)

    def on_timer(self, key, timestamp, ctx):
        yield from self._close(ctx)

    @staticmethod
    def _close(ctx):
        start, last, values, seen = ctx.value("start"), ctx.value("last"), ctx.list("values"), ctx.map("seen")
        present = [v for v in values.get() if v is not None]
        yield {
            "session_start": start.get(),
            "session_end": last.get() + GAP,
            "events": len(values.get()),
            "total": sum(present) if present else None,
            "distinct_values": len(seen.keys()),
        }
        ctx.delete_timer(last.get() + GAP)
        for state in (start, last, values, seen):
            state.clear()


class Arrivals(KeyedProcessFunction):
    """Yields each row it is given, with its place in the call: the order a version's rows reach ``process``."""

    output_schema = "ts timestamp, value long, place long"

    def process(self, key, rows, ctx):
        for place, row in enumerate(rows):
            yield {"ts": row["ts"], "value": row["value"], "place": place}


class BadOutput(KeyedProcessFunction):
    output_schema = "n long"

    def process(self, key, rows, ctx):
        yield {"n": len(rows), "surprise": 1}


class NotAFunction:
    output_schema = "n long"
