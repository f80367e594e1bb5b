"""The backlog from a topic of Protobuf values (the Confluent wire format, the .proto schema in a schema registry)
beside what a Spark 4.2 user writes instead: Spark's own ``from_protobuf`` (spark-protobuf) is not published on Maven
Central for 4.2, so a plain Spark batch job over the same topic decodes with Protobuf's Python runtime in
``mapInPandas``.

The rows (:func:`phases._internal.sources.synthetic.event_batch`, ``versions`` batches) go to a 3-partition topic on a
local KRaft broker, encoded in Python (``mapInPandas`` with Protobuf's runtime, behind the magic byte, the id the
local registry gave the schema and the message index 0): the engine's own encoder is not used to write them. The
framework's backlog (the keyed reduce of :func:`benchmarks.variants.pipeline`, its source a ``KafkaSource`` with
``value_format="protobuf"``) and the plain job run ``runs`` times each, alternating; the plain job is checked equal to
the framework's sink plus what the framework quarantined as late before its time counts. Reported: the framework's
seconds over the plain job's (best runs; :data:`TARGET`), and the plain job's fetch and decode shares.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from benchmarks import kafka_backlog, variants
from benchmarks.kafka_backlog import PARTITIONS
from phases import SchemaRegistry
from phases._internal.definition import KafkaSource
from phases._internal.runtime.local_kafka import LocalKafka
from phases._internal.runtime.local_registry import LocalRegistry
from phases._internal.sources import synthetic

TOPIC = kafka_backlog.TOPIC  # on a broker of its own
TARGET = 1.15  # the framework's backlog seconds ÷ the plain job's
PROTO = """syntax = "proto3";
package bench;
import "google/protobuf/timestamp.proto";

message Event {
  string key = 1;
  google.protobuf.Timestamp ts = 2;
  int64 value = 3;
}
"""
DECODED = T.StructType(
    [
        T.StructField("key", T.StringType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("value", T.LongType()),
    ]
)


def _event_class():
    """The message class of :data:`PROTO` (compiled by protoc into a pool of its own; on each Python worker)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    from phases._internal.errors import PhasesError
    from phases._internal.runtime.protobuf_schemas import compile_text

    files = descriptor_pb2.FileDescriptorSet.FromString(
        compile_text(PROTO, "event.proto", "the benchmark", PhasesError)
    )
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Event"))


def _encode(header: bytes):
    def encode(batches):
        import pandas as pd

        event = _event_class()
        for frame in batches:
            values = []
            for key, ts, value in zip(frame["key"], frame["ts"], frame["value"], strict=True):
                message = event(key=key, value=int(value))
                micros = int(ts.value // 1000)  # pandas Timestamp: nanoseconds
                message.ts.seconds, message.ts.nanos = micros // 1_000_000, (micros % 1_000_000) * 1000
                values.append(header + message.SerializeToString())
            yield pd.DataFrame({"key": frame["key"], "value": values})

    return encode


def _decode(batches):
    import pandas as pd

    event = _event_class()
    for frame in batches:
        keys, times, values = [], [], []
        for data in frame["value"]:
            message = event.FromString(bytes(data)[6:])  # after the magic byte, the id and the message index 0
            keys.append(message.key)
            times.append(pd.Timestamp(message.ts.seconds * 1_000_000_000 + message.ts.nanos, tz="UTC"))
            values.append(message.value)
        yield pd.DataFrame({"key": keys, "ts": times, "value": values})


def _decoded(df):
    return df.select("value").mapInPandas(_decode, DECODED)


def measure(spark: SparkSession, work: Path, rows: int, keys: int, versions: int = 10, runs: int = 3) -> dict:
    base = work / "kafka_protobuf"
    shutil.rmtree(base, ignore_errors=True)
    broker = LocalKafka(base / "kafka", heap="512m").start()
    registry = LocalRegistry(base / "registry").start()
    try:
        broker.create_topic(TOPIC, PARTITIONS)
        schema_id = registry.register(f"{TOPIC}-value", PROTO, "PROTOBUF")
        header = b"\x00" + schema_id.to_bytes(4, "big") + b"\x00"
        encoded = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])
        t = time.perf_counter()
        for i in range(versions):
            batch = synthetic.event_batch(spark, rows=rows // versions, keys=keys, batch_index=i)
            (
                batch.select("key", "ts", "value")
                .mapInPandas(_encode(header), encoded)
                .write.format("kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                .option("topic", TOPIC)
                .save()
            )
        generate_s = time.perf_counter() - t
        spec = KafkaSource(
            topic=TOPIC,
            bootstrap_servers=broker.bootstrap_servers,
            value_format="protobuf",
            registry=SchemaRegistry(url=registry.url),
        )
        pipeline = variants.pipeline(str(base / "unused"), str(base / "run")).model_copy(update={"source": spec})
        out: dict = {"rows": rows, "keys": keys, "partitions": PARTITIONS, "generate_s": round(generate_s, 1)}
        plain_out = str(base / "plain_run" / "sink")
        runs_out = kafka_backlog.registered_format_runs(
            spark, pipeline, broker.bootstrap_servers, plain_out, _decoded, runs, "kafka protobuf", TARGET
        )
        return {**out, **runs_out}
    finally:
        registry.stop()
        broker.stop()


def lines(result: dict) -> list[str]:
    return kafka_backlog.registered_format_lines(
        result,
        "backlog from a topic of Protobuf values",
        "plain Spark job decoding in mapInPandas (Protobuf's Python runtime)",
        TARGET,
    )
