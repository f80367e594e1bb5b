"""The local schema registry (:class:`phases.local.LocalRegistry`, Apicurio Registry): two run side by side on one
machine (the suite's two processes each start one), each with its own schemas, on loopback only."""

from __future__ import annotations

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from phases.local import LocalRegistry

SCHEMA = {"type": "record", "name": "E", "fields": [{"name": "key", "type": "string"}]}


@pytest.mark.slow
def test_two_local_registries_run_side_by_side_each_with_its_own_schemas(tmp_path):
    first, second = LocalRegistry(tmp_path / "a"), LocalRegistry(tmp_path / "b")
    try:
        first.start()
        second.start()  # its management interface too listens on a port of its own
        assert first.register("only-in-first-value", SCHEMA) == 1
        for registry, expected in ((first, ["only-in-first-value"]), (second, [])):
            client = SchemaRegistryClient({"url": registry.url})
            assert client.get_subjects() == expected
            assert client.get_compatibility() == "BACKWARD"
    finally:
        second.stop()
        first.stop()
