"""A whole cycle through Dagster of the most common streaming join: a Kafka topic of events joined to a Delta table
of dimensions (an interval join). The backlog job hands off; both inputs grow; the switch sensor asks for a
catch-up increment (the join's live step over the new offsets and versions), then switches; the live job applies
appends on both inputs, stops, and a second live run resumes from its checkpoint after more appends on both.
Every pair and every quarantined record is checked against the plain reference over the recorded arrival chunks
(the topic) and versions (the table)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import dagster as dg

from phases._internal.definition import DeltaSource, IntervalJoin, KafkaSource
from phases._internal.handoff import manifest
from phases._internal.live.runner import LiveRunner
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import CheckPolicy, Names, Orchestration, SwitchPolicy
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, produce, write_source
from tests.phases.operators.test_two_input import _pairs
from tests.phases.sources.test_kafka_source import VALUE_SCHEMA, chunk_versions, kafka_quarantine
from tests.phases_dagster.conftest import definitions

S = 1_000_000
DELAY_S = 15
LOWER_S, UPPER_S = -5, 10


def test_a_topic_of_events_joined_to_a_table_through_backlog_increment_switch_live_and_restart(spark, kafka, tmp_path):
    root = str(tmp_path)
    topic = f"events-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    produced: dict[tuple[int, int], tuple] = {}

    def events(rows: list[tuple]) -> None:
        records = [(i % 2, row) for i, row in enumerate(rows)]
        positions = produce(kafka.bootstrap_servers, topic, records)
        produced.update({pos: row for pos, (_, row) in zip(positions, records, strict=True)})

    dimensions = {1: [("a", 12 * S, 100), ("b", 30 * S, 200), ("c", 2 * S, 300)]}
    write_source(spark, f"{root}/dimensions", dimensions)
    events([("a", 10 * S, 1), ("b", 25 * S, 2), ("a", 40 * S, 3), ("c", 5 * S, 4)])
    p = make_pipeline(
        KafkaSource(topic=topic, bootstrap_servers=kafka.bootstrap_servers, value_schema=VALUE_SCHEMA),
        "engine",
        delay_s=DELAY_S,
        operator=IntervalJoin(
            right=DeltaSource(path="dimensions"), lower=timedelta(seconds=LOWER_S), upper=timedelta(seconds=UPPER_S)
        ),
    )
    settings = Orchestration(
        checks=CheckPolicy(max_quarantine_fraction=0.5), switch=SwitchPolicy(lag_threshold=timedelta(0))
    )
    names, defs = Names(p), definitions(spark, root, p, settings)
    resolved = StorageResource(root=root).placement(p)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(names.backlog_job).execute_in_process(instance=instance)
        assert result.success and all(e.passed for e in result.get_asset_check_evaluations())
        first = manifest.latest(spark, resolved.manifests, p.name)
        assert first.right_source_version == 1

        # Both inputs grow: the sensor catches the backlog up by an increment before it switches.
        events([("a", 50 * S, 5), ("b", 33 * S, 6), ("a", 1 * S, 7)])  # the last one is late
        dimensions[2] = [("a", 45 * S, 110), ("d", 60 * S, 400)]
        append_version(spark, f"{root}/dimensions", dimensions[2])
        sensor = defs.resolve_sensor_def(names.switch)
        context = dg.build_sensor_context(instance=instance, resources={"storage": StorageResource(root=root)})
        [catch_up] = sensor.evaluate_tick(context).run_requests
        assert catch_up.run_key == f"catch-up:{first.manifest_id}"
        reason = catch_up.tags["phases/switch_reason"]
        assert reason.startswith(
            "catch-up increment by the interval_join operator's live step from the handoff's state, of the source's 3 "
            "records after the handoff's end offsets and right source versions 2..2"
        ), reason
        backlog = defs.resolve_job_def(names.backlog_job)
        assert backlog.execute_in_process(instance=instance, run_config=catch_up.run_config).success
        increment = manifest.latest(spark, resolved.manifests, p.name)
        assert (increment.kind, increment.base_manifest_id, increment.right_source_version) == (
            "increment",
            first.manifest_id,
            2,
        )
        [switch] = sensor.evaluate_tick(context).run_requests
        assert switch.run_key == f"live:{increment.manifest_id}"

        # Live: appends on both inputs, then a second run (a restart from the checkpoint) after more on both.
        live = defs.resolve_job_def(names.live_job)
        config = {"manifest_id": increment.manifest_id, "report_interval_seconds": 1.0, "max_runtime_seconds": 3.0}
        run_config = {"ops": {names.live_asset: {"config": config}}}
        events([("d", 62 * S, 8), ("b", 80 * S, 9)])
        dimensions[3] = [("b", 78 * S, 210)]
        append_version(spark, f"{root}/dimensions", dimensions[3])
        assert live.execute_in_process(instance=instance, run_config=run_config).success
        events([("b", 85 * S, 10), ("c", 20 * S, 11)])  # the second one is late
        dimensions[4] = [("b", 90 * S, 220), ("a", 2 * S, 120)]  # the second one is late on the right
        append_version(spark, f"{root}/dimensions", dimensions[4])
        assert live.execute_in_process(instance=instance, run_config=run_config).success

    runner = LiveRunner.at(spark, resolved)
    assert runner.incremental.latest_progress().right_complete_below == 5
    chunks = runner.arrival_chunks()
    versions = chunk_versions(chunks, produced)
    assert sum(len(rows) for rows in versions.values()) == len(produced)  # every event in exactly one chunk
    expected = reference.run_interval_join(versions, dimensions, DELAY_S * S, LOWER_S * S, UPPER_S * S)
    assert len(expected) >= 6
    assert _pairs(spark, resolved.sink_path) == expected
    quarantined = kafka_quarantine(spark, resolved.engine_root)
    late = {(row, reason.split(":")[0]) for _, row, reason in quarantined}
    assert late == {(("a", 1 * S, 7), "late"), (("c", 20 * S, 11), "late"), (("a", 2 * S, 120), "right input")}
