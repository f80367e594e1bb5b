"""The formats of a result topic's records that keep their schemas in a schema registry (Avro, Protobuf): what the
topic sink, a redeploy's check and ``read_topic`` ask of either (:class:`RegisteredRecords`), and which one a sink
declares (:func:`registered_records`). JSON records need no registry and are written by
:mod:`phases._internal.topics.records` itself."""

from __future__ import annotations

from phases._internal.definition import KafkaSink, ValueFormat
from phases._internal.topics.avro_records import AvroRecords
from phases._internal.topics.protobuf_records import ProtobufRecords
from phases._internal.topics.registered_records import RegisteredRecords


def registered_records(sink: KafkaSink, pipeline: str) -> RegisteredRecords | None:
    """The encoding of ``sink``'s records: Avro or Protobuf; None for JSON."""
    if sink.value_format == ValueFormat.AVRO:
        return AvroRecords(sink, pipeline)
    if sink.value_format == ValueFormat.PROTOBUF:
        return ProtobufRecords(sink, pipeline)
    return None
