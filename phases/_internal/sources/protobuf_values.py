"""A topic's Protobuf values (or keys) in the Confluent wire format, decoded in the JVM by the schema each record
names (the engine's helper, ``org.apache.spark.sql.phases.ProtobufRecords``: Spark 4.2's spark-protobuf is not
published on Maven Central).

A value is a zero magic byte, the id of its writer schema (4 bytes, big-endian), the message indexes (which message of
the schema's file the record is: zig-zag varints, a single 0 for the file's first message) and the Protobuf binary
encoding. Each version's schema (a .proto text, or a base64 descriptor, with its references) is compiled into a
descriptor set (:mod:`phases._internal.runtime.protobuf_schemas`); each record is parsed with its own version's
message and read into the columns of the newest version's first message by field name: a field its writer's version
lacks is null. A field whose type changed between versions beyond widening (an int32 read as a long, say) is not
decodable and quarantined with the field named. The Spark types of Protobuf's are listed in the helper's source and
in the manual (docs/sources.md).
"""

from __future__ import annotations

import json

from py4j.protocol import Py4JJavaError
from pyspark.sql import Column
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.errors import SourceError
from phases._internal.runtime import protobuf_schemas
from phases._internal.runtime.protobuf_schemas import helper, java_error
from phases._internal.runtime.schema_registry import SubjectVersion
from phases._internal.sources.registry_values import RegistryValues


class ProtobufValues(RegistryValues):
    """Protobuf values (or, with ``key``, keys) of one Kafka source."""

    def _compiled(self, version: SubjectVersion) -> tuple[bytes, str]:
        if version.schema_type != "PROTOBUF":
            raise SourceError(
                f"{self.spec.location}: version {version.version} of subject {self.subject!r} (schema id "
                f"{version.id}) holds a schema of type {version.schema_type}, and source.value_format is 'protobuf'. "
                "Set the format the topic's producers write, or name the subject of its Protobuf schemas, then run "
                "again"
            )
        return protobuf_schemas.descriptor_set(self.client, version, self.subject, SourceError)

    def reader_type(self) -> T.StructType:
        """The Spark type of the newest version's first message."""
        newest = self.versions[-1]
        data, file = self._compiled(newest)
        try:
            text = helper(self.spark).sparkTypeJson(bytearray(data), file, "")
        except Py4JJavaError as exc:
            raise SourceError(
                f"{self.spec.location}: the newest schema of subject {self.subject!r} (version {newest.version}, "
                f"schema id {newest.id}) has no Spark type: {java_error(exc)}"
            ) from None
        record = T.StructType.fromJson(json.loads(text))
        if not record.fields:
            raise SourceError(
                f"{self.spec.location}: the first message of the newest schema of subject {self.subject!r} has no "
                "fields: a value must be a message of fields"
            )
        return record

    def decoded(self, value: Column) -> tuple[Column, Column]:
        sets, ids, files = [], [], []
        for version in self.versions:
            data, file = self._compiled(version)
            sets.append(bytearray(data))
            ids.append(version.id)
            files.append(file)
        reader = self.reader_type()
        decoded = spark_internals.column_of(
            helper(self.spark).decode(
                spark_internals.java_column(value),
                spark_internals.java_list(self.spark, sets),
                spark_internals.java_list(self.spark, ids),
                spark_internals.java_list(self.spark, files),
                reader.json(),
                self.subject,
            )
        )
        return decoded["record"], decoded["error"]
