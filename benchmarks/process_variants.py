"""The keyed-process workload's variants. The workload: per key, count events and sum values until the key
has been idle for ``IDLE`` of event time (value state and one event-time timer per key), then emit the
totals and forget the key; records late against their version's watermark ``W(v)`` are dropped.

* plain batch: an independent reference of those rules that shares no code with the framework: the change
  feed's rows with their commit versions, sorted by key and version, folded per key in one Python pass
  (``mapInArrow``), written to Delta;
* stream: what a user would run instead of this framework, a plain ``transformWithState`` query (row API,
  event-time timers, RocksDB, a checkpoint) over the Delta source, appending to a Delta table, one
  micro-batch per source version (so that its watermarks are the versions' ``W(v)``);
* two-phase: this framework with the same function (:class:`benchmarks.functions.IdleTotals`).

Outputs are compared as multisets."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from benchmarks import operator_variants
from benchmarks.functions import IDLE
from benchmarks.variants import Timing
from phases._internal.definition import DeltaSink, DeltaSource, Locations, Pipeline, ProcessOperator

FUNCTION = "benchmarks.functions:IdleTotals"
DELAY = timedelta(minutes=1)
OUTPUT = "key string, first_ts timestamp, last_ts timestamp, events long, total long"
COLUMNS = ["key", "first_ts", "last_ts", "events", "total"]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _utc(ts: datetime | None) -> datetime | None:
    """A timestamp as an aware UTC datetime (Spark hands naive ones in the session time zone, UTC, and state
    values back aware)."""
    return ts if ts is None or ts.tzinfo else ts.replace(tzinfo=UTC)


def _ms(ts: datetime) -> int:
    """Epoch milliseconds of a timestamp."""
    return (_utc(ts) - _EPOCH) // timedelta(milliseconds=1)


def pipeline(source: str, root: str) -> Pipeline:
    return Pipeline(
        name="bench_process",
        source=DeltaSource(path=source),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=DELAY,
        operator=ProcessOperator(function=FUNCTION),
        sink=DeltaSink(path=f"{root}/sink"),
        locations=Locations(root=root),
    )


# --- plain batch: an independent reference ---------------------------------------------------------------


def plain_batch(spark: SparkSession, source: str, out: str) -> Timing:
    """The rules folded per key over the change feed: ``W(v)`` = the largest event time of the versions
    before ``v`` minus the delay; per key and version, a session whose ``last + IDLE <= W(v)`` is emitted
    before that version's rows join; at the end, every session with ``last + IDLE <=`` the final watermark."""
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(source)
        .filter(F.col("_change_type") == "insert")
        .select("key", "ts", "value", F.col("_commit_version").alias("version"))
        .filter(F.col("key").isNotNull() & F.col("ts").isNotNull())
    )
    maxima = sorted(
        (r["version"], _ms(r["hi"])) for r in changes.groupBy("version").agg(F.max("ts").alias("hi")).collect()
    )
    delay_ms, idle_ms = DELAY // timedelta(milliseconds=1), IDLE // timedelta(milliseconds=1)
    marks, running = {}, None
    for version, hi in maxima:
        marks[version] = None if running is None else running - delay_ms
        running = hi if running is None else max(running, hi)
    final = None if running is None else running - delay_ms
    schema = spark.createDataFrame([], OUTPUT).schema
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    ordered = changes.repartition(partitions, "key").sortWithinPartitions("key", "version", "ts")
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    ordered.mapInArrow(_fold(marks, final, idle_ms, arrow_schema), schema).write.format("delta").save(f"{out}/sink")
    return Timing("plain batch", time.perf_counter() - t, {"reference": "change feed folded per key in Python"})


