"""The backlog from a Kafka topic beside the backlog from a Delta table, on the same rows.

The rows are written once to a Delta table (``versions`` versions, the change data feed on) and then, read back from
that table, to a 3-partition topic on a local KRaft broker (:mod:`phases._internal.runtime.local_kafka`) as JSON values:
the two sources hold the same records. Each backlog (the keyed reduce of :func:`benchmarks.variants.pipeline`) runs
``runs`` times in one JVM, alternating; the rows per second of each run and the Kafka ÷ Delta ratio of the fastest runs
are reported, with the backlog's own step timings (where the time goes). The target (:data:`TARGET`): the Kafka backlog
at 0.6 of the Delta backlog's rows per second or more. The topic is read with the default arrival chunks and with chunks
of about one version's records per partition.

Beside them runs what a Spark user would write instead: **a plain Spark batch job over the same topic**
(``spark.read.format("kafka")`` with the read options the engine uses, the same JSON decoding with ``from_json``, the
same aggregation, written to Delta), checked equal before its time counts: per key, its counts and sums are the
framework's sink plus the records the framework quarantined as late. Its time is split into shares by running its
prefixes into Spark's ``noop`` sink: the fetch alone, the fetch and the decoding, and the whole job
(:data:`PLAIN_TARGET`: the Kafka backlog at most 1.15 times the plain job's time).

Arrival order differs by nature: a Delta table's versions, a topic's arrival chunks (``backlog_chunk_records``
offsets per partition), so the late records, hence the quarantine's rows, may differ between the two.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks import variants
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSource
from phases._internal.runtime.local_kafka import LocalKafka
from phases._internal.sources import synthetic
from phases._internal.sources.kafka import MAX_POLL_RECORDS

TOPIC = "events"
TARGET = 0.6  # Kafka ÷ Delta rows per second
PLAIN_TARGET = 1.15  # the Kafka backlog's seconds ÷ the plain Spark job's over the same topic
VALUE_SCHEMA = "key string, ts timestamp, value bigint"
PARTITIONS = 3


def measure(
    spark: SparkSession,
    work: Path,
    rows: int,
    keys: int,
    versions: int = 10,
    runs: int = 3,
    version_chunks: bool = True,
) -> dict:
    """``version_chunks=False`` leaves out the run with version-sized chunks (the CI smoke run)."""
    base = work / "kafka_backlog"
    shutil.rmtree(base, ignore_errors=True)
    source = str(base / "source")
    broker = LocalKafka(base / "kafka", heap="512m").start()
    try:
        broker.create_topic(TOPIC, PARTITIONS)
        t = time.perf_counter()
        synthetic.create_source(spark, source)
        for i in range(versions):
            synthetic.append(
                spark, source, synthetic.event_batch(spark, rows=rows // versions, keys=keys, batch_index=i)
            )
            written = spark.read.format("delta").option("versionAsOf", i + 1).load(source)
            previous = spark.read.format("delta").option("versionAsOf", i).load(source)
            (
                written.exceptAll(previous)
                .select(F.col("key"), F.to_json(F.struct("key", "ts", "value")).alias("value"))
                .write.format("kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                .option("topic", TOPIC)
                .save()
            )
        generate_s = time.perf_counter() - t
        # The default chunk size (what a user runs), and chunks of about one version's records per partition (the
        # rows are keyed across partitions, so these arrivals only approximate the table's versions).
        matched = max(1, rows // versions // PARTITIONS)
        default_chunk = KafkaSource.model_fields["backlog_chunk_records"].default

        def kafka(chunk: int, name: str):
            spec = KafkaSource(
                topic=TOPIC,
                bootstrap_servers=broker.bootstrap_servers,
                value_schema=VALUE_SCHEMA,
                backlog_chunk_records=chunk,
            )
            return variants.pipeline(source, str(base / name)).model_copy(update={"source": spec})

        sources = {
            "delta": variants.pipeline(source, str(base / "delta_run")),
            "kafka": kafka(default_chunk, "kafka_run"),
        }
        if version_chunks:
            sources["kafka, version-sized chunks"] = kafka(matched, "kafka_version_chunks_run")
        out: dict = {
            "rows": rows,
            "keys": keys,
            "versions": versions,
            "partitions": PARTITIONS,
            "chunk_records": matched,
            "default_chunk_records": default_chunk,
            "generate_s": round(generate_s, 1),
        }
        for name in sources:
            out[name] = []
        out["plain"] = []
        plain_out = str(base / "plain_run" / "sink")
        for run in range(runs):
            out["plain"].append(plain_job(spark, broker.bootstrap_servers, plain_out))
            print(f"[kafka backlog] run {run} plain Spark: {out['plain'][-1]}", flush=True)
            for name, pipeline in sources.items():
                runner = BacklogRunner(spark, pipeline)
                t = time.perf_counter()
                handoff = runner.run(reset=True)
                seconds = time.perf_counter() - t
                out[name].append(
                    {
                        "seconds": round(seconds, 2),
                        "input_rows": handoff.input_rows,
                        "late_rows": handoff.late_rows,
                        "rows_per_s": round(handoff.input_rows / seconds),
                        "timings": {k: round(v, 2) for k, v in runner.timings.items()},
                    }
                )
                print(f"[kafka backlog] run {run} {name}: {out[name][-1]}", flush=True)
        best = {name: max(out[name], key=lambda r: r["rows_per_s"]) for name in sources}
        out["ratio"] = round(best["kafka"]["rows_per_s"] / best["delta"]["rows_per_s"], 2)
        # The last Kafka run's tables are the ones on disk: the default-chunk run when it is the last source.
        last = sources["kafka, version-sized chunks"] if version_chunks else sources["kafka"]
        out["plain_equal"] = same_as_plain(spark, plain_out, last.sink.path, last.locations.quarantine)
        if not out["plain_equal"]:
            raise AssertionError(
                f"the plain Spark job over the topic ({plain_out}) differs from the framework's sink and quarantine "
                f"({last.sink.path}, {last.locations.quarantine}): its time would not count"
            )
        plain_best = min(r["seconds"] for r in out["plain"])
        out["plain_ratio"] = round(best["kafka"]["seconds"] / plain_best, 2)
        out["plain_target_met"] = out["plain_ratio"] <= PLAIN_TARGET
        if version_chunks:
            smaller = best["kafka, version-sized chunks"]["rows_per_s"]
            out["ratio_version_chunks"] = round(smaller / best["delta"]["rows_per_s"], 2)
        out["target_met"] = out["ratio"] >= TARGET
        return out
    finally:
        broker.stop()


def _plain_read(spark: SparkSession, servers: str):
    """The topic as Spark reads it, with the read options the engine gives its own read (one task per core, 10,000
    records a poll): the peer differs in what it does with the records, not in how it fetches them."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("failOnDataLoss", "true")
        .option("minPartitions", str(spark.sparkContext.defaultParallelism))
        .option("kafka.max.poll.records", str(MAX_POLL_RECORDS))
        .load()
    )


