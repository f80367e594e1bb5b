"""What a Spark user writes by hand for the live rows' workload, measured on the same feed as the framework.

One Structured Streaming query over the Delta source (the 1M-key seed first, in its own micro-batch, then the steady
versions): ``groupBy(key).agg(count, sum)`` in update mode on Spark's RocksDB state store (changelog
checkpointing, as the framework's sessions configure it), trigger 0.5 s, and a ``foreachBatch`` sink of the updated
rows that is either

- ``merge``: upserted into a Delta table (``MERGE`` on the key): the same table the framework's upsert sink keeps;
- ``append``: appended to a Delta table (idempotent: ``txnAppId``/``txnVersion`` = the batch id), a changelog
  whose latest row per key is the result.

Spark's own watermark is not used (the query has no lateness rule); the framework's exact per-version lateness
is work the peer does not do. Latency, micro-batch cost and drain are measured exactly as for the framework
(:mod:`benchmarks.live`).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from benchmarks import live

SINK_MODES = ("merge", "append")


class PlainQuery:
    """A hand-written query of the live rows' aggregation (``groupBy(key).agg(count, sum)`` in update mode, trigger
    0.5 s) with the calls the live measurements make on the framework's live runner; a subclass says where its rows
    go (:meth:`_writer`)."""

    what = "plain"

    def __init__(self, spark: SparkSession, source: str, checkpoint: str):
        self.spark, self.source, self.checkpoint = spark, source, checkpoint
        self.query: StreamingQuery | None = None

    def _writer(self, counts: DataFrame) -> DataStreamWriter:
        raise NotImplementedError

    def _prepare(self) -> None:
        """What the sink needs before the query starts."""

    def start(self) -> float:
        """Starts the query and waits until the source's versions so far are applied; returns the seconds."""
        self._prepare()
        t = time.perf_counter()
        counts = (
            self.spark.readStream.format("delta")
            .load(self.source)
            .groupBy("key")
            .agg(F.count(F.lit(1)).alias("n"), F.sum("value").alias("total"))
        )
        self.query = (
            self._writer(counts)
            .option("checkpointLocation", self.checkpoint)
            .trigger(processingTime="0.5 seconds")
            .start()
        )
        self.query.processAllAvailable()
        return time.perf_counter() - t

    def process_available(self) -> None:
        self.query.processAllAvailable()

    def raise_if_failed(self) -> None:
        if self.query is not None and not self.query.isActive:
            raise RuntimeError(f"the {self.what} query stopped: {self.query.exception()}")

    def stop(self) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()


class PlainLive(PlainQuery):
    """The hand-written query with a ``foreachBatch`` sink into Delta (``mode``: see the module docstring)."""

    def __init__(self, spark: SparkSession, source: str, sink: str, checkpoint: str, mode: str):
        if mode not in SINK_MODES:
            raise ValueError(f"sink mode {mode!r}: valid modes are {list(SINK_MODES)}")
        super().__init__(spark, source, checkpoint)
        self.sink, self.mode, self.what = sink, mode, f"plain {mode}"

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        if self.mode == "merge":
            DeltaTable.forPath(batch.sparkSession, self.sink).alias("t").merge(
                batch.alias("s"), "t.key = s.key"
            ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
        else:
            (
                batch.withColumn("_batch_id", F.lit(batch_id).cast("long"))
                .write.format("delta")
                .mode("append")
                .option("txnAppId", "plain-live")
                .option("txnVersion", batch_id)
                .save(self.sink)
            )

    def _prepare(self) -> None:
        schema = "key string, n long, total long" + (", _batch_id long" if self.mode == "append" else "")
        if not Path(self.sink, "_delta_log").exists():
            self.spark.createDataFrame([], schema).write.format("delta").save(self.sink)

    def _writer(self, counts: DataFrame) -> DataStreamWriter:
        return counts.writeStream.outputMode("update").foreachBatch(self._write)


def measure(
    spark: SparkSession,
    work: Path,
    *,
    mode: str,
    state_keys: int,
    rates: tuple[int, ...] = (2_000,),
    versions: int = 30,
    interval_s: float = 1.0,
    batches: int = 5,
    batch_rows: int = 2_000,
    drain_rows: int = 0,
    drain_versions: int = 10,
) -> dict:
    """The live rows of the plain query with sink ``mode`` over a source seeded with ``state_keys`` keys."""
    load = live.Load(rates, versions, interval_s, batches, batch_rows, drain_rows, drain_versions)
    base = work / f"live_plain_{mode}_{state_keys}"
    shutil.rmtree(base, ignore_errors=True)
    source, sink, checkpoint = str(base / "source"), str(base / "sink"), str(base / "checkpoint")
    feed = live.Feed(spark, source, state_keys)
    t = time.perf_counter()
    feed.seed()
    result: dict = {"peer": f"plain Spark, {mode} sink", "mode": mode, "state_keys": state_keys}
    result["generate_s"] = round(time.perf_counter() - t, 2)
    label = f"[live plain {mode} {state_keys:,}]"
    query = PlainLive(spark, source, sink, checkpoint, mode)
    try:
        result["backlog_s"] = round(query.start(), 2)  # the seed, in the query's first micro-batch(es)
        print(f"{label} seed of {state_keys:,} keys through the query: {result['backlog_s']} s", flush=True)
        result.update(live.running_rows(query, feed, sink, load, label))
    finally:
        query.stop()
    if load.drain_rows:

        def restart() -> None:
            restarted = PlainLive(spark, source, sink, checkpoint, mode)
            try:
                restarted.start()
            finally:
                restarted.stop()

        result["drain"] = live.drain_after_pause(feed, load, restart, label)
    return result
