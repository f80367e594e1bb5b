"""Protobuf values in the Confluent wire format, their schemas in a real schema registry (Apicurio Registry, started on
127.0.0.1 by the pytest kit), as a pipeline's Kafka source. The producers here encode with Protobuf's Python runtime
(and, in one test, Confluent's own Python serializer, which registers its schemas as base64 descriptors), apart from
the engine's decoder in the JVM.

The promise: the Protobuf path gives what the JSON path gives over the same records (results and quarantine), for any
cut-off and split into micro-batches, whatever schema version wrote each record (an older version's record is read
with the newest version's fields, null where it has none); what cannot be decoded is quarantined with its reason; a
version registered while the live phase runs is taken up without a record lost or quarantined."""

from __future__ import annotations

import base64
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases import SchemaRegistry
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSource
from phases._internal.errors import SourceError
from phases._internal.live.runner import LiveRunner
from scripts.protobuf_messages import message_class, wire
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import assert_results_equal, produce, sink_rows, ts
from tests.phases.sources.test_kafka_source import (
    CHUNK,
    DELAY_S,
    KAFKA_ROUNDS,
    PARTITIONS,
    SECOND,
    chunk_versions,
    kafka_quarantine,
    materialize_rounds,
)

V1 = """syntax = "proto3";
package test;
import "google/protobuf/timestamp.proto";

message Event {
  optional string key = 1;
  google.protobuf.Timestamp ts = 2;
  optional int64 value = 3;
}
"""
# Version 2 adds a field (BACKWARD-compatible): records of version 1 read it as null.
V2 = V1.replace("optional int64 value = 3;", "optional int64 value = 3;\n  optional string note = 4;")


def event(cls, row: reference.Row, note: str | None = None):
    key, t, value = row
    message = cls()
    if key is not None:
        message.key = key
    if value is not None:
        message.value = value
    message.ts.FromDatetime(ts(t))  # the tests' event times count from tests.helpers.EPOCH
    if note is not None:
        message.note = note
    return message


def protobuf_pipeline(kafka, registry, topic: str, root: str, **source):
    spec = KafkaSource(
        topic=topic,
        bootstrap_servers=kafka.bootstrap_servers,
        value_format="protobuf",
        registry=SchemaRegistry(url=registry.url),
        backlog_chunk_records=CHUNK,
        **source,
    )
    return make_pipeline(spec, root, delay_s=DELAY_S)


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=KAFKA_ROUNDS, cut=st.integers(min_value=0, max_value=4))
def test_protobuf_values_of_two_versions_equal_the_reference_for_any_cutoff(spark, kafka, registry, tmp_path, raw, cut):
    """Records of both schema versions, any cut-off, a micro-batch a round: the sink and the quarantine equal the
    plain reference over the arrival chunks, as the JSON values of the same records do
    (tests/phases/sources/test_kafka_source.py)."""
    name = uuid.uuid4().hex[:8]
    proto_topic = f"proto-{name}"
    kafka.create_topic(proto_topic, PARTITIONS)
    v1 = registry.register(f"{proto_topic}-value", V1, "PROTOBUF")
    v2 = registry.register(f"{proto_topic}-value", V2, "PROTOBUF")
    event1, event2 = message_class(V1, "test.Event"), message_class(V2, "test.Event")
    root = tmp_path / name
    rounds = materialize_rounds(raw)
    cutoff = min(cut, len(rounds))
    produced: dict[tuple[int, int], reference.Row] = {}

    def produce_round(i: int) -> None:
        # Records alternate between the two schema versions.
        values = [
            (p, wire(v1, event(event1, row)) if j % 2 else wire(v2, event(event2, row, note=f"n{j}")))
            for j, (p, row) in enumerate(rounds[i])
        ]
        positions = produce(kafka.bootstrap_servers, proto_topic, values)
        produced.update({pos: row for pos, (_, row) in zip(positions, rounds[i], strict=True)})

    proto = protobuf_pipeline(kafka, registry, proto_topic, str(root / "proto"))
    for i in range(cutoff):
        produce_round(i)
    BacklogRunner(spark, proto).run()
    LiveRunner.from_manifest(spark, proto).start(available_now=True)
    for i in range(cutoff, len(rounds)):
        produce_round(i)
        LiveRunner.from_manifest(spark, proto).start(available_now=True)  # a micro-batch a round

    live = LiveRunner.from_manifest(spark, proto)
    expected, expected_q = reference.run(chunk_versions(live.arrival_chunks(), produced), DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, proto.sink.path), expected)
    assert kafka_quarantine(spark, str(root / "proto")) == sorted(expected_q, key=repr)