def _decoded(df, column: str = "value"):
    """The records of ``column``'s JSON text (a topic's values, or the quarantine's kept records)."""
    return df.select(F.from_json(F.col(column).cast("string"), VALUE_SCHEMA).alias("r")).select("r.*")


def plain_job(spark: SparkSession, servers: str, out: str, decoded=_decoded) -> dict:
    """The plain Spark batch job over the topic, timed whole, with its shares from its prefixes run into the
    ``noop`` sink (each prefix fetches the topic again: the shares are differences of separate runs). ``decoded``: how
    the job decodes the topic's values (JSON by default)."""
    t = time.perf_counter()
    _plain_read(spark, servers).write.format("noop").mode("overwrite").save()
    fetch_s = time.perf_counter() - t
    t = time.perf_counter()
    decoded(_plain_read(spark, servers)).write.format("noop").mode("overwrite").save()
    decode_s = time.perf_counter() - t
    t = time.perf_counter()
    variants.aggregate(decoded(_plain_read(spark, servers))).write.format("delta").mode("overwrite").save(out)
    seconds = time.perf_counter() - t
    return {
        "seconds": round(seconds, 2),
        "fetch_s": round(fetch_s, 2),
        "decode_s": round(max(0.0, decode_s - fetch_s), 2),
        "aggregate_and_write_s": round(max(0.0, seconds - decode_s), 2),
    }


def same_as_plain(spark: SparkSession, plain: str, sink: str, quarantine: str) -> bool:
    """Every record counted once: per key, the plain job's count and sum equal the framework's sink plus the records
    it quarantined (late, by the framework's watermark; the plain job has none)."""
    if DeltaTable.isDeltaTable(spark, quarantine):
        late = _decoded(spark.read.format("delta").load(quarantine).filter(F.col("phase") == "backlog"), "record")
    else:  # nothing was late: the framework made no quarantine table
        late = spark.createDataFrame([], VALUE_SCHEMA)
    both = (
        spark.read.format("delta")
        .load(sink)
        .select("key", "n", "total")
        .unionByName(variants.aggregate(late))
        .groupBy("key")
        .agg(F.sum("n").alias("n"), F.sum("total").alias("total"))
    )
    return variants.same_results(spark, plain, both)


