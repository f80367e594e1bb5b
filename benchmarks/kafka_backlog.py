"""The backlog from a Kafka topic beside the backlog from a Delta table, on the same rows.

The rows are written once to a Delta table (``versions`` versions, the change data feed on) and then, read back from
that table, to a 3-partition topic on a local KRaft broker (:mod:`phases._internal.runtime.local_kafka`) as JSON values:
the two sources hold the same records. Each backlog (the keyed reduce of :func:`benchmarks.variants.pipeline`) runs
``runs`` times in one JVM, alternating; the rows per second of each run and the Kafka ÷ Delta ratio of the fastest runs
are reported, with the backlog's own step timings (where the time goes). The target (:data:`TARGET`): the Kafka backlog
at 0.6 of the Delta backlog's rows per second or more. The topic is read with the default arrival chunks and with chunks
of about one version's records per partition.

Arrival order differs by nature: a Delta table's versions, a topic's arrival chunks (``backlog_chunk_records``
offsets per partition), so the late records, hence the quarantine's rows, may differ between the two.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks import variants
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSource
from phases._internal.runtime.local_kafka import LocalKafka
from phases._internal.sources import synthetic

TOPIC = "events"
TARGET = 0.6  # Kafka ÷ Delta rows per second
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
        value_schema = "key string, ts timestamp, value bigint"
        # The default chunk size (what a user runs), and chunks of about one version's records per partition (the
        # rows are keyed across partitions, so these arrivals only approximate the table's versions).
        matched = max(1, rows // versions // PARTITIONS)
        default_chunk = KafkaSource.model_fields["backlog_chunk_records"].default

        def kafka(chunk: int, name: str):
            spec = KafkaSource(
                topic=TOPIC,
                bootstrap_servers=broker.bootstrap_servers,
                value_schema=value_schema,
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
        for run in range(runs):
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
        if version_chunks:
            smaller = best["kafka, version-sized chunks"]["rows_per_s"]
            out["ratio_version_chunks"] = round(smaller / best["delta"]["rows_per_s"], 2)
        out["target_met"] = out["ratio"] >= TARGET
        return out
    finally:
        broker.stop()


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
    verdict = "met" if result["target_met"] else "missed"
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
