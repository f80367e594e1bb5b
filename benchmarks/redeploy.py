"""A redeploy while data arrives, at a given number of sink keys (the benchmark's redeploy rows).

A keyed reduce with ``keys`` keys of state serves live (upsert sink, trigger 0.5 s) while a feed appends a version of
``rate * interval_s`` rows every ``interval_s``, each with a probe key of its own. A changed definition (one more
aggregation: the shape changes, so a new generation is built beside the serving one, caught up, checked and swapped
in) is redeployed with :class:`phases._internal.redeploy.runner.Redeploy`; the serving live phase runs in this process
and stops on the redeploy's request, and the new definition's live phase is started as the Dagster live step starts
it (``drain=False``). The feed goes on throughout.

Measured:

- **not fresh**: from the serving live phase's stop to the new live phase's first micro-batch (what the demo
  reports), and the worst probe latency of the versions that arrived in that time (a probe's source commit to the
  first commit of the consumer-facing table holding it, both read from the Delta logs afterwards);
- **the swap's copy**: the new generation's results copied into the consumer-facing table (``keys`` rows), and the
  copy of the old generation's results kept for a rollback (after the swap's commit: not in the time without fresh
  results);
- the redeploy's own steps (its backlog, catch-up rounds, checks).

The consumer-facing table is checked equal to a plain ``groupBy().agg()`` of the new definition over the whole
source before the figures count (the feed's records are all on time).
"""

from __future__ import annotations

import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks import variants
from benchmarks.live import PROBE, Feed, probe_commits
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Aggregation, KafkaSink, KeyedAggregate
from phases._internal.live.runner import LiveRunner
from phases._internal.redeploy.runner import Redeploy
from phases._internal.runtime.local_kafka import LocalKafka


class _Feeder:
    """Appends a version with a probe every ``interval_s`` in a thread of its own until stopped; remembers each
    probe's source version."""

    def __init__(self, feed: Feed, rows: int, interval_s: float):
        self.feed, self.rows, self.interval_s = feed, rows, interval_s
        self.probes: dict[str, int] = {}
        self.appended_at: dict[str, float] = {}  # probe -> wall-clock time its append returned
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-redeploy-feed", daemon=True)

    def start(self) -> _Feeder:
        self._thread.start()
        return self

    def _run(self) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                t = time.perf_counter()
                probe = f"{PROBE}redeploy-{i:05d}"
                self.probes[probe] = self.feed.append(self.rows, probe)
                self.appended_at[probe] = time.time()
                i += 1
                self._stop.wait(max(0.0, self.interval_s - (time.perf_counter() - t)))
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise SystemExit(f"the redeploy benchmark's feed failed: {self.error!r}")


def measure(
    spark: SparkSession,
    work: Path,
    *,
    keys: int,
    rate: int = 2_000,
    interval_s: float = 1.0,
    before_s: float = 5.0,
    after_s: float = 10.0,
    live_rounds: int = 5,
    topic: bool = False,
) -> dict:
    """The redeploy rows with ``keys`` keys of state (see the module docstring): the feed runs ``before_s`` before the
    redeploy and ``after_s`` after the new live phase's start; ``live_rounds``: the redeploy's catch-up rounds at
    most (its default). ``topic``: the results also go to a Kafka topic (a ``KafkaSink`` on a local broker): the
    swap publishes the new definition's whole result into it in one transaction, timed as ``topic_swap_s``, and the
    topic, folded as a consumer folds it, is checked equal to the consumer-facing table."""
    base = work / f"redeploy{'_topic' if topic else ''}_{keys}"
    shutil.rmtree(base, ignore_errors=True)
    source = str(base / "source")
    feed = Feed(spark, source, keys)
    feed.seed()
    broker = None
    update: dict = {"checkpoint_interval": timedelta(milliseconds=500)}
    if topic:
        broker = LocalKafka(base / "kafka", heap="512m").start()
        broker.create_topic("results", 3, **{"cleanup.policy": "compact"})
        update["sink"] = KafkaSink(topic="results", bootstrap_servers=broker.bootstrap_servers, path=str(base / "sink"))
    try:
        return _measure(spark, base, feed, source, keys, rate, interval_s, before_s, after_s, live_rounds, update)
    finally:
        if broker is not None:
            broker.stop()


