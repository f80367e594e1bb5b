"""What the registry formats of a result topic's records (Avro, Protobuf) share: the sink's subjects, the ids the
registry gave the schemas, and the check a redeploy makes before its swap (:class:`RegisteredRecords`). Which format a
sink declares is :func:`phases._internal.topics.record_formats.registered_records`."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import types as T

from phases._internal.definition import KafkaSink
from phases._internal.errors import SinkError
from phases._internal.runtime.schema_registry import RegistryClient


class RegisteredRecords:
    """The key and value encoding of one topic sink's records in a registry's format: the sink's subjects, the ids
    the registry gave its schemas, and the check a redeploy makes before its swap. Each format makes its schemas
    (:meth:`schemas`), encodes (:meth:`key_and_value`) and decodes (:meth:`decoded_values`)."""

    format_name = ""  # for messages
    schema_type = ""  # the registry's schemaType
    compatibility_hint = ""  # what a compatible change of the results is in this format

    def __init__(self, sink: KafkaSink, pipeline: str):
        if sink.registry is None:  # (the definition requires it)
            raise SinkError(f"topic {sink.topic!r}: {self.format_name} records need sink.registry")
        self.client = RegistryClient(sink.registry, "sink.registry", SinkError)
        self.key_subject, self.value_subject = sink.subjects
        self.pipeline = pipeline
        self._ids: dict[tuple[str, str], int] = {}

    def schemas(self, columns: T.StructType, key_columns: list[str]) -> tuple[str, str]:
        """(the key schema, the value schema) of results with ``columns``, as the registry's text."""
        raise NotImplementedError

    def key_and_value(self, df: DataFrame, columns: list[str], key_columns: list[str]) -> tuple[Column, Column]:
        """The key and value columns of ``df``'s rows (value: ``columns``), their schemas registered first."""
        raise NotImplementedError

    def decoded_values(self, values: DataFrame, reader: T.StructType) -> DataFrame:
        """A frame of binary ``value`` rows in the wire format decoded to ``reader``'s columns."""
        raise NotImplementedError

    def schema_id(self, subject: str, schema: str) -> int:
        """The id of ``schema`` under ``subject``, registered on first use (a schema the subject holds keeps its id)."""
        if (subject, schema) not in self._ids:
            self._ids[(subject, schema)] = self.client.register(subject, schema, self.schema_type)
        return self._ids[(subject, schema)]

    def check_compatible(self, columns: T.StructType, key_columns: list[str]) -> None:
        """A SinkError naming the subject and its rule when the registry would refuse the key or value schema of
        results with ``columns`` (nothing is registered)."""
        subjects = (self.key_subject, self.value_subject)
        for subject, schema in zip(subjects, self.schemas(columns, key_columns), strict=True):
            if not self.client.compatible(subject, schema, self.schema_type):
                rule = self.client.compatibility(subject)
                raise SinkError(
                    f"sink.registry ({self.client.url}): subject {subject!r} would refuse the schema of the new "
                    f"definition's results under its compatibility rule {rule}: {schema}. Nothing was swapped. Keep "
                    f"the results {rule}-compatible ({self.compatibility_hint}), or change the subject's rule in the "
                    f"registry (PUT /config/{subject}), then run the redeploy again"
                )
