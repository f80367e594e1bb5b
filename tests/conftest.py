"""One SparkSession per test session, small shuffle partitions; helpers to build pipelines on tmp dirs."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from pyspark.sql import SparkSession

from phases._internal.definition import Aggregation, DeltaSink, DeltaSource, KeyedAggregate, Locations, Pipeline

AGGREGATIONS = [
    Aggregation(name="n", kind="count"),
    Aggregation(name="n_value", kind="count", column="value"),
    Aggregation(name="total", kind="sum", column="value"),
    Aggregation(name="lo", kind="min", column="value"),
    Aggregation(name="hi", kind="max", column="value"),
    Aggregation(name="mean", kind="avg", column="value"),
    Aggregation(name="xor", kind="reduce", column="value", reduce="acc ^ x"),
]


SOAK = os.environ.get("HYPOTHESIS_PROFILE") == "soak"


def examples(n: int) -> int:
    """Hypothesis examples of a property test: ``n`` (bounded by the suite's time budget), ten times as
    many with ``HYPOTHESIS_PROFILE=soak`` (long runs: ``make test ARGS=...`` or ``make soak``)."""
    return 10 * n if SOAK else n


# The test modules of 20 s or more (their tests' time summed from a full run's JUnit report, the mean of two runs on
# 2 cores, 2026-12-07: benchmarks/profiles/suite-2026-12-07-f.txt and the run before it), longest first.
# `make test` runs two pytest processes that take whole modules in collection order (``--dist loadfile
# --no-loadscope-reorder``): sending the longest first keeps both busy to the end instead of leaving one long module
# alone at the tail.
LONGEST_MODULES = (
    "tests/test_end_to_end.py",
    "tests/phases/topics/test_kafka_sink.py",
    "tests/phases/redeploy/test_redeploy.py",
    "tests/phases/chains/test_changes_source.py",
    "tests/phases_dagster/test_chain_in_the_ui.py",
    "tests/phases/operators/test_two_input_kafka.py",
    "tests/phases/topics/test_kafka_sink_damage.py",
    "tests/phases/chains/test_pipeline_source.py",
    "tests/phases/live/test_live_splits.py",
    "tests/phases/redeploy/test_redeploy_damage.py",
    "tests/deployment/test_standalone_cluster.py",
    "tests/phases/live/test_live_recovery.py",
    "tests/phases/operators/test_two_input.py",
    "tests/phases_dagster/test_redeploy_job.py",
    "tests/phases/sources/test_kafka_avro.py",
    "tests/phases/sources/test_kafka_faults.py",
    "tests/phases/state/test_keyed_store.py",
    "tests/phases/backlog/test_increments_and_slices.py",
    "tests/phases/operators/test_process_function.py",
    "tests/phases/sources/test_kafka_protobuf.py",
    "tests/phases/sources/test_kafka_source.py",
    "tests/phases_dagster/test_component.py",
    "tests/phases/live/test_changelog_sink.py",
    "tests/phases_dagster/test_daily_backfill.py",
    "tests/deployment/test_object_store.py",
    "tests/test_readme_guide.py",
    "tests/phases/topics/test_kafka_sasl.py",
    "tests/phases/test_testing_kit.py",
    "tests/phases/topics/test_kafka_sink_avro.py",
    "tests/phases/operators/test_sessions.py",
    "tests/phases_dagster/test_switch_sensor.py",
    "tests/phases/backlog/test_kafka_increments.py",
    "tests/phases_dagster/test_kafka_join_cycle.py",
    "tests/phases/live/test_live_schema.py",
    "tests/phases/live/test_upsert_write.py",
    "tests/phases/backlog/test_step_increments.py",
    "tests/phases/test_two_phase_equivalence.py",
    "tests/phases_dagster/test_secrets_never_written.py",
    "tests/phases/definition/test_event_time_guard.py",
    "tests/phases/topics/test_kafka_sink_protobuf.py",
    "tests/test_types.py",
    "tests/phases/backlog/test_backlog.py",
    "tests/phases/operators/test_windows.py",
    "tests/phases_dagster/test_live_job.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test that needs a JVM (the session's SparkSession, or Spark in a child process) as
    ``spark``; ``make test-fast`` runs the others. Puts the longest modules first (a stable sort: the order within
    a module does not change)."""
    rank = {path: i for i, path in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & {"spark", "phases_spark", "delta_source", "kafka", "phases_kafka"} or item.get_closest_marker(
            "slow"
        ):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(autouse=True, scope="module")
def _forget_tables_between_modules():
    """After each test module: drop the DataFrames it left cached and Delta's cached table logs. One JVM runs
    the whole suite; each module makes its own tables, and a full suite once ran the driver out of heap late
    ("Not enough memory to build and broadcast the table") with everything the earlier modules left behind."""
    yield
    session = SparkSession.getActiveSession()
    if session is not None:
        session.catalog.clearCache()
        session._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


# The suite's own JVM runs thousands of tiny queries, where Spark's code generation of each projection, predicate
# and ordering costs more than it saves (generated, compiled and JIT-compiled anew, then run over a few rows):
# Spark's interpreted versions give the same results (Spark's own suite runs both), and NO_CODEGEN turns whole-stage
# code generation off too; the suite's JVM time fell 10-13 %. Its heap is collected by the throughput collector
# (ParallelGC), not G1: no concurrent marking threads competing with the other pytest process for the two cores,
# and no G1 write barriers; the same modules 4 % faster alone (benchmarks/profiles/suite-settings-2026-12-02.txt).
# The JVMs the tests start (Dagster runs, crashed children, the cluster tier) and the product keep Spark's and the
# JVM's defaults. PHASES_TEST_CONF="spark.sql.codegen.factoryMode=FALLBACK" puts code generation back.
TEST_JVM_CONF = {"spark.sql.codegen.factoryMode": "NO_CODEGEN", "spark.driver.extraJavaOptions": "-XX:+UseParallelGC"}


@pytest.fixture(scope="session")
def phases_spark():
    """The kit's session (:mod:`phases.pytest_plugin`) with a 3 GiB driver: the project's suite runs ~150 tests in one
    JVM (a user's suite keeps the kit's 2 GiB). With the S3A connector, for the object-store tier.
    ``PHASES_TEST_CONF="key=value,key=value"`` adds Spark settings to it, to measure what a setting does to the suite's
    time (how the last ones were measured: benchmarks/profiles/suite-settings-2026-12-02.txt)."""
    from phases._internal.runtime.session import SparkSettings, build_session

    conf = {**TEST_JVM_CONF, **dict(x.split("=", 1) for x in os.environ.get("PHASES_TEST_CONF", "").split(",") if x)}
    session = build_session(
        SparkSettings(shuffle_partitions=2, app_name="phases-tests", driver_memory="3g", s3a=True, extra_conf=conf)
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark(phases_spark: SparkSession) -> SparkSession:
    """The test session's SparkSession (the kit's ``phases_spark``, with more driver memory)."""
    return phases_spark


@pytest.fixture(scope="session")
def kafka(phases_kafka):
    """The pytest kit's Kafka broker (:mod:`phases.pytest_plugin`): KRaft, from the setup's Maven jars, on 127.0.0.1."""
    return phases_kafka


@pytest.fixture(scope="session")
def registry(phases_registry):
    """The pytest kit's schema registry (:mod:`phases.pytest_plugin`): Apicurio Registry on 127.0.0.1."""
    return phases_registry


def make_pipeline(source, root: str, *, delay_s: int = 15, **overrides) -> Pipeline:
    fields = dict(
        name="events",
        source=source if not isinstance(source, str) else DeltaSource(path=source),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=timedelta(seconds=delay_s),
        operator=KeyedAggregate(aggregations=AGGREGATIONS),
        sink=DeltaSink(path=f"{root}/sink"),
        locations=Locations(root=root),
        checkpoint_interval=timedelta(milliseconds=500),
    )
    fields.update(overrides)
    return Pipeline(**fields)
