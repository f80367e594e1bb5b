"""A secret planted in every credential setting of a Kafka source and a topic sink is never written: not in a file
or a table a backlog, a live phase and a redeploy write (the engine's Delta tables, checkpoints, manifests, the
redeploy log, the data root's every byte), nor in Dagster's event log (every event of every run, its metadata and
messages), nor in what the run printed or logged. The broker takes plain connections and the registry no
authentication, so the settings reach the clients (the sink's records are Protobuf, its schemas registered with the
registry's basic-auth setting sent) and are left unused by them; the clients get their values, as the definition
tests show."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import dagster as dg

from phases._internal.definition import KafkaSink, KafkaSource, SchemaRegistry
from phases._internal.handoff import manifest
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import CheckPolicy, Names, Orchestration
from tests.conftest import make_pipeline
from tests.helpers import produce
from tests.phases.sources.test_kafka_source import VALUE_SCHEMA
from tests.phases_dagster.test_redeploy_job import _run_config

S = 1_000_000
MARK = "planted-" + uuid.uuid4().hex[:10]
SOURCE_OPTIONS = {
    "kafka.sasl.jaas.config": f'org.apache.kafka.common.security.plain.PlainLoginModule required password="{MARK}-1";',
    "kafka.ssl.key.password": f"{MARK}-2",
}
SOURCE_CLIENT = {"sasl.password": f"{MARK}-3"}
SINK_CLIENT = {"sasl.password": f"{MARK}-4", "ssl.key.password": f"{MARK}-5"}
REGISTRY_CLIENT = {"basic.auth.user.info": f"team:{MARK}-6"}
SETTINGS = Orchestration(checks=CheckPolicy(max_quarantine_fraction=0.5))


def _pipeline(kafka, registry, topic: str, results: str, delay_s: int):
    source = KafkaSource(
        topic=topic,
        bootstrap_servers=kafka.bootstrap_servers,
        value_schema=VALUE_SCHEMA,
        options=SOURCE_OPTIONS,
        client_options=SOURCE_CLIENT,
    )
    sink = KafkaSink(
        topic=results,
        bootstrap_servers=kafka.bootstrap_servers,
        path="results",
        client_options=SINK_CLIENT,
        value_format="protobuf",
        registry=SchemaRegistry(url=registry.url, client_options=REGISTRY_CLIENT),
    )
    return make_pipeline(source, "engine", delay_s=delay_s, sink=sink)


def _files_holding(root: Path) -> list[str]:
    return sorted(str(f.relative_to(root)) for f in root.rglob("*") if f.is_file() and MARK.encode() in f.read_bytes())


def _tables_holding(spark, root: Path) -> list[str]:
    """Delta tables under ``root`` any of whose rows, as JSON, holds the mark (Parquet pages may be compressed)."""
    found = []
    for log in root.rglob("_delta_log"):
        rows = spark.read.format("delta").load(str(log.parent)).toJSON().collect()
        if any(MARK in row for row in rows):
            found.append(str(log.parent.relative_to(root)))
    return found


def test_a_planted_secret_is_in_no_file_table_event_or_log_through_backlog_live_and_redeploy(
    spark, kafka, registry, tmp_path, capfd, caplog
):
    from tests.phases_dagster.conftest import definitions

    caplog.set_level(logging.INFO)  # (py4j at DEBUG traces every call into the JVM, arguments and all)
    root, topic, results = tmp_path / "data", f"events-{uuid.uuid4().hex[:8]}", f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    kafka.create_topic(results, 2, **{"cleanup.policy": "compact"})
    produce(kafka.bootstrap_servers, topic, [(i % 2, (f"k{i % 3}", (10 + i) * S, i)) for i in range(12)])
    old, new = _pipeline(kafka, registry, topic, results, 15), _pipeline(kafka, registry, topic, results, 40)
    assert MARK not in repr(old) and MARK not in str(new)
    names, storage = Names(old), StorageResource(root=str(root))
    runs = []
    with dg.instance_for_test() as instance:
        backlog = definitions(spark, str(root), old, SETTINGS).resolve_job_def(names.backlog_job)
        result = backlog.execute_in_process(instance=instance)
        assert result.success
        runs.append(result.run_id)
        handoff = manifest.latest(spark, storage.placement(old).manifests, old.name)
        produce(kafka.bootstrap_servers, topic, [(i % 2, (f"k{i % 3}", (40 + i) * S, i)) for i in range(6)])
        live = definitions(spark, str(root), old, SETTINGS).resolve_job_def(names.live_job)
        config = {"manifest_id": handoff.manifest_id, "report_interval_seconds": 1.0, "max_runtime_seconds": 3.0}
        result = live.execute_in_process(instance=instance, run_config={"ops": {names.live_asset: {"config": config}}})
        assert result.success
        runs.append(result.run_id)
        redeploy = definitions(spark, str(root), new, SETTINGS).resolve_job_def(names.redeploy_job)
        result = redeploy.execute_in_process(instance=instance, run_config=_run_config(names, "a longer delay"))
        assert result.success
        runs.append(result.run_id)
        assert storage.placement(new).generation == 1

        events = [str(record) for run in runs for record in instance.all_logs(run)]
        assert events and not [e for e in events if MARK in e], [e[:300] for e in events if MARK in e][:3]
        for run in runs:
            stored = instance.get_run_by_id(run)
            assert stored is not None and MARK not in str(stored.run_config) + str(stored.tags)
    printed = capfd.readouterr()
    assert MARK not in printed.out + printed.err
    assert not [r for r in caplog.records if MARK in r.getMessage()]
    assert _files_holding(root) == []
    assert _tables_holding(spark, root) == []
    # The results reached the topic as Protobuf through all three runs (the registry was used, not just named).
    from phases._internal.topics.sink import read_topic

    assert read_topic(spark, storage.placement(new)).count() == 3