def _measure(
    spark: SparkSession,
    base: Path,
    feed: Feed,
    source: str,
    keys: int,
    rate: int,
    interval_s: float,
    before_s: float,
    after_s: float,
    live_rounds: int,
    update: dict,
) -> dict:
    serving_def = variants.pipeline(source, str(base / "pipeline")).model_copy(update=update)
    changed = serving_def.model_copy(
        update={
            "operator": KeyedAggregate(
                aggregations=[
                    *serving_def.operator.aggregations,
                    Aggregation(name="top", kind="max", column="value"),
                ]
            )
        }
    )
    label = f"[redeploy{' into a topic' if 'sink' in update else ''} {keys:,}]"
    t = time.perf_counter()
    BacklogRunner(spark, serving_def).run()
    result: dict = {
        "keys": keys,
        "rate_rows_per_s": rate,
        "interval_s": interval_s,
        "trigger_s": serving_def.checkpoint_interval.total_seconds(),
    }
    result["first_backlog_s"] = round(time.perf_counter() - t, 2)
    serving = LiveRunner.from_manifest(spark, serving_def)
    serving.start()
    feeder = _Feeder(feed, max(1, int(rate * interval_s)), interval_s).start()
    new_live = None
    try:
        time.sleep(before_s)
        t = time.perf_counter()
        redeployed = Redeploy(spark, changed, stop_timeout_s=600, live_rounds=live_rounds).run(
            reason="benchmark: one more aggregation"
        )
        result["redeploy_s"] = round(time.perf_counter() - t, 2)
        returned_s = time.time()
        if not redeployed.swapped:
            raise SystemExit(f"{label} the redeploy did not swap: {redeployed}")
        new_live = LiveRunner.from_manifest(spark, changed)
        built_s = time.time()
        started = new_live.start(drain=False)
        # The copy of the old results for a rollback: made by that start once its first micro-batch was recorded,
        # the last thing before it returns (so not part of the start's own figures below).
        kept_s = new_live.kept.seconds if new_live.kept is not None else 0.0
        result["kept_s"] = round(kept_s, 2) if new_live.kept is not None else None
        query_started_s = time.time() - kept_s - started.start_seconds
        first_batch_us = started.first_batch_at_us
        time.sleep(after_s)
    finally:
        feeder.stop()
        serving.stop()
    try:
        progress = [p for p in new_live.query.recentProgress if p["numInputRows"] > 0]
        first_trigger_s = progress[0]["durationMs"]["triggerExecution"] / 1e3 if progress else None
        # The same query's later micro-batches, warm, under the same feed: what one micro-batch costs without a start
        # (an upsert into the consumer-facing table's rows), the floor of any micro-batch after the swap.
        warm_s = sorted(p["durationMs"]["triggerExecution"] / 1e3 for p in progress[1:])
        new_live.process_available()
        if first_batch_us is None:  # nothing waited at the start: its first micro-batch came with the feed
            first_batch_us = new_live.incremental.first_batch_at_us
    finally:
        new_live.stop()
    stopped_s, swapped_s = redeployed.old_stopped_at_us / 1e6, redeployed.swapped_at_us / 1e6
    seen = probe_commits(changed.sink.path)
    missing = [p for p in feeder.probes if p not in seen]
    if missing:
        raise SystemExit(f"{label} {len(missing)} probes never reached the consumer-facing table: {missing[:3]}")
    arrived = feed.arrivals(feeder.probes)
    latencies = {p: seen[p] - arrived[p] for p in feeder.probes}
    # The versions committed while no live phase served: from the old one's stop to the new one's first micro-batch.
    gap_end_s = first_batch_us / 1e6 if first_batch_us is not None else max(seen.values())
    during = [lat for p, lat in latencies.items() if stopped_s <= arrived[p] <= gap_end_s]
    result.update(
        {
            "not_fresh_s": round(gap_end_s - stopped_s, 2),
            "stop_to_swap_s": round(swapped_s - stopped_s, 2),
            "swap_to_first_batch_s": round(gap_end_s - swapped_s, 2),
            # Its parts: the redeploy's steps after the commit (the log), the new live runner's checks,
            # its live lease and serving check, then its start (tables, progress log, the query) through its first
            # micro-batch, of which Spark's trigger time of that micro-batch.
            "swap_to_return_s": round(returned_s - swapped_s, 2),
            "live_runner_s": round(built_s - returned_s, 2),
            "live_start_s": round(query_started_s - built_s, 2),
            "first_micro_batch_s": round(gap_end_s - query_started_s, 2),
            "first_micro_batch_trigger_s": first_trigger_s,
            "warm_micro_batches": len(warm_s),
            "warm_micro_batch_median_s": warm_s[len(warm_s) // 2] if warm_s else None,
            "warm_micro_batch_min_s": warm_s[0] if warm_s else None,
            "versions_in_the_gap": len(during),
            "worst_latency_in_the_gap_s": round(max(during), 2) if during else None,
            "worst_latency_s": round(max(latencies.values()), 2),
            "probes": len(latencies),
            "timings": {k: round(v, 2) for k, v in redeployed.timings.items()},
            "generation": redeployed.generation,
            "equal": _same_as_plain(spark, source, changed.sink.path),
        }
    )
    if isinstance(changed.sink, KafkaSink):
        from phases import read_topic

        table = spark.read.format("delta").load(changed.sink.path)
        folded = read_topic(spark, changed).select(*table.columns)
        result["topic_swap_s"] = result["timings"].get("topic_swap_s")
        result["topic_equal"] = folded.count() == table.count() and folded.exceptAll(table).limit(1).count() == 0
    print(
        f"{label} not fresh {result['not_fresh_s']} s (stop -> swap {result['stop_to_swap_s']} s, swap -> first "
        f"micro-batch {result['swap_to_first_batch_s']} s); the swap's copy "
        f"{result['timings'].get('swap_commit_s')} s; "
        f"equal={result['equal']}",
        flush=True,
    )
    return result


def _same_as_plain(spark: SparkSession, source: str, sink: str) -> bool:
    """The consumer-facing table holds, per key, the count, sum and max of the source's records."""
    expected = (
        spark.read.format("delta")
        .load(source)
        .groupBy("key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"), F.max("value").alias("top"))
    )
    actual = spark.read.format("delta").load(sink).select("key", "n", "total", "top")
    return actual.count() == expected.count() and actual.exceptAll(expected).limit(1).count() == 0


