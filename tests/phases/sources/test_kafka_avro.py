"""Avro values in the Confluent wire format, their schemas in a real schema registry (Apicurio Registry, started on
127.0.0.1 by the pytest kit), as a pipeline's Kafka source.

The promise: the Avro path gives what the JSON path gives over the same records (results and quarantine), for any
cut-off and split into micro-batches, whatever schema version wrote each record (an older version's record is read
with the newest version's fields, defaults filled in); what cannot be decoded is quarantined with its reason; a
version registered while the live phase runs is taken up without a record lost or quarantined."""

from __future__ import annotations

import base64
import io
import struct
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases import SchemaRegistry
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSource
from phases._internal.errors import SourceError
from phases._internal.live.runner import LiveRunner
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

V1 = {
    "type": "record",
    "name": "Event",
    "namespace": "test",
    "fields": [
        {"name": "key", "type": ["null", "string"], "default": None},
        {"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
        {"name": "value", "type": ["null", "long"], "default": None},
    ],
}
# Version 2 adds a field with a default (BACKWARD-compatible): records of version 1 read it as null.
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}


def avro_value(schema: dict, schema_id: int, row: reference.Row, note: str | None = None) -> bytes:
    """``row`` (key, event time µs, value) as the Confluent wire format of ``schema`` with id ``schema_id``."""
    import fastavro

    key, t, value = row
    record = {"key": key, "ts": ts(t), "value": value}
    if any(f["name"] == "note" for f in schema["fields"]):
        record["note"] = note
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">I", schema_id) + out.getvalue()


def avro_pipeline(kafka, registry, topic: str, root: str, **source):
    spec = KafkaSource(
        topic=topic,
        bootstrap_servers=kafka.bootstrap_servers,
        value_format="avro",
        registry=SchemaRegistry(url=registry.url),
        backlog_chunk_records=CHUNK,
        **source,
    )
    return make_pipeline(spec, root, delay_s=DELAY_S)


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=KAFKA_ROUNDS, cut=st.integers(min_value=0, max_value=4))
def test_avro_values_of_two_versions_equal_the_reference_for_any_cutoff(spark, kafka, registry, tmp_path, raw, cut):
    """Records of both schema versions, any cut-off, a micro-batch a round: the sink and the quarantine equal the
    plain reference over the arrival chunks, as the JSON values of the same records do
    (tests/phases/sources/test_kafka_source.py)."""
    name = uuid.uuid4().hex[:8]
    avro_topic = f"avro-{name}"
    kafka.create_topic(avro_topic, PARTITIONS)
    v1 = registry.register(f"{avro_topic}-value", V1)
    v2 = registry.register(f"{avro_topic}-value", V2)
    root = tmp_path / name
    rounds = materialize_rounds(raw)
    cutoff = min(cut, len(rounds))
    produced: dict[tuple[int, int], reference.Row] = {}

    def produce_round(i: int) -> None:
        # Records alternate between the two schema versions.
        values = [
            (p, avro_value(V1, v1, row) if j % 2 else avro_value(V2, v2, row, note=f"n{j}"))
            for j, (p, row) in enumerate(rounds[i])
        ]
        positions = produce(kafka.bootstrap_servers, avro_topic, values)
        produced.update({pos: row for pos, (_, row) in zip(positions, rounds[i], strict=True)})

    avro = avro_pipeline(kafka, registry, avro_topic, str(root / "avro"))
    for i in range(cutoff):
        produce_round(i)
    BacklogRunner(spark, avro).run()
    LiveRunner.from_manifest(spark, avro).start(available_now=True)
    for i in range(cutoff, len(rounds)):
        produce_round(i)
        LiveRunner.from_manifest(spark, avro).start(available_now=True)  # a micro-batch a round

    live = LiveRunner.from_manifest(spark, avro)
    expected, expected_q = reference.run(chunk_versions(live.arrival_chunks(), produced), DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, avro.sink.path), expected)
    assert kafka_quarantine(spark, str(root / "avro")) == sorted(expected_q, key=repr)