def test_values_that_cannot_be_decoded_are_quarantined_with_their_reason(spark, kafka, registry, tmp_path):
    topic = f"proto-bad-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    v1 = registry.register(f"{topic}-value", V1, "PROTOBUF")
    good = wire(v1, event(message_class(V1, "test.Event"), ("a", 10 * SECOND, 5)))
    bad = [
        good,
        None,  # a tombstone
        b"\x01" + good[1:],  # another magic byte
        b"\x00\x00",  # too short for the wire format
        b"\x00" + (987_654).to_bytes(4, "big") + good[5:],  # a schema id the subject does not have
        b"\x00" + v1.to_bytes(4, "big") + b"\x00\xff\xff\xff",  # not Protobuf of its message (a broken varint)
        b"\x00" + v1.to_bytes(4, "big") + b"\x02\x06" + good[6:],  # message index [3]: the file has one message
    ]
    produce(kafka.bootstrap_servers, topic, [(0, v) for v in bad])
    pipeline = protobuf_pipeline(kafka, registry, topic, str(tmp_path))
    BacklogRunner(spark, pipeline).run()

    expected, _ = reference.run({0: [("a", 10 * SECOND, 5)]}, DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, pipeline.sink.path), expected)
    rows = spark.read.format("delta").load(f"{tmp_path}/quarantine").orderBy("kafka_offset").collect()
    assert [r["reason"] for r in rows] == [
        "undecodable: null value (a tombstone)",
        "undecodable: not the Confluent wire format (a zero magic byte, then a 4-byte schema id)",
        "undecodable: not the Confluent wire format (a zero magic byte, then a 4-byte schema id)",
        f"undecodable: schema id 987654 is not a version of subject '{topic}-value'",
        f"undecodable: not Protobuf of its schema (id {v1}, message test.Event)",
        f"undecodable: message indexes [3] name no message of schema id {v1}",
    ]
    assert [r["kafka_offset"] for r in rows] == [1, 2, 3, 4, 5, 6]  # each with its position
    assert base64.b64decode(rows[1]["record"]) == bad[2]  # the value itself, in base64


RICH = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

enum Kind { KIND_UNSPECIFIED = 0; VIEW = 1; BUY = 2; }

message Order {
  message Item { string sku = 1; uint32 count = 2; }
  string key = 1;
  google.protobuf.Timestamp ts = 2;
  int64 value = 3;
  Kind kind = 4;
  repeated Item items = 5;
  map<string, double> prices = 6;
  google.protobuf.StringValue coupon = 7;
  uint64 big = 8;
  bytes blob = 9;
  Item first = 10;
}
"""


def test_a_confluent_serializers_records_of_nested_messages_keys_and_well_known_types_read_as_spark_columns(
    spark, kafka, registry, tmp_path
):
    """Confluent's Python serializer (base64 descriptors registered, the well-known types as references), a
    nested message, an enum, a repeated message, a map, a wrapper, an unsigned 64-bit integer, bytes; the key in
    Protobuf too (key_format)."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"proto-rich-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    order = message_class(RICH, "shop.Order", "shop/order.proto")
    key_cls = message_class(
        'syntax = "proto3";\npackage shop;\nmessage OrderKey { string key = 1; }\n', "shop.OrderKey"
    )
    client = SchemaRegistryClient({"url": registry.url})
    values = ProtobufSerializer(order, client, {"use.deprecated.format": False})
    keys = ProtobufSerializer(key_cls, client, {"use.deprecated.format": False})
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    t0 = 1_700_000_000
    for i in range(3):
        o = order(key=f"k{i % 2}", value=10 + i, kind=1 + i % 2, big=2**64 - 1 - i, blob=bytes([i]))
        o.ts.seconds = t0 + i
        o.items.add(sku=f"s{i}", count=2**32 - 1)
        o.prices["eur"] = 1.5 * i
        if i:
            o.coupon.value = f"c{i}"
        o.first.sku = "top"
        context = SerializationContext(topic, MessageField.VALUE)
        key = keys(key_cls(key=o.key), SerializationContext(topic, MessageField.KEY))
        producer.produce(topic, key=key, value=values(o, context), partition=0)
    producer.flush(30)

    spec = KafkaSource(
        topic=topic,
        bootstrap_servers=kafka.bootstrap_servers,
        value_format="protobuf",
        key_format="protobuf",
        registry=SchemaRegistry(url=registry.url),
    )
    from phases._internal.sources.kafka import KafkaTopicSource

    reader = KafkaTopicSource(spark, spec, kafka.bootstrap_servers)
    schema = reader.schema()
    assert schema.simpleString() == (
        "struct<key:string,ts:timestamp,value:bigint,kind:string,items:array<struct<sku:string,count:bigint>>,"
        "prices:map<string,double>,coupon:string,big:decimal(20,0),blob:binary,"
        "first:struct<sku:string,count:bigint>>"
    )
    rows = sorted(reader.read_backlog(reader.plan().last).collect(), key=lambda r: r["value"])
    assert [r["_decode_error"] for r in rows] == [None, None, None]
    first = rows[0].asDict(recursive=True)
    assert first["key"] == "k0" and first["value"] == 10 and first["kind"] == "VIEW"
    assert first["ts"].astimezone(UTC) == datetime.fromtimestamp(t0, UTC)
    assert first["items"] == [{"sku": "s0", "count": 2**32 - 1}] and first["prices"] == {"eur": 0.0}
    assert first["coupon"] is None and rows[1]["coupon"] == "c1"  # an absent wrapper is null
    assert first["big"] == Decimal(2**64 - 1) and first["blob"] == bytearray(b"\x00")
    assert first["first"] == {"sku": "top", "count": 0}  # a proto3 scalar without presence reads as its default


