"""A topic's values (or keys) in the Confluent wire format with their schemas in a schema registry: what Avro and
Protobuf share (:mod:`phases._internal.sources.avro_values`, :mod:`phases._internal.sources.protobuf_values`).

A value is a zero magic byte, the id of its writer schema (4 bytes, big-endian) and the encoded record. The subject's
versions are read from the registry (:class:`phases._internal.runtime.schema_registry.RegistryClient`); each record is
decoded in the JVM by its own version's schema into the subject's newest version's columns, whatever version wrote
it. Nothing is decoded record by record in Python.

What cannot be decoded is kept with its reason (the caller quarantines it, with the value in base64): a null value
(a tombstone), a value that is not in the wire format (too short, or another magic byte), a schema id that is not a
version of the subject, bytes that are not a record of their schema.

**A new version while live.** The stream decodes with the versions the registry had when the query started. A
record whose schema id is not among them is looked up once the micro-batch runs (:meth:`RegistryValues.newer_schema`):
if the subject has it now, the micro-batch stops before it writes anything with :class:`NewSchemaVersion`, whose
message the live runner takes as a source schema change (:mod:`phases._internal.schema_changes`): it takes the new
schema up and starts the query again from its checkpoint, which runs that micro-batch again with the new version.
"""

from __future__ import annotations

import re

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.definition import KafkaSource
from phases._internal.errors import NewSchemaVersion, SourceError
from phases._internal.runtime.schema_registry import RegistryClient, SubjectVersion

# The marker of a micro-batch stopped for a new schema version (in schema_changes.SCHEMA_CHANGE_MARKERS).
NEW_VERSION_MARKER = "PHASES_NEW_SCHEMA_VERSION"
_UNKNOWN_ID = re.compile(r"schema id (\d+) is not a version of subject")


class RegistryValues:
    """The values (or, with ``key``, keys) of one Kafka source in a registry's format: its subject's versions, the
    reader schema, the decoding expressions."""

    def __init__(self, spark: SparkSession, spec: KafkaSource, *, key: bool = False):
        if spec.registry is None:  # (the definition requires it)
            raise SourceError(f"{spec.location}: {spec.value_format.value} records need source.registry")
        self.spark, self.spec, self.key = spark, spec, key
        self.client = RegistryClient(spec.registry, "source.registry", SourceError)
        self.subject = spec.key_subject_name if key else spec.subject
        self._versions: list[SubjectVersion] | None = None

    # --- the registry ------------------------------------------------------------------------------
    def refresh(self) -> list[SubjectVersion]:
        """Reads the subject's versions again (a new query, a new backlog)."""
        versions = self.client.versions(self.subject)
        if not versions:
            what, field = ("key", "key_subject") if self.key else ("value", "value_subject")
            raise SourceError(
                f"{self.spec.location}: the registry at {self.client.url} (source.registry) has no schema under "
                f"subject {self.subject!r}, so no {what} of the topic can be decoded. Register the topic's {what} "
                "schema there (producers with a Confluent-compatible serializer do on their first write), or name "
                f"the subject that holds it in source.{field}, then run again"
            )
        self._versions = versions
        return versions

    @property
    def versions(self) -> list[SubjectVersion]:
        return self._versions if self._versions is not None else self.refresh()

    @property
    def reader(self) -> str:
        """The reader schema: the subject's newest version."""
        return self.versions[-1].schema

    def reader_type(self) -> T.StructType:
        """The Spark type of the reader schema's records."""
        raise NotImplementedError

    def decoded(self, value: Column) -> tuple[Column, Column]:
        """(the record as the reader schema's struct, or null; why it could not be decoded, or null) of the binary
        Kafka ``value``, by the versions known now."""
        raise NotImplementedError

    def fields(self, record: str) -> list[tuple[str, Column]]:
        """The columns the pipeline reads from the decoded struct column ``record``: the declared value_schema's
        fields cast to their types, else every field of the reader schema."""
        have = {f.name: f for f in self.reader_type().fields}
        if self.key or self.spec.value_schema is None:
            return [(name, F.col(f"{record}.`{name}`")) for name in have]
        declared = T._parse_datatype_string(self.spec.value_schema)
        missing = [f.name for f in declared.fields if f.name not in have]  # pyright: ignore[reportAttributeAccessIssue]
        if missing:
            raise SourceError(
                f"{self.spec.location}: value_schema fields {missing} are not in the newest schema of subject "
                f"{self.subject!r} (its fields: {sorted(have)}). Declare fields the records have, or leave "
                "value_schema out to read every field"
            )
        return [(f.name, F.col(f"{record}.`{f.name}`").cast(f.dataType)) for f in declared.fields]  # pyright: ignore[reportAttributeAccessIssue]

    def schema(self) -> T.StructType:
        """The records' columns, as :meth:`fields` gives them, by the subject's versions now (read again: the live
        runner asks before each query it starts, and the query decodes with what it read)."""
        self.refresh()
        if not self.key and self.spec.value_schema is not None:
            declared = T._parse_datatype_string(self.spec.value_schema)
            if isinstance(declared, T.StructType):
                return declared
        return self.reader_type()

    def newer_schema(self, rows: DataFrame, error_column: str) -> None:
        """Raises :class:`NewSchemaVersion` when a row of ``rows`` was not decoded for a schema id that the subject
        has now but did not have when the versions were read (a version registered while the query ran)."""
        unknown = (
            rows.filter(F.col(error_column).contains(f"is not a version of subject {self.subject!r}"))
            .select(error_column)
            .distinct()
            .limit(100)
            .collect()
        )
        if not unknown:
            return
        ids = {int(m.group(1)) for (text,) in unknown if (m := _UNKNOWN_ID.search(text))}
        known = {v.id for v in self.versions}
        now = {v.id: v.version for v in self.client.versions(self.subject)}
        new = sorted(i for i in ids if i in now and i not in known)
        if new:
            raise NewSchemaVersion(
                f"{NEW_VERSION_MARKER}: {self.spec.location}: records of schema ids {new} (versions "
                f"{[now[i] for i in new]} of subject {self.subject!r}) were registered after the live query started; "
                "it starts again with the newest schema"
            )
