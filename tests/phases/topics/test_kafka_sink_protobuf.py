"""A topic sink writing Protobuf in the Confluent wire format, its .proto schemas registered in a real schema registry
(Apicurio Registry on 127.0.0.1): a consumer that decodes each record by the schema id it names (here Protobuf's
Python runtime over the registered .proto compiled by protoc, independent of the engine's JVM encoder) folds the topic
to the serving definition's results through a backlog, live runs, a redeploy and a rollback; a redeploy whose results
the subject's compatibility rule refuses is refused before anything is swapped."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from google.protobuf.json_format import MessageToDict

from phases import Aggregation, Filter, KafkaSink, KeyedAggregate, Redeploy, SchemaRegistry, read_topic
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.errors import PhaseStateError
from phases._internal.live.runner import LiveRunner
from phases._internal.topics.reading import fold_upsert, read_committed
from scripts.protobuf_messages import message_class
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, write_source
from tests.phases.redeploy.test_redeploy import OLD_DELAY_S, _expected_old, _old, _version
from tests.phases.topics.test_kafka_sink_avro import _versions_of


def _sink(kafka, registry, topic: str, root: str) -> KafkaSink:
    return KafkaSink(
        topic=topic,
        bootstrap_servers=kafka.bootstrap_servers,
        path=f"{root}/results",
        value_format="protobuf",
        registry=SchemaRegistry(url=registry.url),
    )


class ProtobufConsumer:
    """Decodes wire-format records as a consumer would: the .proto by its id from the registry, compiled by protoc,
    the message its indexes name parsed by Protobuf's Python runtime."""

    def __init__(self, url: str):
        self.client, self.classes = SchemaRegistryClient({"url": url}), {}

    def message(self, schema_id: int):
        if schema_id not in self.classes:
            schema = self.client.get_schema(schema_id)
            assert schema.schema_type == "PROTOBUF"
            name = next(line.split()[1] for line in schema.schema_str.splitlines() if line.startswith("message "))
            self.classes[schema_id] = message_class(schema.schema_str, f"phases.{name}")
        return self.classes[schema_id]

    def decode(self, data: bytes) -> dict:
        assert data[0] == 0, "not the wire format's magic byte"
        schema_id = int.from_bytes(data[1:5], "big")
        assert data[5] == 0, "the first message of the file: message indexes [0]"
        message = self.message(schema_id).FromString(data[6:])
        # int64 as numbers (JSON mapping writes them as strings); optional fields that are absent are nulls.
        out = MessageToDict(message, preserving_proto_field_name=True)
        fields = message.DESCRIPTOR.fields_by_name
        return {
            name: (int(out[name]) if fields[name].type in (3, 4, 16, 18) else out[name]) if name in out else None
            for name in fields
        }

    def folded(self, servers: str, topic: str) -> dict[str, dict]:
        out = {}
        for key, value in fold_upsert(read_committed(servers, topic)).items():
            row, key_row = self.decode(value), self.decode(key)
            assert key_row == {"key": row["key"]}
            out[row.pop("key")] = row
        return out


def test_a_consumer_decoding_by_schema_id_folds_the_serving_definition_through_a_redeploy_and_a_rollback(
    spark, kafka, registry, tmp_path
):
    source, root = str(tmp_path / "source"), str(tmp_path / "run")
    versions = {i: _version(i) for i in range(1, 6)}
    write_source(spark, source, {v: versions[v] for v in (1, 2)})
    topic = f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 3, **{"cleanup.policy": "compact"})
    sink = _sink(kafka, registry, topic, root)
    old = _old(source, root, sink=sink)
    new = _old(source, root, sink=sink, steps=[Filter(condition="key != 'd'")])  # the same columns
    consumer = ProtobufConsumer(registry.url)

    def expected(upto: int, *, without_d: bool = False) -> dict:
        rows = _expected_old({v: versions[v] for v in range(1, upto + 1)})
        return {k: v for k, v in rows.items() if not (without_d and k == "d")}

    BacklogRunner(spark, old).run()
    assert_results_equal(consumer.folded(kafka.bootstrap_servers, topic), expected(2))
    append_version(spark, source, versions[3])
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    assert_results_equal(consumer.folded(kafka.bootstrap_servers, topic), expected(3))
    assert _versions_of(registry.url, f"{topic}-value") == [1] and _versions_of(registry.url, f"{topic}-key") == [1]

    assert Redeploy(spark, new).run(reason="without d").swapped
    assert_results_equal(consumer.folded(kafka.bootstrap_servers, topic), expected(3, without_d=True))
    append_version(spark, source, versions[4])
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    assert_results_equal(consumer.folded(kafka.bootstrap_servers, topic), expected(4, without_d=True))
    typed = {r["key"]: r.asDict() for r in read_topic(spark, new).collect()}  # the engine's reader, typed
    assert_results_equal(typed, expected(4, without_d=True))

    assert Redeploy(spark, old).run(reason="roll back").swapped
    assert_results_equal(consumer.folded(kafka.bootstrap_servers, topic), expected(4))  # key d back
    append_version(spark, source, versions[5])
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    assert_results_equal(consumer.folded(kafka.bootstrap_servers, topic), expected(5))
    assert _versions_of(registry.url, f"{topic}-value") == [1]  # one schema: every generation's results alike


