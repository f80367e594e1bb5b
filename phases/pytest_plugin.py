"""The pytest plugin of :mod:`phases.testing`: fixtures for testing your own pipelines.

Pytest loads it by itself (entry point ``pytest11`` named ``phases``) once the package is installed with its
``testing`` extra (``pip install "two-phase-pipelines[testing]"``). It gives:

- ``phases_spark``: one local SparkSession with Delta for the whole test session (2 shuffle partitions; build your
  own with :func:`phases.build_session` for other settings);
- ``delta_source``: a factory that writes a fresh source table from versions (each a list of tuples, a list of
  dicts or a pandas DataFrame: one element, one source version) under the test's ``tmp_path`` and returns its path;
- ``phases_kafka``: one real Kafka broker on 127.0.0.1 for the test session;
- ``phases_registry``: one real schema registry (Apicurio Registry, the Confluent API) on 127.0.0.1 for the test
  session: ``phases_registry.url`` is what :class:`phases.SchemaRegistry` takes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from phases._internal.errors import SetupError

try:
    import pytest
except ImportError as exc:  # imported by hand without the extra; pytest itself never gets here without pytest
    raise SetupError(
        "phases.pytest_plugin needs pytest, which the package's testing extra installs: pip install "
        '"two-phase-pipelines[testing]"'
    ) from exc
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from phases._internal.sources import feed as sources
from phases.testing import Version, write_versions


@pytest.fixture(scope="session")
def phases_spark() -> Iterator[SparkSession]:
    """One local SparkSession with Delta for the test session (2 shuffle partitions). A session that was already
    running when the fixture started (your own code made it) is used and left running for its owner to stop."""
    from phases._internal.runtime.session import SparkSettings, build_session

    running = SparkSession.getActiveSession() is not None
    session = build_session(SparkSettings(shuffle_partitions=2, app_name="phases-tests"))
    yield session
    if not running:
        session.stop()


@pytest.fixture(scope="session")
def phases_kafka(tmp_path_factory: pytest.TempPathFactory):
    """One real Kafka broker (KRaft, :class:`phases.local.LocalKafka`) on 127.0.0.1 for the test
    session, with a fresh data folder: ``phases_kafka.bootstrap_servers``,
    ``phases_kafka.create_topic(name, partitions)``."""
    from phases.local import LocalKafka

    broker = LocalKafka(tmp_path_factory.mktemp("kafka-broker")).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def phases_registry(tmp_path_factory: pytest.TempPathFactory):
    """One real schema registry (:class:`phases.local.LocalRegistry`: Apicurio Registry with in-memory storage,
    serving the Confluent Schema Registry API) on 127.0.0.1 for the test session: ``phases_registry.url``,
    ``phases_registry.register(subject, avro_schema)``."""
    from phases.local import LocalRegistry

    registry = LocalRegistry(tmp_path_factory.mktemp("schema-registry")).start()
    yield registry
    registry.stop()


@pytest.fixture
def delta_source(phases_spark: SparkSession, tmp_path: Path):
    """A factory: ``delta_source(versions, schema=EVENT_SCHEMA)`` writes a fresh source table under the test's
    ``tmp_path`` (version 0 empty, then one version per element) and returns its path."""

    def make(versions: Sequence[Version], schema: T.StructType | str = sources.EVENT_SCHEMA) -> str:
        path = str(tmp_path / f"source-{uuid.uuid4().hex[:8]}")
        write_versions(phases_spark, path, versions, schema)
        return path

    return make
