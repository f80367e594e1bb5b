"""Measurements of a running live phase over a reporting interval, from Spark's ``StreamingQueryProgress``.

Each report covers the micro-batches that ended since the previous one:

* ``input_rows`` is the sum of their ``numInputRows``; ``input_rows_per_s`` divides it by the time those batches
  cover, from the end of the last batch reported before to the end of the newest one (what arrived and was taken
  up: a micro-batch longer than the interval is not counted as if it all came in the interval it ended in, which
  made rates spike tenfold), and has no value while a micro-batch runs and none ended (not a made-up 0);
  ``processed_rows_per_s`` divides it by the time those batches ran (their ``triggerExecution`` durations: how fast
  the live phase works while it works);
* ``batch_duration_s`` is their mean ``triggerExecution``;
* ``lag_s`` is how long the oldest source data not applied yet has waited (its Delta commit time, or its Kafka
  record timestamp, to now; 0 when nothing waits), and ``behind`` how much waits: versions (Delta) or records
  (Kafka) after what was applied. Together they say whether the live phase keeps up;
* the watermark and the newest applied event time are the pipeline's own (its progress log; Spark's watermark is
  not the pipeline's), compared with the newest event time at the source's head.

Spark's per-batch ``processedRowsPerSecond`` of the last progress is 0 whenever the last batch had no data (the
idle batches between arrivals), which is why the rates are computed over the interval instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from phases._internal.definition import SOURCE_LABEL
from phases._internal.lateness import watermark_after
from phases._internal.sources.head import source_heads
from phases._internal.sources.kafka import ChunkPlan
from phases._internal.sources.lag import Unapplied, input_unapplied


@dataclass(frozen=True)
class LiveReport:
    at: datetime
    interval_s: float
    batches: int  # micro-batches that ended in the interval
    data_batches: int  # ... of which read at least one row
    input_rows: int
    input_rows_per_s: float | None  # None: a micro-batch runs and none ended in the interval
    processed_rows_per_s: float | None  # None: no row in the interval
    batch_duration_s: float | None  # mean over the data batches; None: none
    last_batch_id: int | None
    watermark: datetime | None
    applied_max_event_time: datetime | None
    head_max_event_time: datetime | None
    event_time_lag_s: float | None  # head's newest event time - newest applied event time (>= 0)
    watermark_age_s: float | None  # wall clock - watermark
    behind: int | None
    behind_unit: str
    lag_s: float | None  # how long the oldest source data not applied has waited (0: nothing waits; None: unknown)
    applied_position: str  # the last applied source version ("v12") or end offsets ("0:40,1:38")
    head_position: str
    running_batch: bool = False  # a micro-batch was running at the report and none ended in the interval

    def describe(self) -> str:
        rate = f"{self.processed_rows_per_s:,.0f}" if self.processed_rows_per_s is not None else "-"
        taken = f"{self.input_rows_per_s:,.1f}" if self.input_rows_per_s is not None else "-"
        return (
            f"{self.input_rows:,} rows in {self.data_batches}/{self.batches} batches ({taken}/s "
            f"in, {rate}/s while processing), applied {self.applied_position} of {self.head_position or '?'} "
            f"({self.behind if self.behind is not None else '?'} {self.behind_unit} behind), watermark "
            f"{self.watermark.isoformat() if self.watermark else 'none'}"
        )


def _ended(progress) -> datetime:
    """When a micro-batch ended: its trigger's start (ISO 8601, UTC) plus its ``triggerExecution`` time."""
    started = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00"))
    return started + timedelta(milliseconds=(progress.durationMs or {}).get("triggerExecution", 0))


def _dt(us: int | None) -> datetime | None:
    return None if us is None else datetime.fromtimestamp(us / 1e6, tz=UTC)