def test_a_redeploy_whose_results_the_subject_refuses_is_refused_before_the_swap_naming_the_rule(
    spark, kafka, registry, tmp_path
):
    source, root = str(tmp_path / "source"), str(tmp_path / "run")
    write_source(spark, source, {v: _version(v) for v in (1, 2)})
    topic = f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 3, **{"cleanup.policy": "compact"})
    sink = _sink(kafka, registry, topic, root)
    old = _old(source, root, sink=sink)
    # Field 2 ('total' after 'n'... the columns renumbered) changes type: BACKWARD refuses it.
    changed = [Aggregation(name="n", kind="count"), Aggregation(name="total", kind="max", column="key")]
    new = make_pipeline(source, root, delay_s=OLD_DELAY_S, operator=KeyedAggregate(aggregations=changed), sink=sink)
    BacklogRunner(spark, old).run()
    consumer = ProtobufConsumer(registry.url)
    before = consumer.folded(kafka.bootstrap_servers, topic)

    with pytest.raises(PhaseStateError, match=r"not swapped in.*subject '.*-value' would refuse .* BACKWARD"):
        Redeploy(spark, new).run(reason="other columns")
    assert consumer.folded(kafka.bootstrap_servers, topic) == before  # nothing published
    assert _versions_of(registry.url, f"{topic}-value") == [1]  # nothing registered
    assert Redeploy(spark, old).plan().way == "none"  # the old definition still serves


def test_the_result_schema_maps_spark_types_to_protobuf_and_refuses_what_it_cannot_hold():
    from pyspark.sql import types as T

    from phases import SinkError
    from phases._internal.topics.protobuf_records import proto_schema

    struct = T.StructType(
        [
            T.StructField("key", T.StringType(), False),
            T.StructField("n", T.LongType()),
            T.StructField("day", T.DateType()),
            T.StructField("at", T.TimestampType()),
            T.StructField("amount", T.DecimalType(12, 2)),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("by", T.MapType(T.StringType(), T.DoubleType())),
            T.StructField("where", T.StructType([T.StructField("city", T.StringType())])),
        ]
    )
    assert proto_schema(struct, "demo_result") == "\n".join(
        [
            'syntax = "proto3";',
            "package phases;",
            'import "google/protobuf/timestamp.proto";',
            "",
            "message demo_result {",
            "  message where_type {",
            "    optional string city = 1;",
            "  }",
            "  string key = 1;",
            "  optional int64 n = 2;",
            "  optional int32 day = 3;",
            "  optional google.protobuf.Timestamp at = 4;",
            "  optional string amount = 5;",
            "  repeated string tags = 6;",
            "  map<string, double> by = 7;",
            "  optional where_type where = 8;",
            "}",
            "",
        ]
    )
    message_class(proto_schema(struct, "demo_result"), "phases.demo_result")  # protoc compiles it
    with pytest.raises(SinkError, match=r"result column 'a-b' is not a Protobuf field name"):
        proto_schema(T.StructType([T.StructField("a-b", T.LongType())]), "x")
    with pytest.raises(SinkError, match=r"a Protobuf map needs string, integer or boolean keys"):
        proto_schema(T.StructType([T.StructField("m", T.MapType(T.DoubleType(), T.LongType()))]), "x")
