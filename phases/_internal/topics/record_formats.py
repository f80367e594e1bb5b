"""The formats of a result topic's records that keep their schemas in a schema registry (Avro, Protobuf): what the
topic sink, a redeploy's check and ``read_topic`` ask of either (:class:`RegisteredRecords`), and which one a sink
declares (:func:`registered_records`). JSON records need no registry and are written by
:mod:`phases._internal.topics.records` itself."""

from __future__ import annotations

from typing import Protocol

from pyspark.sql import Column, DataFrame
from pyspark.sql import types as T

from phases._internal.definition import KafkaSink, ValueFormat
from phases._internal.runtime.schema_registry import RegistryClient


class RegisteredRecords(Protocol):
    """The key and value encoding of one topic sink's records in a registry's format."""

    client: RegistryClient

    def key_and_value(self, df: DataFrame, columns: list[str], key_columns: list[str]) -> tuple[Column, Column]:
        """The key and value columns of ``df``'s rows (value: ``columns``), their schemas registered first."""
        ...

    def check_compatible(self, columns: T.StructType, key_columns: list[str]) -> None:
        """A SinkError naming the subject and its rule when the registry would refuse the key or value schema of
        results with ``columns`` (nothing is registered)."""
        ...

    def decoded_values(self, values: DataFrame, reader: T.StructType) -> DataFrame:
        """A frame of binary ``value`` rows in the wire format decoded to ``reader``'s columns."""
        ...


def registered_records(sink: KafkaSink, pipeline: str) -> RegisteredRecords | None:
    """The encoding of ``sink``'s records: Avro or Protobuf; None for JSON."""
    if sink.value_format == ValueFormat.AVRO:
        from phases._internal.topics.avro_records import AvroRecords

        return AvroRecords(sink, pipeline)
    if sink.value_format == ValueFormat.PROTOBUF:
        from phases._internal.topics.protobuf_records import ProtobufRecords

        return ProtobufRecords(sink, pipeline)
    return None