def _floor(result: dict) -> float | None:
    """The swap's copy plus the new live phase's fastest warm micro-batch (None: either not measured)."""
    copy, fastest = result["timings"].get("swap_commit_s"), result.get("warm_micro_batch_min_s")
    return None if copy is None or fastest is None else round(copy + fastest, 2)


def _shown(seconds: float | None) -> str:
    return "not measured" if seconds is None else f"{seconds:.2f}"


def lines(result: dict) -> list[str]:
    """The report's rows: the time without fresh results and the swap's copy, beside their targets."""
    t = result["timings"]
    copy = t.get("swap_commit_s")
    # The swap's copy plus one trigger interval (results written before the interval was recorded: 0.5 s).
    bound = (copy or 0) + result.get("trigger_s", 0.5)
    worst = result["worst_latency_in_the_gap_s"]
    into = " into a result topic" if "topic_swap_s" in result else ""  # a KafkaSink: the same rows, its swap timed
    return [
        "",
        f"#### redeploy{into} while data arrives ({result['keys']:,} keys of state and sink rows, "
        f"{result['rate_rows_per_s']:,} rows/s, a version every {result['interval_s']} s; one more aggregation)",
        "",
        "| measure | seconds | target |",
        "|---|---|---|",
        f"| not fresh: the old live phase's stop → the new one's first micro-batch | {result['not_fresh_s']} | ≤ the "
        f"swap's copy + one trigger interval = {bound:.2f} ({'met' if result['not_fresh_s'] <= bound else 'missed'}) |",
        f"| of it: stop → the swap's commit | {result['stop_to_swap_s']} | |",
        f"| of it: the swap's commit → the first micro-batch | {result['swap_to_first_batch_s']} | |",
        f"| of that: the redeploy's steps after its commit (the log) | {result.get('swap_to_return_s')} | |",
        f"| of that: the new live runner's checks, then its lease and serving check | {result.get('live_runner_s')}, "
        f"{result.get('live_start_s')} | |",
        f"| of that: its start (tables, progress log, query) → its first micro-batch recorded (Spark's trigger time of "
        f"it) | {result.get('first_micro_batch_s')} ({result.get('first_micro_batch_trigger_s')}) | |",
        f"| the new live phase's later micro-batches, warm (Spark's trigger time; {result.get('warm_micro_batches')} "
        f"of them): median, fastest | {result.get('warm_micro_batch_median_s')}, "
        f"{result.get('warm_micro_batch_min_s')} | |",
        f"| the floor of any design that applies a micro-batch after the swap: the swap's copy + the fastest warm "
        f"micro-batch | {_shown(_floor(result))} | |",
        f"| the swap's copy of {result['keys']:,} rows | {copy} | ≤ 3 "
        f"({'met' if copy is not None and copy <= 3 else 'missed'}) |",
        f"| the old generation's results kept for a rollback (by the new live start, after its first micro-batch) | "
        f"{result.get('kept_s')} | |",
        f"| worst probe latency of the {result['versions_in_the_gap']} versions that arrived in the gap | {worst} | |",
        f"| the whole redeploy (backlog beside, catch-up, checks, swap) | {result['redeploy_s']} | |",
        *(
            [
                f"| the swap published into the result topic: {result['keys']:,} records in one transaction | "
                f"{result['topic_swap_s']} | |"
            ]
            if "topic_swap_s" in result
            else []
        ),
        "",
        f"Results equal a plain `groupBy().agg()` of the new definition over the whole source: {result['equal']}"
        + (f"; the topic, folded, equals the table: {result['topic_equal']}." if "topic_equal" in result else "."),
    ]
