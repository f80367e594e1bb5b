"""The process function of the benchmark's keyed-process workload (importable by Spark's Python workers)."""

from __future__ import annotations

from datetime import timedelta

from phases._internal.operators.process_function import KeyedProcessFunction

IDLE = timedelta(minutes=3)


class IdleTotals(KeyedProcessFunction):
    """Per key, counts events and sums values until the key has been idle for ``idle`` (an event-time timer),
    then emits the totals and forgets the key: value state and one timer per key."""

    output_schema = "first_ts timestamp, last_ts timestamp, events long, total long"
    idle = IDLE

    def process(self, key, rows, ctx):
        acc = ctx.value("acc")
        first, last, events, total = acc.get() or (None, None, 0, 0)
        for row in rows:
            first = row["ts"] if first is None or row["ts"] < first else first
            if last is None or row["ts"] > last:
                if last is not None:
                    ctx.delete_timer(last + self.idle)
                last = row["ts"]
                ctx.register_timer(last + self.idle)
            events += 1
            total += row["value"] or 0
        acc.set([first, last, events, total])
        return None

    def on_timer(self, key, timestamp, ctx):
        first, last, events, total = ctx.value("acc").get()
        ctx.value("acc").clear()
        yield {"first_ts": first, "last_ts": last, "events": events, "total": total}


class DoNothing(KeyedProcessFunction):
    """Keeps no state, sets no timer, yields nothing: what a pass costs besides the user's code."""

    output_schema = "events long"

    def process(self, key, rows, ctx):
        return None


class DayIdleTotals(IdleTotals):
    """:class:`IdleTotals` with a day of idleness: in the live benchmark every key's state and timer stay pending."""

    idle = timedelta(days=1)


def window_counts(key, window_start, window_end, left, right):
    """A co-group function: each input's row count of one key and window."""
    yield {"left_n": len(left), "right_n": len(right)}