def test_values_that_cannot_be_decoded_are_quarantined_with_their_reason(spark, kafka, registry, tmp_path):
    topic = f"avro-bad-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    v1 = registry.register(f"{topic}-value", V1)
    good = avro_value(V1, v1, ("a", 10 * SECOND, 5))
    bad = [
        good,
        None,  # a tombstone
        b"\x01" + good[1:],  # another magic byte
        b"\x00\x00",  # too short for the wire format
        b"\x00" + struct.pack(">I", 987_654) + good[5:],  # a schema id the subject does not have
        b"\x00" + struct.pack(">I", v1) + b"\x02\xff\xff\xff\xff\xff",  # not Avro of its schema
    ]
    produce(kafka.bootstrap_servers, topic, [(0, v) for v in bad])
    pipeline = avro_pipeline(kafka, registry, topic, str(tmp_path))
    BacklogRunner(spark, pipeline).run()

    expected, _ = reference.run({0: [("a", 10 * SECOND, 5)]}, DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, pipeline.sink.path), expected)
    rows = spark.read.format("delta").load(f"{tmp_path}/quarantine").orderBy("kafka_offset").collect()
    reasons = [r["reason"] for r in rows]
    assert reasons == [
        "undecodable: null value (a tombstone)",
        "undecodable: not the Confluent wire format (a zero magic byte, then a 4-byte schema id)",
        "undecodable: not the Confluent wire format (a zero magic byte, then a 4-byte schema id)",
        f"undecodable: schema id 987654 is not a version of subject '{topic}-value'",
        f"undecodable: not Avro of its schema (id {v1})",
    ]
    assert [r["kafka_offset"] for r in rows] == [1, 2, 3, 4, 5]  # each with its position
    assert base64.b64decode(rows[1]["record"]) == bad[2]  # the value itself, in base64


def test_declared_fields_are_read_cast_and_a_field_the_schema_lacks_is_refused(spark, kafka, registry, tmp_path):
    topic = f"avro-declared-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    v1 = registry.register(f"{topic}-value", V1)
    produce(kafka.bootstrap_servers, topic, [(0, avro_value(V1, v1, ("a", 10 * SECOND, 5)))])
    pipeline = avro_pipeline(
        kafka, registry, topic, str(tmp_path / "ok"), value_schema="key string, ts timestamp, value int"
    )
    BacklogRunner(spark, pipeline).run()
    assert [tuple(r) for r in spark.read.format("delta").load(pipeline.sink.path).select("key", "n").collect()] == [
        ("a", 1)
    ]
    wrong = avro_pipeline(
        kafka,
        registry,
        topic,
        str(tmp_path / "wrong"),
        value_schema="key string, ts timestamp, value bigint, score double",
    )
    with pytest.raises(SourceError, match=r"value_schema fields \['score'\] are not in the newest schema of subject"):
        BacklogRunner(spark, wrong).run()


def test_a_subject_without_a_schema_or_a_registry_that_does_not_answer_is_refused_naming_it(spark, kafka, tmp_path):
    topic = f"avro-none-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    from phases.local import free_port

    dead = SchemaRegistry(url=f"http://127.0.0.1:{free_port()}", connect_timeout=2)
    spec = KafkaSource(topic=topic, bootstrap_servers=kafka.bootstrap_servers, value_format="avro", registry=dead)
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"source.registry \(http://127.0.0.1:\d+\) did not answer within 2 s"):
        BacklogRunner(spark, make_pipeline(spec, str(tmp_path / "dead"))).run()
    assert time.monotonic() - started < 30


def test_a_version_registered_while_live_is_taken_up_and_every_record_counted(spark, kafka, registry, tmp_path):
    topic = f"avro-evolve-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    v1 = registry.register(f"{topic}-value", V1)
    first = [("a", 10 * SECOND, 1), ("b", 11 * SECOND, 2)]
    produce(kafka.bootstrap_servers, topic, [(0, avro_value(V1, v1, r)) for r in first])
    pipeline = avro_pipeline(kafka, registry, topic, str(tmp_path))
    BacklogRunner(spark, pipeline).run()
    live = LiveRunner.from_manifest(spark, pipeline)
    live.start()
    try:
        assert "note" not in live.source.schema().fieldNames()
        v2 = registry.register(f"{topic}-value", V2)  # while the query runs
        later = [("a", 20 * SECOND, 3), ("c", 21 * SECOND, 4)]
        produce(kafka.bootstrap_servers, topic, [(0, avro_value(V2, v2, r, note="new")) for r in later])
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


