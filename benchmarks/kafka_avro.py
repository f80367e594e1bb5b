"""The backlog from a topic of Avro values (the Confluent wire format, the schema in a schema registry) beside what a
Spark user writes instead: a plain Spark batch job over the same topic that decodes with ``from_avro``.

The rows (:func:`phases._internal.sources.synthetic.event_batch`, ``versions`` batches) go to a 3-partition topic on a
local KRaft broker, encoded in Spark (``to_avro`` behind the magic byte and the id the local registry gave the schema):
the engine's own decoding is not used to write them. The framework's backlog (the keyed reduce of
:func:`benchmarks.variants.pipeline`, its source a ``KafkaSource`` with ``value_format="avro"``) and the plain job
(``spark.read.format("kafka")`` with the engine's read options, ``from_avro`` of the bytes after the five-byte header
with the writer's schema, the same aggregation, written to Delta) run ``runs`` times each, alternating; the plain job is
checked equal to the framework's sink plus what the framework quarantined as late before its time counts. Reported:
the framework's seconds over the plain job's (best runs; :data:`TARGET`), and the plain job's fetch and decode shares.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks import kafka_backlog, variants
from benchmarks.kafka_backlog import PARTITIONS
from phases import SchemaRegistry
from phases._internal.definition import KafkaSource
from phases._internal.runtime.local_kafka import LocalKafka
from phases._internal.runtime.local_registry import LocalRegistry
from phases._internal.sources import synthetic

TOPIC = kafka_backlog.TOPIC  # on a broker of its own
TARGET = 1.15  # the framework's backlog seconds ÷ the plain from_avro job's
SCHEMA = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "key", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "value", "type": "long"},
    ],
}


def _decoded(df):
    from pyspark.sql.avro.functions import from_avro

    return df.select(from_avro(F.expr("substring(value, 6)"), json.dumps(SCHEMA)).alias("r")).select("r.*")


def measure(spark: SparkSession, work: Path, rows: int, keys: int, versions: int = 10, runs: int = 3) -> dict:
    from pyspark.sql.avro.functions import to_avro

    base = work / "kafka_avro"
    shutil.rmtree(base, ignore_errors=True)
    broker = LocalKafka(base / "kafka", heap="512m").start()
    registry = LocalRegistry(base / "registry").start()
    try:
        broker.create_topic(TOPIC, PARTITIONS)
        schema_id = registry.register(f"{TOPIC}-value", SCHEMA)
        header = b"\x00" + schema_id.to_bytes(4, "big")
        t = time.perf_counter()
        for i in range(versions):
            batch = synthetic.event_batch(spark, rows=rows // versions, keys=keys, batch_index=i)
            (
                batch.select(
                    "key",
                    F.concat(F.lit(header), to_avro(F.struct("key", "ts", "value"), json.dumps(SCHEMA))).alias("value"),
                )
                .write.format("kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                .option("topic", TOPIC)
                .save()
            )
        generate_s = time.perf_counter() - t
        spec = KafkaSource(
            topic=TOPIC,
            bootstrap_servers=broker.bootstrap_servers,
            value_format="avro",
            registry=SchemaRegistry(url=registry.url),
        )
        pipeline = variants.pipeline(str(base / "unused"), str(base / "run")).model_copy(update={"source": spec})
        out: dict = {"rows": rows, "keys": keys, "partitions": PARTITIONS, "generate_s": round(generate_s, 1)}
        plain_out = str(base / "plain_run" / "sink")
        runs_out = kafka_backlog.registered_format_runs(
            spark, pipeline, broker.bootstrap_servers, plain_out, _decoded, runs, "kafka avro", TARGET
        )
        return {**out, **runs_out}
    finally:
        registry.stop()
        broker.stop()


def lines(result: dict) -> list[str]:
    return kafka_backlog.registered_format_lines(
        result, "backlog from a topic of Avro values", "plain Spark job with from_avro", TARGET
    )
