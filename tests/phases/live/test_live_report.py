"""The live phase's reports over an interval (phases._internal.live.report): rates over the time the finished
micro-batches cover, no figure while a micro-batch runs and none ended. No JVM: the query and the sources are stand-ins
for what Spark's StreamingQueryProgress and the Delta log say."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from phases._internal.live import report as live_report
from phases._internal.live.plan import Progress
from phases._internal.placement import Placement
from phases._internal.sources.lag import Unapplied
from tests.conftest import make_pipeline

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


@dataclass
class _Progress:  # what a StreamingQueryProgress carries that the meter reads
    batchId: int
    timestamp: str
    numInputRows: int
    durationMs: dict = field(default_factory=dict)


def _batch(batch_id: int, start_s: float, seconds: float, rows: int) -> _Progress:
    start = (T0 + timedelta(seconds=start_s)).isoformat().replace("+00:00", "Z")
    return _Progress(batch_id, start, rows, {"triggerExecution": int(seconds * 1000)})


class _Query:
    def __init__(self):
        self.recentProgress: list[_Progress] = []
        self.isActive = True
        self.trigger_active = False

    @property
    def status(self) -> dict:
        return {"isTriggerActive": self.trigger_active}


def _meter(monkeypatch):
    monkeypatch.setattr(live_report, "input_unapplied", lambda *a, **k: Unapplied("source", 0, "versions", None))
    monkeypatch.setattr(live_report, "source_heads", lambda p: [SimpleNamespace(max_event_time=None, position="v5")])
    query = _Query()
    progress = Progress(batch_id=0, complete_below=6, running_max_us=None, closed_us=None, held_version=None)
    pipeline = make_pipeline("/data/source", "/data/run")
    runner = SimpleNamespace(
        pipeline=pipeline,
        placement=Placement(pipeline),
        query=query,
        handoff=None,
        incremental=SimpleNamespace(latest_progress=lambda: progress),
    )
    return live_report.LiveMeter(runner), query


def test_a_micro_batch_longer_than_the_interval_is_reported_at_its_own_rate_and_none_while_it_runs(monkeypatch):
    """Reports every second; a micro-batch of 13,000 rows ran from 1 s to 11 s after one that ended at 1 s. While it
    ran the report said 0 rows/s ("0 in 0 of 0 micro-batches"), then 13,000 rows in one second's interval: a rate ten
    times the real one."""
    meter, query = _meter(monkeypatch)
    query.recentProgress = [_batch(0, 0.0, 1.0, 1_000)]
    first = meter.report()
    assert first.input_rows == 1_000
    query.trigger_active = True  # the long micro-batch runs; none ends
    running = meter.report()
    assert running.input_rows_per_s is None and running.running_batch and running.batches == 0
    query.trigger_active = False
    query.recentProgress.append(_batch(1, 1.0, 10.0, 13_000))
    ended = meter.report()
    assert ended.input_rows == 13_000 and abs(ended.input_rows_per_s - 1_300.0) < 1e-6  # 13,000 rows over 10 s
    idle = meter.report()  # nothing ran, nothing runs: a true 0
    assert idle.input_rows_per_s == 0.0 and not idle.running_batch
    assert "-/s in" in running.describe()
