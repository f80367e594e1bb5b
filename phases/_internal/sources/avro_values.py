"""A topic's Avro values in the Confluent wire format, decoded in the JVM by the schema each record names.

A value is a zero magic byte, the id of its writer schema (4 bytes, big-endian) and the Avro binary encoding. The
subject's versions are read from the registry (:class:`phases._internal.runtime.schema_registry.RegistryClient`); a
value is decoded by Spark's ``from_avro`` with its own version's schema as the writer schema and the subject's newest
version as the reader schema (Avro's schema resolution: a field the writer lacks takes the reader's default), so every
record of the topic has the newest schema's columns, whatever version wrote it. Nothing is decoded record by record
in Python.

What cannot be decoded, and a version registered while live, are handled as for every registry format
(:mod:`phases._internal.sources.registry_values`).
"""

from __future__ import annotations

import json

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.errors import SourceError
from phases._internal.sources.registry_values import RegistryValues

DECODED = "__phases_decoded"  # the reader schema's extra field: true in every record Avro decoded


class AvroValues(RegistryValues):
    """Avro values (or, with ``key``, keys) of one Kafka source."""

    def reader_type(self) -> T.StructType:
        """The Spark type of the reader schema's records (Spark's own Avro-to-Spark mapping)."""
        from pyspark.sql.avro.functions import from_avro

        probe = self.spark.range(0).select(from_avro(F.lit(b"").cast("binary"), self.reader).alias("r"))
        record = probe.schema["r"].dataType
        if not isinstance(record, T.StructType):
            raise SourceError(
                f"{self.spec.location}: the newest schema of subject {self.subject!r} is not an Avro record "
                f"({record.simpleString()}): a value must be a record of fields"
            )
        return record

    # --- decoding ----------------------------------------------------------------------------------
    def decoded(self, value: Column) -> tuple[Column, Column]:
        """(the record as the reader schema's struct, or null; why it could not be decoded, or null) of the binary
        Kafka ``value``, by the versions known now."""
        from pyspark.sql.avro.functions import from_avro

        schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
        payload = F.substring(value, 6, 2**31 - 1)
        # The reader schema with one more field whose default is true: the writer never has it, so a decoded record
        # has it true; Spark's PERMISSIVE mode gives bytes it cannot decode a record of nulls (all-null records are
        # legitimate), where it is null.
        reader = json.loads(self.reader)
        reader["fields"] = [*reader["fields"], {"name": DECODED, "type": "boolean", "default": True}]
        flagged = json.dumps(reader)
        options = {"avroSchema": flagged, "mode": "PERMISSIVE"}
        probe = self.spark.range(0).select(from_avro(F.lit(b"").cast("binary"), flagged).alias("r"))
        record = F.lit(None).cast(probe.schema["r"].dataType)
        known = F.lit(False)
        for version in self.versions:
            record = F.when(schema_id == version.id, from_avro(payload, version.schema, options)).otherwise(record)
            known = known | (schema_id == version.id)
        error = (
            F.when(value.isNull(), F.lit("undecodable: null value (a tombstone)"))
            .when(
                (F.length(value) < 5) | (F.substring(value, 1, 1) != F.lit(b"\x00")),
                F.lit("undecodable: not the Confluent wire format (a zero magic byte, then a 4-byte schema id)"),
            )
            .when(
                ~known,
                F.concat(
                    F.lit("undecodable: schema id "),
                    schema_id.cast("string"),
                    F.lit(f" is not a version of subject {self.subject!r}"),
                ),
            )
            .when(
                record.isNull() | record[DECODED].isNull(),
                F.concat(F.lit("undecodable: not Avro of its schema (id "), schema_id.cast("string"), F.lit(")")),
            )
        )
        return record, error
