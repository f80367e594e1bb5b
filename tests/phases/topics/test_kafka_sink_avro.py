"""A topic sink writing Avro in the Confluent wire format, its schemas registered in a real schema registry (Apicurio
Registry on 127.0.0.1): a consumer that decodes each record by the schema id it names (here fastavro, independent of
Spark) folds the topic to the serving definition's results through a backlog, live runs, a redeploy and a rollback;
a redeploy whose results the subject's compatibility rule refuses is refused before anything is swapped."""

from __future__ import annotations

import io
import json
import struct
import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from phases import Aggregation, Filter, KafkaSink, KeyedAggregate, Redeploy, SchemaRegistry, read_topic
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.errors import PhaseStateError
from phases._internal.live.runner import LiveRunner
from phases._internal.topics.reading import fold_upsert, read_committed
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, write_source
from tests.phases.redeploy.test_redeploy import OLD_DELAY_S, _expected_old, _old, _version


def _sink(kafka, registry, topic: str, root: str) -> KafkaSink:
    return KafkaSink(
        topic=topic,
        bootstrap_servers=kafka.bootstrap_servers,
        path=f"{root}/results",
        value_format="avro",
        registry=SchemaRegistry(url=registry.url),
    )


class AvroConsumer:
    """Decodes wire-format records as a consumer would: the schema by its id from the registry (Confluent's own
    client), then fastavro."""

    def __init__(self, url: str):
        self.client, self.schemas = SchemaRegistryClient({"url": url}), {}

    def schema(self, schema_id: int):
        import fastavro

        if schema_id not in self.schemas:
            self.schemas[schema_id] = fastavro.parse_schema(json.loads(self.client.get_schema(schema_id).schema_str))
        return self.schemas[schema_id]

    def decode(self, data: bytes) -> dict:
        import fastavro

        assert data[0] == 0, "not the wire format's magic byte"
        (schema_id,) = struct.unpack(">I", data[1:5])
        return fastavro.schemaless_reader(io.BytesIO(data[5:]), self.schema(schema_id))

    def folded(self, servers: str, topic: str) -> dict[str, dict]:
        out = {}
        for key, value in fold_upsert(read_committed(servers, topic)).items():
            row, key_row = self.decode(value), self.decode(key)
            assert key_row == {"key": row["key"]}
            out[row.pop("key")] = row
        return out


def _versions_of(url: str, subject: str) -> list[int]:
    """The subject's version numbers, read with Confluent's client (which, as any client must, tries a dropped
    connection again)."""
    return SchemaRegistryClient({"url": url}).get_versions(subject)


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
    # The same columns without key d: its results stay BACKWARD-compatible with the old ones.
    new = _old(source, root, sink=sink, steps=[Filter(condition="key != 'd'")])
    consumer = AvroConsumer(registry.url)

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
    # Its column 'total' becomes a string (the greatest key): BACKWARD refuses it (a reader of the new schema cannot
    # read the old records' long). Added columns would be taken: the engine's results may be null, so each new field
    # is a union with null and a null default.
    changed = [Aggregation(name="n", kind="count"), Aggregation(name="total", kind="max", column="key")]
    new = make_pipeline(source, root, delay_s=OLD_DELAY_S, operator=KeyedAggregate(aggregations=changed), sink=sink)
    BacklogRunner(spark, old).run()
    consumer = AvroConsumer(registry.url)
    before = consumer.folded(kafka.bootstrap_servers, topic)

    with pytest.raises(PhaseStateError, match=r"not swapped in.*subject '.*-value' would refuse .* BACKWARD"):
        Redeploy(spark, new).run(reason="more columns")
    assert consumer.folded(kafka.bootstrap_servers, topic) == before  # nothing published
    assert _versions_of(registry.url, f"{topic}-value") == [1]  # nothing registered
    assert Redeploy(spark, old).plan().way == "none"  # the old definition still serves


def test_a_sink_registry_that_does_not_answer_is_refused_before_the_backlog_writes_anything(spark, kafka, tmp_path):
    from datetime import timedelta

    from phases import SinkError
    from phases._internal.storage import tables
    from phases.local import free_port

    source, root = str(tmp_path / "source"), str(tmp_path / "run")
    write_source(spark, source, {1: _version(1)})
    topic = f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    dead = SchemaRegistry(url=f"http://127.0.0.1:{free_port()}", connect_timeout=timedelta(seconds=2))
    sink = KafkaSink(
        topic=topic, bootstrap_servers=kafka.bootstrap_servers, path=f"{root}/results", value_format="avro",
        registry=dead,
    )  # fmt: skip
    with pytest.raises(SinkError, match=r"sink.registry \(http://127.0.0.1:\d+\) did not answer within 2 s"):
        BacklogRunner(spark, _old(source, root, sink=sink)).run()
    assert not tables.exists(spark, f"{root}/results")  # nothing written
