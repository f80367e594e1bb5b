"""Results into a Kafka topic: the framework's topic sink (exactly once) beside what a Spark user writes by hand
(Spark's own Kafka sink, at least once), on the live rows' keyed-reduce workload and one local KRaft broker.

- **the handoff's write**: the backlog publishes its results (one record per key: ``state_keys`` records) into the
  topic in one transaction (the backlog's ``topic_s``); beside it, a plain Spark batch write of the same rows (the
  engine's table of the results, ``to_json`` keys and values, ``write.format("kafka")``) into a topic of its own.
  Both topics are then read back and counted;
- **live latency** at a steady input rate: versions arrive every ``interval_s``, each with a probe key of its own; a
  version's latency runs from its source commit (the commit file's time) to the moment a ``read_committed``
  consumer tailing the topic reads the probe's record (:class:`TopicTail`, a confluent-kafka consumer in its own
  thread; the same tail for both). The framework's query publishes each micro-batch in a transaction before its
  Delta writes; the plain query (``groupBy(key).agg(count, sum)`` in update mode on Spark's RocksDB state store,
  trigger 0.5 s, the Kafka sink) sends its records as its tasks run, with no transaction;
- **per-micro-batch cost**, as in :mod:`benchmarks.live`.

The plain query's own source is seeded with the same ``state_keys`` keys, which its first micro-batch applies (and
writes into its topic) before the measurement, as :mod:`benchmarks.live_peers` does.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from benchmarks import live, live_peers, variants
from phases import inspect, place
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSink
from phases._internal.live.runner import LiveRunner
from phases._internal.runtime.local_kafka import LocalKafka, create_topic

PARTITIONS = 3


class TopicTail:
    """A ``read_committed`` consumer in a thread of its own, reading a topic from its end as of :meth:`start`: the
    time each probe key's first record was read (``time.time()``, the clock of the source's commit files)."""

    def __init__(self, servers: str, topic: str):
        self.servers, self.topic = servers, topic
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"tail-{topic}", daemon=True)

    def start(self) -> TopicTail:
        self._thread.start()
        if not self._ready.wait(60) or self._error is not None:
            raise SystemExit(f"the tail of topic {self.topic!r} did not start within 60 s: {self._error}")
        return self

    def _run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.servers,
                "group.id": f"bench-tail-{self.topic}-{time.time_ns()}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
                "log_level": 0,
            }
        )
        try:
            # from the last stable offsets (a read_committed consumer's end offsets) as of now
            ends = [
                consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30)[1] for p in range(PARTITIONS)
            ]
            consumer.assign([TopicPartition(self.topic, p, end) for p, end in enumerate(ends)])
            self._ready.set()
            while not self._stop.is_set():
                for msg in consumer.consume(1000, 0.05):
                    if msg.error() is not None:
                        continue
                    key = msg.key()
                    if key is not None and live.PROBE.encode() in key:
                        self.seen.setdefault(json.loads(key)["key"], time.time())
        except BaseException as exc:  # noqa: BLE001 - reported by the measuring thread
            self._error = exc
            self._ready.set()
        finally:
            consumer.close()

    def probes_seen(self, probes: Iterable[str], timeout_s: float = 30.0) -> dict[str, float]:
        """When each of ``probes`` was read (waits up to ``timeout_s`` for the last ones)."""
        wanted = set(probes)
        deadline = time.monotonic() + timeout_s
        while not wanted <= set(self.seen) and time.monotonic() < deadline and self._error is None:
            time.sleep(0.05)
        if self._error is not None:
            raise SystemExit(f"the tail of topic {self.topic!r} failed: {self._error}")
        return {k: at for k, at in self.seen.items() if k in wanted}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _end_offsets(servers: str, topic: str) -> int:
    """Records in a topic written without transactions (the sum of its partitions' end offsets)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"bench-count-{topic}", "log_level": 0})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS))
    finally:
        consumer.close()


def _encoded(df):
    """What a user hands Spark's Kafka writer: the key columns and the whole row as JSON."""
    return df.select(F.to_json(F.struct("key")).alias("key"), F.to_json(F.struct(*df.columns)).alias("value"))


def plain_batch_write(spark: SparkSession, table: str, version: int, servers: str, topic: str) -> dict:
    """The rows of ``table`` at ``version`` by a plain Spark batch write into ``topic``: seconds and records."""
    t = time.perf_counter()
    (
        _encoded(spark.read.format("delta").option("versionAsOf", version).load(table))
        .write.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", topic)
        .save()
    )
    seconds = time.perf_counter() - t
    return {"seconds": round(seconds, 2), "records": _end_offsets(servers, topic)}


class PlainKafkaLive(live_peers.PlainQuery):
    """The hand-written query with Spark's own Kafka sink."""

    what = "plain Kafka"

    def __init__(self, spark: SparkSession, source: str, servers: str, topic: str, checkpoint: str):
        super().__init__(spark, source, checkpoint)
        self.servers, self.topic = servers, topic

    def _writer(self, counts: DataFrame) -> DataStreamWriter:
        return (
            _encoded(counts)
            .writeStream.format("kafka")
            .outputMode("update")
            .option("kafka.bootstrap.servers", self.servers)
            .option("topic", self.topic)
        )


def measure(
    spark: SparkSession,
    work: Path,
    *,
    state_keys: int,
    rates: tuple[int, ...] = (2_000,),
    versions: int = 30,
    interval_s: float = 1.0,
    batches: int = 5,
    batch_rows: int = 2_000,
    servers: str | None = None,
) -> dict:
    """The topic rows: the framework's topic sink and the plain Spark peers over sources seeded with ``state_keys``
    keys, on the broker at ``servers`` (default: a local broker started for the measurement)."""
    base = work / f"live_topic_{state_keys}"
    shutil.rmtree(base, ignore_errors=True)
    broker = None
    if servers is None:
        broker = LocalKafka(base / "kafka", heap="512m").start()
        servers = broker.bootstrap_servers
    load = live.Load(rates, versions, interval_s, batches, batch_rows)
    prefix = f"bench-{time.time_ns()}"  # a broker shared with other runs keeps its topics
    try:
        framework = _framework(spark, base, servers, f"{prefix}-results", state_keys, load)
        peer = _plain(spark, base, servers, f"{prefix}-plain", state_keys, load)
    finally:
        if broker is not None:
            broker.stop()
    handoff = framework.pop("handoff")
    return {"state_keys": state_keys, "handoff_write": handoff, "framework": framework, "plain": peer}


def _framework(spark: SparkSession, base: Path, servers: str, topic: str, keys: int, load: live.Load) -> dict:
    create_topic(servers, topic, PARTITIONS, **{"cleanup.policy": "compact"})
    feed = live.Feed(spark, str(base / "source"), keys)
    feed.seed()
    p = variants.pipeline(str(base / "source"), str(base / "two_phase"))
    sink = KafkaSink(path=p.sink.path, topic=topic, bootstrap_servers=servers, mode="upsert")
    p = p.model_copy(update={"sink": sink, "checkpoint_interval": timedelta(milliseconds=500)})
    label = f"[live topic sink {keys:,}]"
    t = time.perf_counter()
    runner = BacklogRunner(spark, p)
    handoff = runner.run()
    result: dict = {"peer": "this framework, topic sink (upsert)", "backlog_s": round(time.perf_counter() - t, 2)}
    result["handoff"] = {
        "results": handoff.sink_rows,
        "topic_s": round(runner.timings["topic_s"], 2),
        "records": inspect.result_topic(
            place(None, p, strict=False)
        ).marker.records,  # what the handoff's committed marker counts
    }
    print(f"{label} backlog of {handoff.state_rows:,} keys: {result['backlog_s']} s; {result['handoff']}", flush=True)
    batch_topic = f"{topic}-plain-batch"
    create_topic(servers, batch_topic, PARTITIONS)
    result["handoff"]["plain_batch_write"] = plain_batch_write(
        spark, p.sink.path, handoff.sink_version, servers, batch_topic
    )
    print(f"[plain batch write] the same results: {result['handoff']['plain_batch_write']}", flush=True)
    tail = TopicTail(servers, topic).start()
    runner_live = LiveRunner.from_manifest(spark, p)
    try:
        result["switch_s"] = round(runner_live.start().start_seconds, 2)
        result.update(live.running_rows(runner_live, feed, tail.probes_seen, load, label))
    finally:
        runner_live.stop()
        tail.stop()
    return result


def _plain(spark: SparkSession, base: Path, servers: str, topic: str, keys: int, load: live.Load) -> dict:
    result: dict = {"peer": "plain Spark, its Kafka sink (at least once)"}
    label = f"[live plain kafka {keys:,}]"
    create_topic(servers, topic, PARTITIONS)
    source = str(base / "plain_source")
    feed = live.Feed(spark, source, keys)
    feed.seed()
    query = PlainKafkaLive(spark, source, servers, topic, str(base / "plain_checkpoint"))
    tail = None
    try:
        result["backlog_s"] = round(query.start(), 2)  # the seed, in the query's first micro-batch(es)
        print(f"{label} seed of {keys:,} keys through the query: {result['backlog_s']} s", flush=True)
        tail = TopicTail(servers, topic).start()
        result.update(live.running_rows(query, feed, tail.probes_seen, load, label))
    finally:
        query.stop()
        if tail is not None:
            tail.stop()
    return result


def lines(result: dict) -> list[str]:
    """The report's table: the handoff's write and the live rows of both, with the ratios of the framework's."""
    keys = result["state_keys"]
    ours, plain = result["framework"], result["plain"]
    h = result["handoff_write"]
    batch = h["plain_batch_write"]
    rate = ours["latency"][0]["rate_rows_per_s"]
    out = [
        f"### results into a Kafka topic ({keys:,} keys, {PARTITIONS} partitions, one local broker, one run)",
        "",
        f"The handoff's {h['results']:,} results: the topic sink's transaction {h['topic_s']} s "
        f"({h['records']:,} records), a plain Spark batch write {batch['seconds']} s ({batch['records']:,} records): "
        f"{_ratio(h['topic_s'], batch['seconds'])}.",
        "",
        f"Live at {rate:,} rows/s (source commit → read by a read_committed consumer):",
        "",
        "| live path | p50 s | p99 s | micro-batch s (rows) |",
        "|---|---|---|---|",
    ]
    for r in (ours, plain):
        lat = r["latency"][0]
        out.append(
            f"| {r['peer']} | {lat['p50_s']} | {lat['p99_s']} | {r['batch']['median_s']} ({r['batch']['rows']:,}) |"
        )
    p50 = _ratio(ours["latency"][0]["p50_s"], plain["latency"][0]["p50_s"])
    out += ["", f"p50 of the topic sink against Spark's Kafka sink: {p50}.", ""]
    return out


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}×" if theirs else "–"