def test_a_version_registered_while_live_is_taken_up_and_every_record_counted(spark, kafka, registry, tmp_path):
    topic = f"proto-evolve-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    v1 = registry.register(f"{topic}-value", V1, "PROTOBUF")
    event1, event2 = message_class(V1, "test.Event"), message_class(V2, "test.Event")
    first = [("a", 10 * SECOND, 1), ("b", 11 * SECOND, 2)]
    produce(kafka.bootstrap_servers, topic, [(0, wire(v1, event(event1, r))) for r in first])
    pipeline = protobuf_pipeline(kafka, registry, topic, str(tmp_path))
    BacklogRunner(spark, pipeline).run()
    live = LiveRunner.from_manifest(spark, pipeline)
    live.start()
    try:
        assert "note" not in live.source.schema().fieldNames()
        v2 = registry.register(f"{topic}-value", V2, "PROTOBUF")  # while the query runs
        later = [("a", 20 * SECOND, 3), ("c", 21 * SECOND, 4)]
        produce(kafka.bootstrap_servers, topic, [(0, wire(v2, event(event2, r, note="new"))) for r in later])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            live.raise_if_failed()  # a stop for the new version is resumed here
            if sum(r["n"] for r in spark.read.format("delta").load(pipeline.sink.path).collect()) == 4:
                break
            time.sleep(0.5)
        assert "note" in live.source.schema().fieldNames()
    finally:
        live.stop()
    assert_results_equal(sink_rows(spark, pipeline.sink.path), reference.run({0: first, 1: later}, DELAY_S * SECOND)[0])
    from phases._internal.storage import table_stats

    assert not table_stats.rows(f"{tmp_path}/quarantine")  # nothing was taken for an unknown schema id


def test_a_schema_that_does_not_compile_or_an_avro_subject_is_refused_naming_the_version(
    spark, kafka, registry, tmp_path
):
    topic = f"proto-broken-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    registry.register(
        f"{topic}-value", 'syntax = "proto3";\nmessage Event { string key = 1; Unknown u = 2; }\n', "PROTOBUF"
    )
    with pytest.raises(SourceError, match=r"version 1 of subject '.*-value' \(schema id \d+\) is not a Protobuf schema "
                       r"protoc compiles: .*Unknown"):  # fmt: skip
        BacklogRunner(spark, protobuf_pipeline(kafka, registry, topic, str(tmp_path / "broken"))).run()
    other = f"proto-avro-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(other, 1)
    from tests.phases.sources.test_kafka_avro import V1 as AVRO_V1

    registry.register(f"{other}-value", AVRO_V1)
    with pytest.raises(SourceError, match=r"holds a schema of type AVRO, and source.value_format is 'protobuf'"):
        BacklogRunner(spark, protobuf_pipeline(kafka, registry, other, str(tmp_path / "avro"))).run()
