"""The live phase on a keyed-reduce pipeline with a given number of keys of state (the benchmark's
live rows):

- **switch**: the live start after the handoff, up to its first checkpoint (its first progress row);
- **per-micro-batch cost**: the trigger time of micro-batches of ``batch_rows`` new rows, from Spark's own
  progress reports (the growth from 1M to 10M keys of state is the ratio of these);
- **latency** at a steady input rate: versions arrive every ``interval_s``, each with a probe key of its
  own; a version's latency is the time from its source commit to the first sink commit holding its probe,
  both read afterwards from the Delta logs (commit file times, and the sink's added files whose key
  statistics can hold a probe) — no polling, no Spark in the measurement;
- **drain**: rows appended while the live phase is stopped, then applied by a restart; rows per second of
  that catch-up is the most the live path sustains (micro-batches grow under load, so a steady input below
  this rate is kept up with). Its largest state store update's profile (task time in the rows, the store's
  load, gets, puts and commit; :meth:`phases._internal.state.keyed_store.StoreUpdate.profile_summary`) goes with it.

The source holds exactly ``state_keys`` keys (one record per key) before the handoff, so the state table
the live micro-batches merge into has that many rows.

``source="kafka"`` runs the same with the input on a Kafka topic (3 partitions, JSON values) on a local broker
(:mod:`phases._internal.runtime.local_kafka`): rows are produced through Spark's Kafka writer, each probe by the
confluent-kafka producer, and a probe's latency runs from its Kafka timestamp (set when it was produced) to the sink
commit.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks import data, variants
from benchmarks.report import sink_label
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSource
from phases._internal.live.runner import LiveRunner
from phases._internal.runtime.local_kafka import LocalKafka
from phases._internal.sources import synthetic
from phases._internal.storage import tables

PROBE = "~probe-"  # sorts after every "k…" key: the sink files that can hold a probe are told by their stats
SEED_VERSIONS = 4


def _seed_source(spark: SparkSession, feed, keys: int) -> None:
    """``keys`` distinct keys (the benchmark's ``k0000000`` form), one record each, in SEED_VERSIONS versions."""
    per = -(-keys // SEED_VERSIONS)
    for i in range(SEED_VERSIONS):
        ids = spark.range(i * per, min(keys, (i + 1) * per))
        feed.write(
            ids.select(
                F.concat(F.lit("k"), F.lpad(F.col("id").cast("string"), 7, "0")).alias("key"),
                F.timestamp_seconds(F.lit(int(synthetic.BASE_TIME.timestamp()) + i * 60) + F.col("id") % 60).alias(
                    "ts"
                ),
                (F.col("id") % 1000).alias("value"),
            ),
        )


def _commits(table: str) -> list[tuple[int, float, list[dict]]]:
    """(version, commit time, parsed actions) of every commit in the table's log."""
    out = []
    for f in sorted(Path(table, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out.append((int(f.stem), f.stat().st_mtime, actions))
    return out


def _may_hold_probe(add: dict) -> bool:
    try:
        return json.loads(add["stats"])["maxValues"]["key"] >= PROBE
    except (KeyError, TypeError, ValueError):
        return True  # no statistics: read the file


def probe_commits(sink: str) -> dict[str, float]:
    """Probe key -> commit time of the first sink commit that wrote it."""
    seen: dict[str, float] = {}
    for _, at, actions in _commits(sink):
        for a in actions:
            add = a.get("add")
            if not add or not _may_hold_probe(add):
                continue
            for k in pq.read_table(str(Path(sink) / add["path"]), columns=["key"]).column("key").to_pylist():
                if k and k.startswith(PROBE) and k not in seen:
                    seen[k] = at
    return seen


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


class Feed:
    """Appends versions of the keyed-reduce shape to a Delta source, each with event times after the last."""

    def __init__(self, spark: SparkSession, source: str, keys: int):
        self.spark, self.source, self.keys = spark, source, keys
        self.index = SEED_VERSIONS

    def create(self) -> None:
        synthetic.create_source(self.spark, self.source)

    def seed(self) -> None:
        """Creates the source with exactly ``keys`` keys (one record each), the next version after them."""
        self.create()
        _seed_source(self.spark, self, self.keys)
        self.index = SEED_VERSIONS

    def write(self, batch) -> None:
        synthetic.append(self.spark, self.source, batch)

    def batch(self, rows: int, probe: str | None):
        batch = data.keyed_reduce_batch(self.spark, rows, self.keys, self.index)
        if probe is not None:
            at = synthetic.BASE_TIME + timedelta(minutes=self.index)
            batch = batch.unionByName(self.spark.createDataFrame([(probe, at, 1)], synthetic.EVENT_SCHEMA))
        self.index += 1
        return batch

    def append(self, rows: int, probe: str | None = None) -> int:
        """Appends one version of ``rows`` rows (plus the probe row); returns its source version."""
        self.write(self.batch(rows, probe))
        return tables.version(self.spark, self.source)

    def arrivals(self, tokens: dict[str, int]) -> dict[str, float]:
        """Probe -> when its version was committed (the commit file's time)."""
        times = {v: at for v, at, _ in _commits(self.source)}
        return {probe: times[v] for probe, v in tokens.items()}

    def close(self) -> None:
        pass


class _KafkaFeed(Feed):
    """The same rows on a Kafka topic: Spark's Kafka writer for the rows, the confluent producer for a probe
    (its Kafka timestamp is its arrival)."""

    def __init__(self, spark: SparkSession, broker: LocalKafka, topic: str, keys: int):
        super().__init__(spark, topic, keys)
        self.broker, self.topic = broker, topic
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "log_level": 0, "linger.ms": 0})

    def create(self) -> None:
        self.broker.create_topic(self.topic, 3)

    def write(self, batch) -> None:
        (
            batch.select(F.col("key"), F.to_json(F.struct("key", "ts", "value")).alias("value"))
            .write.format("kafka")
            .option("kafka.bootstrap.servers", self.broker.bootstrap_servers)
            .option("topic", self.topic)
            .save()
        )

    def append(self, rows: int, probe: str | None = None) -> float:
        """Produces ``rows`` rows, then the probe; returns the probe's Kafka timestamp (seconds)."""
        self.write(self.batch(rows, None))
        if probe is None:
            return time.time()
        at = (synthetic.BASE_TIME + timedelta(minutes=self.index - 1)).isoformat().replace("+00:00", "Z")
        stamp: list[float] = []
        self.producer.produce(
            self.topic,
            key=probe.encode(),
            value=json.dumps({"key": probe, "ts": at, "value": 1}).encode(),
            on_delivery=lambda err, msg: stamp.append(msg.timestamp()[1] / 1000),
        )
        self.producer.flush()
        return stamp[0]

    def arrivals(self, tokens: dict[str, float]) -> dict[str, float]:
        return dict(tokens)

    def close(self) -> None:
        self.producer.flush()


def _batch_costs(live: LiveRunner, feed: Feed, batches: int, rows: int) -> list[float]:
    """Seconds of each micro-batch that applied one version of ``rows`` rows (Spark's triggerExecution)."""
    costs = []
    for _ in range(batches):
        feed.append(rows)
        live.process_available()
        progress = [p for p in live.query.recentProgress if p["numInputRows"] > 0]
        costs.append(progress[-1]["durationMs"]["triggerExecution"] / 1000)
    return costs


# Where a live path's results are told to have arrived: a Delta table (its commits, read from its log afterwards) or
# a function of the probes that returns when each was seen (a topic's tail: benchmarks.live_topics).
Sink = str | Callable[[Iterable[str]], dict[str, float]]


def _steady(live: LiveRunner, feed: Feed, sink: Sink, rate: int, versions: int, interval_s: float) -> dict:
    """Versions of ``rate * interval_s`` rows every ``interval_s``; latency of each from the logs."""
    probes: dict[str, int] = {}
    sent = 0
    known = {p["batchId"] for p in live.query.recentProgress}
    began = time.perf_counter()
    for i in range(versions):
        # Each version carries the rows due since the start: the rate holds when an append takes longer
        # than the interval (the live query competes with the feed for the same cores).
        rows = max(1, int(rate * (time.perf_counter() - began + interval_s)) - sent)
        t = time.perf_counter()
        probe = f"{PROBE}{rate:06d}-{i:04d}"
        probes[probe] = feed.append(rows, probe)
        sent += rows
        live.raise_if_failed()
        time.sleep(max(0.0, interval_s - (time.perf_counter() - t)))
    offered = sent / (time.perf_counter() - began)
    live.process_available()
    arrived = feed.arrivals(probes)
    seen = sink(probes) if callable(sink) else probe_commits(sink)
    latencies = [seen[k] - arrived[k] for k in probes if k in seen]
    if len(latencies) != len(probes):
        raise SystemExit(f"live latency at {rate} rows/s: {len(probes) - len(latencies)} probes never reached the sink")
    # Where a slow version's time went: the micro-batches of the run (Spark's progress: rows, seconds, and the
    # slowest one's phases).
    ran = [p for p in live.query.recentProgress if p["batchId"] not in known and p["numInputRows"] > 0]
    slowest = max(ran, key=lambda p: p["durationMs"].get("triggerExecution", 0), default=None)
    return {
        "rate_rows_per_s": rate,
        "offered_rows_per_s": round(offered),
        "versions": versions,
        "rows_per_version": round(sent / versions),
        "interval_s": interval_s,
        "p50_s": _percentile(latencies, 0.5),
        "p99_s": _percentile(latencies, 0.99),
        "mean_s": round(statistics.fmean(latencies), 3),
        "max_s": round(max(latencies), 3),
        "latencies_s": [round(seen[k] - arrived[k], 2) for k in probes],
        "micro_batches": [[p["numInputRows"], round(p["durationMs"].get("triggerExecution", 0) / 1e3, 2)] for p in ran],
        "slowest_micro_batch_ms": slowest["durationMs"] if slowest else {},
    }


@dataclass(frozen=True)
class Load:
    """What the live rows put through a live path: ``batches`` micro-batches of ``batch_rows`` rows, ``versions``
    versions at each of ``rates`` (rows/s, a version every ``interval_s``), then ``drain_rows`` rows in
    ``drain_versions`` versions appended while it is stopped (0: no drain)."""

    rates: tuple[int, ...] = (2_000, 20_000)
    versions: int = 30
    interval_s: float = 1.0
    batches: int = 5
    batch_rows: int = 2_000
    drain_rows: int = 0
    drain_versions: int = 10


def running_rows(runner, feed: Feed, sink: Sink, load: Load, label: str) -> dict:
    """The micro-batch cost and the latency at each rate of a started live path (the framework's or a peer's)."""
    costs = _batch_costs(runner, feed, load.batches, load.batch_rows)
    batch = {
        "rows": load.batch_rows,
        "seconds": [round(c, 2) for c in costs],
        "median_s": round(statistics.median(costs), 2),
    }
    print(f"{label} micro-batch of {load.batch_rows:,} rows: {batch}", flush=True)
    latency = []
    for rate in load.rates:
        latency.append(_steady(runner, feed, sink, rate, load.versions, load.interval_s))
        print(f"{label} {latency[-1]}", flush=True)
    return {"batch": batch, "latency": latency}


class _StoreProfiles(logging.Handler):
    """The profiles of the state store updates logged while it is attached (``phases._internal.state.keyed_store``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.profiles: list[dict[str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        profile = getattr(record, "store_profile", None)
        if profile is not None:
            self.profiles.append(profile)


@contextmanager
def store_profiles() -> Iterator[list[dict[str, int]]]:
    """The state store updates' profiles while in the block (the store logs them at DEBUG level)."""
    logger = logging.getLogger("phases._internal.state.keyed_store")
    handler, level = _StoreProfiles(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.profiles
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def drain_after_pause(feed: Feed, load: Load, restart: Callable[[], None], label: str) -> dict:
    """Rows appended while the live path is stopped, then applied by ``restart`` (which returns once they are)."""
    for _ in range(load.drain_versions):
        feed.append(load.drain_rows // load.drain_versions)
    t = time.perf_counter()
    with store_profiles() as profiles:
        restart()
    seconds = time.perf_counter() - t
    rows = load.drain_versions * (load.drain_rows // load.drain_versions)
    drain = {"rows": rows, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds)}
    if profiles:
        drain["store_update"] = max(profiles, key=lambda p: p.get("rows_ms", 0))
    print(f"{label} drain: {drain}", flush=True)
    return drain


def measure(
    spark: SparkSession,
    work: Path,
    *,
    state_keys: int,
    rates: tuple[int, ...] = (2_000, 20_000),
    versions: int = 30,
    interval_s: float = 1.0,
    batches: int = 5,
    batch_rows: int = 2_000,
    drain_rows: int = 0,
    drain_versions: int = 10,
    source_kind: str = "delta",
    sink_mode: str = "upsert",
    compact_every: timedelta | None = None,
) -> dict:
    """The live rows for a pipeline with ``state_keys`` keys of state and its sink in ``sink_mode`` (see the module
    docstring); a changelog sink compacts every ``compact_every`` (None: the sink's default; 0: never while the
    live phase runs)."""
    off = "_no_compaction" if compact_every is not None and not compact_every else ""
    base = work / f"live_{source_kind}_{sink_mode}{off}_{state_keys}"
    shutil.rmtree(base, ignore_errors=True)
    source = str(base / "source")
    broker = None
    if source_kind == "kafka":
        broker = LocalKafka(base / "kafka", heap="512m").start()
        feed = _KafkaFeed(spark, broker, "events", state_keys)
    else:
        feed = Feed(spark, source, state_keys)
    load = Load(rates, versions, interval_s, batches, batch_rows, drain_rows, drain_versions)
    try:
        return _measure(spark, base, feed, state_keys, load, sink_mode, compact_every)
    finally:
        feed.close()
        if broker is not None:
            broker.stop()


def _measure(
    spark, base, feed, state_keys: int, load: Load, sink_mode: str, compact_every: timedelta | None = None
) -> dict:
    kafka = isinstance(feed, _KafkaFeed)
    t = time.perf_counter()
    feed.seed()
    generate_s = time.perf_counter() - t
    p = variants.pipeline(str(base / "source"), str(base / "two_phase")).model_copy(
        update={"checkpoint_interval": timedelta(milliseconds=500)}
    )
    sink = {"mode": sink_mode} if compact_every is None else {"mode": sink_mode, "compact_every": compact_every}
    p = p.model_copy(update={"sink": p.sink.model_copy(update=sink)})
    if kafka:
        value_schema = "key string, ts timestamp, value bigint"
        source = KafkaSource(
            topic=feed.topic, bootstrap_servers=feed.broker.bootstrap_servers, value_schema=value_schema
        )
        p = p.model_copy(update={"source": source})
    t = time.perf_counter()
    runner = BacklogRunner(spark, p)
    handoff = runner.run()
    result: dict = {
        "source": "kafka" if kafka else "delta",
        "sink_mode": sink_mode,
        # A changelog sink's background compaction: seconds between runs (0: none while the live phase runs).
        **({"compact_every_s": p.sink.compact_every.total_seconds()} if sink_mode == "changelog" else {}),
        "state_keys": handoff.state_rows,
        "generate_s": round(generate_s, 2),
        "backlog_s": round(time.perf_counter() - t, 2),
    }
    result["backlog_timings"] = {k: round(v, 2) for k, v in runner.timings.items()}
    label = f"[live {result['source']} {sink_label(result)} {state_keys:,}]"
    print(f"{label} backlog of {handoff.state_rows:,} keys: {result['backlog_s']} s", flush=True)
    live = LiveRunner.from_manifest(spark, p)
    try:
        result["switch_s"] = round(live.start().start_seconds, 2)
        print(f"{label} switch (first checkpoint): {result['switch_s']} s", flush=True)
        result.update(running_rows(live, feed, p.sink.path, load, label))
    finally:
        live.stop()
    if load.drain_rows:

        def restart() -> None:
            restarted = LiveRunner.from_manifest(spark, p)
            try:
                restarted.start()
            finally:
                restarted.stop()

        result["drain"] = drain_after_pause(feed, load, restart, label)
    return result