class LiveMeter:
    """Turns a running :class:`phases._internal.live.runner.LiveRunner`'s progress into :class:`LiveReport`\\ s, one per
    call."""

    def __init__(self, runner):
        self.runner = runner
        self._last_batch: int | None = None
        self._last_seen: str | None = None  # the newest progress's timestamp already reported
        self._last_at = time.monotonic()
        self._last_end: datetime | None = None  # when the newest micro-batch reported so far ended

    def report(self) -> LiveReport:
        runner, pipeline = self.runner, self.runner.pipeline
        now, mono = datetime.now(UTC), time.monotonic()
        interval = max(mono - self._last_at, 1e-6)
        self._last_at = mono
        q = runner.query
        progresses = list(q.recentProgress) if q is not None else []
        # By the trigger's timestamp (ISO 8601, UTC: ordered as text), not its batch id: an idle trigger reports the
        # id the next micro-batch will carry, so a batch that reads data can share its id with a progress seen before.
        new = [p for p in progresses if self._last_seen is None or p.timestamp > self._last_seen]
        if progresses:
            self._last_batch = max(p.batchId for p in progresses)
            self._last_seen = max(p.timestamp for p in progresses)
        data = [p for p in new if p.numInputRows > 0]
        rows = sum(int(p.numInputRows) for p in new)
        running_batch = False
        if new:
            newest_end = max(_ended(p) for p in new)
            covered = (newest_end - self._last_end).total_seconds() if self._last_end is not None else interval
            self._last_end = newest_end
            input_rate: float | None = rows / max(covered, 1e-3)
        else:
            running_batch = bool(q is not None and q.isActive and q.status.get("isTriggerActive"))
            input_rate = None if running_batch else 0.0
        busy_s = sum((p.durationMs or {}).get("triggerExecution", 0) for p in data) / 1000
        latest = runner.incremental.latest_progress()
        applied_max = latest.running_max_us
        watermark = watermark_after(applied_max, pipeline.delay_us)
        pending: list[Unapplied] = []
        waited: list[float | None] = []
        for inp in pipeline.inputs:  # the freshness of the input whose oldest unapplied data waits longest
            applied_offsets = latest.offsets_of(inp.label)
            position = runner.handoff.positions.get(inp.label) if runner.handoff is not None else None
            if applied_offsets is None and position:
                applied_offsets = ChunkPlan.from_json(position).end
            found = input_unapplied(
                inp.spec,
                runner.placement,
                applied_version=latest.of(inp.label).complete_below - 1,
                applied_offsets=applied_offsets,
            )
            pending.append(found)
            if found.behind == 0:
                waited.append(0.0)
            elif found.oldest_at is not None:
                waited.append(max(0.0, (now - found.oldest_at).total_seconds()))
            else:
                waited.append(None)  # unknown: no figure rather than a reassuring one
        waiting = pending[0]
        lag_s = None if None in waited else max(waited)  # pyright: ignore[reportArgumentType]
        heads = source_heads(runner.placement)
        head = heads[0]
        head_max = head.max_event_time
        event_lag = None
        if head_max is not None and applied_max is not None:
            event_lag = max(0.0, (head_max - _dt(applied_max)).total_seconds())  # pyright: ignore[reportOperatorIssue]
        offsets = latest.offsets_of(SOURCE_LABEL)
        if offsets is not None:
            applied = ",".join(f"{p}:{o}" for p, o in sorted(offsets.items()))
        else:
            applied = f"v{latest.complete_below - 1}"
        return LiveReport(
            at=now,
            interval_s=interval,
            batches=len(new),
            data_batches=len(data),
            input_rows=rows,
            input_rows_per_s=input_rate,
            processed_rows_per_s=rows / busy_s if rows and busy_s > 0 else None,
            batch_duration_s=busy_s / len(data) if data else None,
            last_batch_id=self._last_batch,
            watermark=_dt(watermark),
            applied_max_event_time=_dt(applied_max),
            head_max_event_time=head_max,
            event_time_lag_s=event_lag,
            watermark_age_s=None if watermark is None else (now - _dt(watermark)).total_seconds(),  # pyright: ignore[reportOperatorIssue]
            behind=waiting.behind,
            behind_unit=waiting.unit,
            lag_s=lag_s,
            applied_position=applied,
            head_position=head.position,
            running_batch=running_batch,
        )


@dataclass(frozen=True)
class LiveStart:
    """What starting the live phase took."""

    run_name: str
    start_seconds: float  # query started -> its first micro-batch's progress committed
    first_checkpoint_at_us: int  # wall clock of that commit
    # When the query's first micro-batch had applied what waited at the start (its progress recorded); None when
    # nothing waited. What arrives while the start drains a busy source is applied batch by batch after it.
    first_batch_at_us: int | None = None


def query_status(runner) -> dict:
    """A live runner's query: its rates (Spark's last progress), and the pipeline's own watermark and last applied
    version (Spark has none)."""
    q = runner.incremental.query
    prog = q.lastProgress if q is not None else None
    latest = runner.incremental.latest_progress()
    watermark = None
    if latest.running_max_us is not None:
        at = datetime.fromtimestamp((latest.running_max_us - runner.pipeline.delay_us) / 1e6, tz=UTC)
        watermark = at.isoformat().replace("+00:00", "Z")
    return {
        "active": bool(q and q.isActive),
        "batch_id": prog.get("batchId") if prog else None,
        "input_rows_per_second": prog.get("inputRowsPerSecond") if prog else None,
        "processed_rows_per_second": prog.get("processedRowsPerSecond") if prog else None,
        "watermark": watermark,
        "source_version": latest.complete_below - 1,
    }