def _fold(marks: dict[int, int | None], final: int | None, idle_ms: int, schema: pa.Schema):
    def due(session, mark) -> bool:
        return session is not None and mark is not None and _ms(session[1]) + idle_ms <= mark

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        key = session = None  # session: [first, last, events, total]
        out: list[dict] = []

        def emit(k, s) -> None:
            out.append({"key": k, "first_ts": s[0], "last_ts": s[1], "events": s[2], "total": s[3]})

        for batch in batches:
            cols = batch.to_pydict()
            for k, ts, value, version in zip(cols["key"], cols["ts"], cols["value"], cols["version"], strict=True):
                mark = marks[version]
                if k != key:
                    if due(session, final):
                        emit(key, session)
                    key, session = k, None
                if mark is not None and _ms(ts) <= mark:
                    continue  # late against its version's watermark
                if due(session, mark):  # the key's timer fired at this version, before its rows
                    emit(key, session)
                    session = None
                if session is None:
                    session = [ts, ts, 0, 0]
                session[0], session[1] = min(session[0], ts), max(session[1], ts)
                session[2] += 1
                session[3] += value or 0
            if out:
                yield pa.RecordBatch.from_pylist(out, schema=schema)
                out = []
        if due(session, final):
            emit(key, session)
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=schema)

    return run


# --- stream: a plain transformWithState query ------------------------------------------------------------


class IdleTotalsProcessor(StatefulProcessor):
    """The workload as a user writes it for ``transformWithState``: the session in value state, its timer at
    ``last + IDLE``. The rule fires a key's due timers before its rows of the same version; within a batch
    Spark hands the rows over first, so a session whose timer is due at this batch's watermark is emitted
    here, before the rows join (if the timer already fired, the state is gone and nothing is due)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.acc = handle.getValueState("acc", "first_ts timestamp, last_ts timestamp, events long, total long")

    def handleInputRows(self, key, rows: Iterator[Row], timerValues) -> Iterator[Row]:
        idle_ms = IDLE // timedelta(milliseconds=1)
        watermark = timerValues.getCurrentWatermarkInMs()
        first = last = None
        events = total = 0
        if self.acc.exists():
            first, last, events, total = self.acc.get()
            first, last = _utc(first), _utc(last)
            if _ms(last) + idle_ms <= watermark:
                self.handle.deleteTimer(_ms(last) + idle_ms)
                yield Row(key=key[0], first_ts=first, last_ts=last, events=events, total=total)
                first = last = None
                events = total = 0
        before = last
        for row in rows:
            ts = _utc(row["ts"])
            first = ts if first is None or ts < first else first
            last = ts if last is None or ts > last else last
            events += 1
            total += row["value"] or 0
        if last != before:
            if before is not None:
                self.handle.deleteTimer(_ms(before) + idle_ms)
            self.handle.registerTimer(_ms(last) + idle_ms)
        self.acc.update((first, last, events, total))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:
        if self.acc.exists():
            first, last, events, total = self.acc.get()
            self.acc.clear()
            yield Row(key=key[0], first_ts=first, last_ts=last, events=events, total=total)

    def close(self) -> None:
        pass


def stream(spark: SparkSession, source: str, root: str, files_per_trigger: int) -> Timing:
    """``transformWithState`` over the source from its first version, ``files_per_trigger`` files a
    micro-batch (one version's files: a micro-batch's watermark is then its version's ``W(v)``)."""
    shutil.rmtree(root, ignore_errors=True)
    outputs = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", files_per_trigger)
        .load(source)
        .withWatermark("ts", f"{int(DELAY.total_seconds())} seconds")
        .groupBy("key")
        .transformWithState(IdleTotalsProcessor(), outputStructType=OUTPUT, outputMode="Append", timeMode="EventTime")
    )
    seconds, batches = operator_variants.append_to_delta(outputs, root)
    return Timing("stream", seconds, {"micro_batches": batches, "query": "transformWithState (row API)"})


def two_phase(spark: SparkSession, source: str, root: str) -> Timing:
    return operator_variants.two_phase(spark, pipeline(source, root))


def same_outputs(spark: SparkSession, expected: str, actual: str) -> bool:
    return operator_variants.same_outputs(spark, expected, actual, COLUMNS)