def lines(result: dict) -> list[str]:
    """The report's table: each source's best run, its rows per second and where its time went."""
    out = [
        "",
        f"#### backlog from Kafka beside Delta ({result['rows']:,} rows, {result['keys']:,} keys; the same records in "
        f"a {result['versions']}-version Delta table and a {result['partitions']}-partition topic, JSON values)",
        "",
        "| source | backlog (best of runs) | rows/s | runs (s) | late rows | statistics | quarantine | state | sink |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("delta", "kafka", "kafka, version-sized chunks"):
        if name not in result:
            continue
        best = max(result[name], key=lambda r: r["rows_per_s"])
        t = best["timings"]
        all_runs = ", ".join(str(r["seconds"]) for r in result[name])
        log = " (log)" if t.get("statistics_from_log") else ""
        out.append(
            f"| {name} | {best['seconds']} s | {best['rows_per_s']:,} | {all_runs} | {best.get('late_rows', '')} "
            f"| {t.get('watermarks_s', 0)} s{log} | {t.get('quarantine_s', 0)} s | {t.get('state_s', 0)} s "
            f"| {t.get('sink_s', 0)} s |"
        )
    if result.get("plain"):
        best = min(result["plain"], key=lambda r: r["seconds"])
        all_runs = ", ".join(str(r["seconds"]) for r in result["plain"])
        out.append(
            f"| plain Spark batch job over the topic | {best['seconds']} s | "
            f"{round(result['rows'] / best['seconds']):,} | {all_runs} | (none: no watermark) | fetch "
            f"{best['fetch_s']} s | decode {best['decode_s']} s | aggregate and write "
            f"{best['aggregate_and_write_s']} s | |"
        )
    verdict = "met" if result["target_met"] else "missed"
    if "plain_ratio" in result:
        plain_verdict = "met" if result["plain_target_met"] else "missed"
        out += [
            "",
            f"Kafka backlog ÷ the plain Spark job over the same topic (seconds, best runs; results equal: "
            f"{result['plain_equal']}): **{result['plain_ratio']}×** (target ≤ {PLAIN_TARGET}×: {plain_verdict}). "
            "The plain job's shares are the differences of its prefixes run into Spark's `noop` sink.",
        ]
    out += [
        "",
        f"Kafka ÷ Delta rows per second: **{result['ratio']}** with the default "
        f"{result['default_chunk_records']:,}-record arrival chunks (target ≥ {TARGET}: {verdict})"
        + (
            f"; {result['ratio_version_chunks']} with chunks of about one version's records "
            f"({result['chunk_records']:,} a partition: smaller arrivals, more records late, more to quarantine)."
            if "ratio_version_chunks" in result
            else "."
        ),
    ]
    return out


def registered_format_runs(
    spark: SparkSession, pipeline, servers: str, plain_out: str, decoded, runs: int, label: str, target: float
) -> dict:
    """The framework's backlog of ``pipeline`` (a topic of registry-format values: Avro, Protobuf) and the plain job
    decoding with ``decoded``, ``runs`` times each, alternating; the plain job checked equal to the framework's sink
    plus its quarantine. The runs, the equality and the ratio of the best runs (against ``target``)."""
    from phases._internal.backlog.runner import BacklogRunner

    out: dict = {"framework": [], "plain": []}
    for run in range(runs):
        out["plain"].append(plain_job(spark, servers, plain_out, decoded))
        print(f"[{label}] run {run} plain Spark: {out['plain'][-1]}", flush=True)
        runner = BacklogRunner(spark, pipeline)
        t = time.perf_counter()
        handoff = runner.run(reset=True)
        seconds = time.perf_counter() - t
        out["framework"].append(
            {
                "seconds": round(seconds, 2),
                "input_rows": handoff.input_rows,
                "late_rows": handoff.late_rows,
                "timings": {k: round(v, 2) for k, v in runner.timings.items()},
            }
        )
        print(f"[{label}] run {run} framework: {out['framework'][-1]}", flush=True)
    out["plain_equal"] = same_as_plain(spark, plain_out, pipeline.sink.path, pipeline.locations.quarantine)
    if not out["plain_equal"]:
        raise AssertionError(
            f"the plain job ({plain_out}) differs from the framework's sink and quarantine: its time would not count"
        )
    best = min(r["seconds"] for r in out["framework"])
    out["ratio"] = round(best / min(r["seconds"] for r in out["plain"]), 2)
    out["target_met"] = out["ratio"] <= target
    return out


def registered_format_lines(result: dict, title: str, plain_name: str, target: float) -> list[str]:
    """The report's table of :func:`registered_format_runs`' result."""
    best = min(result["framework"], key=lambda r: r["seconds"])
    plain = min(result["plain"], key=lambda r: r["seconds"])
    t = best["timings"]
    verdict = "met" if result["target_met"] else "missed"
    plain_runs = ", ".join(str(r["seconds"]) for r in result["plain"])
    return [
        "",
        f"#### {title} ({result['rows']:,} rows, {result['keys']:,} keys, {result['partitions']} partitions; the "
        "Confluent wire format, the schema in a local registry)",
        "",
        "| job | seconds (best of runs) | runs (s) | where the time went |",
        "|---|---|---|---|",
        f"| two-phase backlog | {best['seconds']} | {', '.join(str(r['seconds']) for r in result['framework'])} | "
        f"statistics {t.get('watermarks_s', 0)} s, quarantine {t.get('quarantine_s', 0)} s, state "
        f"{t.get('state_s', 0)} s, sink {t.get('sink_s', 0)} s |",
        f"| {plain_name} | {plain['seconds']} | {plain_runs} "
        f"| fetch {plain['fetch_s']} s, decode {plain['decode_s']} s, aggregate and write "
        f"{plain['aggregate_and_write_s']} s |",
        "",
        f"Two-phase ÷ plain (results equal: {result['plain_equal']}): **{result['ratio']}×** (target ≤ {target}×: "
        f"{verdict}).",
    ]
