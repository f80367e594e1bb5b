"""The object-store tier: every table on ``s3a://`` (source, state, manifests, quarantine, checkpoints, leases,
live progress, sink), through Hadoop's S3A connector with Delta's single-driver S3 log store, and the switch
sensor's log reads through delta-rs; an S3 API emulator (moto, server mode) on 127.0.0.1 stands in for S3.
The keyed and process-function pipelines' backlog → switch → live flow equals the reference."""

from __future__ import annotations

import time
import uuid

import pytest

from phases._internal.coordination import leases, progress_log
from phases._internal.handoff import manifest
from phases._internal.storage import table_stats, tables
from phases_dagster.resources.spark import SparkResource
from tests.deployment import flows
from tests.deployment.local_s3 import LocalS3


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    store = LocalS3(tmp_path_factory.mktemp("s3") / "moto.log").start()
    yield store
    store.stop()


@pytest.fixture
def bucket(spark, s3, monkeypatch) -> str:
    name = f"lake-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(name)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3.spark_conf(name).items():
        conf.set(key, value)
    for key, value in s3.environment().items():
        monkeypatch.setenv(key, value)
    return name


def test_keyed_and_process_pipelines_run_end_to_end_on_s3a_tables(spark, bucket):
    resource = SparkResource(shuffle_partitions=2, stop_after_run=False)
    seconds = {}
    for name, flow in (("keyed", flows.keyed), ("process", flows.process)):
        root = f"s3a://{bucket}/{name}"
        t = time.perf_counter()
        flow(resource, root)
        seconds[name] = round(time.perf_counter() - t, 1)
        # The engine's tables are where the root says, and both readers see them: Spark (S3A) and delta-rs.
        for table in ("engine/state", "engine/manifests", "engine/sink", "src"):
            path = f"{root}/{table}"
            if table == "engine/state":
                continue  # one table per handoff under it
            assert tables.exists(spark, path), path
            assert table_stats.head_version(path) == tables.version(spark, path), path
        # The live run's progress log, as the health checks read it (no Spark): it applied the last version.
        handoff = manifest.latest(spark, f"{root}/engine/manifests", flows.NAMES[name])
        batch_id, record = progress_log.latest_without_spark(f"{root}/engine/live/{handoff.manifest_id}")
        assert int(record["complete_below"]) == handoff.source_version + 2, record
    print(f"object-store tier: flows {seconds}")


def test_a_lease_heartbeat_on_s3_moves_the_objects_time_and_keeps_its_body(spark, bucket):
    """S3A's setTimes does nothing: without a rewrite a live holder's lease would look dead after
    ``stale_after_s`` on another host, and ``take_over_dead_lease`` would take it over."""
    store, path = leases._HadoopStore(spark), f"s3a://{bucket}/leases/p.live.json"
    assert store.create(path, '{"holder": "a"}') and not store.create(path, '{"holder": "b"}')
    body, first = store.read(path)
    time.sleep(1.2)  # S3 keeps object times to the second
    store.touch(path)
    again, second = store.read(path)
    assert again == body == '{"holder": "a"}' and second > first