def test_an_archive_handing_over_to_an_avro_topic_counts_every_record_once(spark, kafka, registry, tmp_path):
    """FLIP-327's first example with Avro values: a Delta archive of the topic's first offsets (its JSON-free copy),
    then the topic of Avro values from the handoff offsets; no record in both phases, none in neither."""
    from phases._internal.definition import HybridSource, KafkaHandoff
    from phases._internal.sources import feed as sources
    from tests.phases.sources.test_kafka_source import ARCHIVE_SCHEMA

    topic = f"avro-hybrid-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    v1 = registry.register(f"{topic}-value", V1)
    rows = [(i % 2, (f"k{i % 3}", (100 + i) * SECOND, i)) for i in range(12)]  # offsets 0..5 of each partition
    rows.append((0, ("k0", 50 * SECOND, 999)))  # behind the archive's watermark: quarantined live
    positions = produce(kafka.bootstrap_servers, topic, [(p, avro_value(V1, v1, row)) for p, row in rows])
    by_position = dict(zip(positions, [row for _, row in rows], strict=True))
    archive = str(tmp_path / "archive")
    sources.create_source(spark, archive, ARCHIVE_SCHEMA)
    exported = [(pos, row) for pos, row in sorted(by_position.items()) if pos[1] < 5]  # overlaps the topic at 3..4
    sources.append(spark, archive, [(k, ts(t), v, p, o) for (p, o), (k, t, v) in exported])
    source = HybridSource(
        backlog={"path": archive},
        live=KafkaSource(
            topic=topic,
            bootstrap_servers=kafka.bootstrap_servers,
            value_format="avro",
            registry=SchemaRegistry(url=registry.url),
        ),
        handoff=KafkaHandoff(offsets={0: 3, 1: 3}),
        archive_partition_column="kafka_partition",
        archive_offset_column="kafka_offset",
    )
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    BacklogRunner(spark, p).run()
    live = LiveRunner.from_manifest(spark, p)
    live.start(available_now=True)

    versions = {1: [row for (_, offset), row in exported if offset < 3]}
    versions.update(chunk_versions(live.arrival_chunks(), {pos: r for pos, r in by_position.items() if pos[1] >= 3}))
    assert sum(len(v) for v in versions.values()) == len(by_position)  # every record in exactly one phase
    expected, expected_q = reference.run(versions, DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert kafka_quarantine(spark, str(tmp_path / "run")) == sorted(expected_q, key=repr)
    assert expected_q, "the live record behind the watermark should be quarantined"


KEY_SCHEMA = {"type": "record", "name": "EventKey", "namespace": "test", "fields": [{"name": "user", "type": "string"}]}
VALUE_ONLY = {
    "type": "record",
    "name": "Reading",
    "namespace": "test",
    "fields": [
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "value", "type": ["null", "long"], "default": None},
    ],
}


def _encoded(schema: dict, schema_id: int, record: dict) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">I", schema_id) + out.getvalue()


def test_avro_keys_give_the_key_columns_a_value_lacks_and_an_undecodable_key_is_quarantined(
    spark, kafka, registry, tmp_path
):
    from confluent_kafka import Producer

    topic = f"avro-keys-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    key_id = registry.register(f"{topic}-key", KEY_SCHEMA)
    value_id = registry.register(f"{topic}-value", VALUE_ONLY)
    records = [("u1", 10, 1), ("u2", 11, 2), ("u1", 12, 3)]
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 0})
    for user, second, value in records:
        producer.produce(
            topic,
            key=_encoded(KEY_SCHEMA, key_id, {"user": user}),
            value=_encoded(VALUE_ONLY, value_id, {"ts": ts(second * SECOND), "value": value}),
        )
    producer.produce(topic, key=b"not avro", value=_encoded(VALUE_ONLY, value_id, {"ts": ts(13 * SECOND), "value": 9}))
    producer.flush()
    spec = KafkaSource(
        topic=topic,
        bootstrap_servers=kafka.bootstrap_servers,
        value_format="avro",
        key_format="avro",
        registry=SchemaRegistry(url=registry.url),
    )
    pipeline = make_pipeline(spec, str(tmp_path), delay_s=DELAY_S, key_columns=["user"])
    BacklogRunner(spark, pipeline).run()
    totals = {r["user"]: (r["n"], r["total"]) for r in spark.read.format("delta").load(pipeline.sink.path).collect()}
    assert totals == {"u1": (2, 4), "u2": (1, 2)}
    [bad] = spark.read.format("delta").load(f"{tmp_path}/quarantine").collect()
    assert bad["reason"].startswith("undecodable key: not the Confluent wire format (a zero magic byte")
    assert bad["kafka_offset"] == 3
