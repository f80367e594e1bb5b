"""Where a backlog's time goes, job by job: the keyed reduce of :func:`benchmarks.variants.pipeline` from a Delta table
(beside the plain Spark batch job, alternating) or from a Kafka topic, run ``--runs`` times in one JVM, each run's step
timings printed, and the Spark jobs of the last run listed from the Spark UI's REST API (wall milliseconds, tasks, the
job's description, which names the backlog's step). What the jobs' sum leaves of a run is driver time: planning, Delta
commits, the engine's own reads.

    .venv/bin/python -m benchmarks.backlog_jobs delta --rows 10000000 --runs 4
    .venv/bin/python -m benchmarks.backlog_jobs kafka --runs 4

The data lives under ``.data/backlog_jobs`` (``--work``; made on the first run); nothing in ``benchmarks/results`` is
touched.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks import data, variants
from benchmarks.kafka_backlog import PARTITIONS, TOPIC, VALUE_SCHEMA
from benchmarks.run import ROOT, _generate
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSource
from phases._internal.runtime.local_kafka import LocalKafka
from phases._internal.runtime.session import SparkSettings, build_session
from phases._internal.sources import synthetic


def _jobs(spark: SparkSession) -> list[dict]:
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/jobs"
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - the local Spark UI
        return json.loads(answer.read())


def _time(text: str) -> datetime:
    return datetime.strptime(text.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")


def _timed_run(spark: SparkSession, pipeline, run: int, *, listed: bool) -> None:
    before = {j["jobId"] for j in _jobs(spark)}
    runner = BacklogRunner(spark, pipeline)
    t = time.perf_counter()
    runner.run(reset=True)
    seconds = time.perf_counter() - t
    print(f"backlog run {run}: {seconds:.2f} s", {k: round(v, 2) for k, v in runner.timings.items()}, flush=True)
    if not listed:
        return
    new = sorted((j for j in _jobs(spark) if j["jobId"] not in before), key=lambda j: j["jobId"])
    total = 0.0
    for job in new:
        ms = (_time(job["completionTime"]) - _time(job["submissionTime"])).total_seconds() * 1000
        total += ms
        what = job.get("description", job["name"])
        print(f"  job {job['jobId']:5d} {ms:7.0f} ms  tasks {job['numTasks']:3d}  {what}")
    print(f"  the jobs' wall time {total / 1000:.2f} s of the run's {seconds:.2f} s", flush=True)


def delta(spark: SparkSession, work: Path, rows: int, keys: int, runs: int) -> None:
    source, _ = _generate(spark, work, data.keyed_reduce_batch, rows, keys, 20, "keyed_reduce")
    for run in range(runs):
        plain = variants.plain_batch(spark, source, str(work / "plain"))
        print(f"plain batch run {run}: {plain.seconds:.2f} s", flush=True)
        root = work / "two_phase"
        shutil.rmtree(root, ignore_errors=True)  # a first backlog on a fresh root, as the benchmark's
        _timed_run(spark, variants.pipeline(source, str(root)), run, listed=run == runs - 1)


def kafka(spark: SparkSession, work: Path, rows: int, keys: int, runs: int, versions: int = 10) -> None:
    base = work / "kafka"
    shutil.rmtree(base, ignore_errors=True)
    broker = LocalKafka(base / "broker", heap="512m").start()
    try:
        broker.create_topic(TOPIC, PARTITIONS)
        for i in range(versions):  # the rows of benchmarks/kafka_backlog.py, in the same batches, to the topic only
            batch = synthetic.event_batch(spark, rows=rows // versions, keys=keys, batch_index=i)
            (
                batch.select(F.col("key"), F.to_json(F.struct("key", "ts", "value")).alias("value"))
                .write.format("kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                .option("topic", TOPIC)
                .save()
            )
        spec = KafkaSource(topic=TOPIC, bootstrap_servers=broker.bootstrap_servers, value_schema=VALUE_SCHEMA)
        pipeline = variants.pipeline(str(base / "unused"), str(base / "run")).model_copy(update={"source": spec})
        for run in range(runs):  # reruns over the same root (reset), as the benchmark's
            _timed_run(spark, pipeline, run, listed=run == runs - 1)
    finally:
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", choices=["delta", "kafka"])
    ap.add_argument("--rows", type=int, default=None, help="rows (default: delta 1e7, kafka 1e6)")
    ap.add_argument("--keys", type=int, default=None, help="keys (default: delta 1e6, kafka 1e5)")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--work", default=str(ROOT / ".data" / "backlog_jobs"), help="where the data and the runs live")
    args = ap.parse_args()
    spark = build_session(SparkSettings(shuffle_partitions=8, driver_memory="4g", ui_enabled=True))
    work = Path(args.work)
    if args.source == "delta":
        delta(spark, work, args.rows or 10_000_000, args.keys or 1_000_000, args.runs)
    else:
        kafka(spark, work, args.rows or 1_000_000, args.keys or 100_000, args.runs)


if __name__ == "__main__":
    main()
