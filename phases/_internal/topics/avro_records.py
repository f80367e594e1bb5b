"""A result topic's records in Avro (:class:`phases.KafkaSink` with ``value_format="avro"``): the Confluent wire format,
the schemas registered in the sink's schema registry.

- **Schemas.** The value schema is a record of every result column, the key schema a record of the key columns, made
  from the columns' Spark types (:func:`avro_schema`): strings, integers (``int`` and ``long``), ``float``,
  ``double``, ``boolean``, ``bytes``; a date is an ``int`` with logical type ``date``, a timestamp a ``long`` with
  ``timestamp-micros`` (``local-timestamp-micros`` without a time zone), a decimal ``bytes`` with logical type
  ``decimal`` and its precision and scale; arrays, maps with string keys and structs nest. A column that may be null
  is a union with ``null`` first and a ``null`` default, so that a column a redeploy adds keeps the subject
  ``BACKWARD``-compatible. The value record is named ``<pipeline>_result`` and the key record ``<pipeline>_key``, in
  the namespace ``phases``.
- **Registration.** Each schema is registered under the sink's subjects (``<topic>-value``, ``<topic>-key``) before
  the first record that uses it is produced; a schema the subject already holds keeps its id. A schema the subject's
  compatibility rule refuses is a :class:`SinkError` naming the rule, before anything is written (a redeploy asks
  before its swap: :func:`check_compatible`).
- **Encoding** runs in Spark: ``to_avro`` with the registered schema, behind the magic byte and the schema id.
  Tombstones keep a null value. A redeploy's boundary records have a null key and a null value (their header says
  what they are), so that an Avro deserializer reads them as nulls.
"""

from __future__ import annotations

import json
import re

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.errors import SinkError
from phases._internal.topics.registered_records import RegisteredRecords

NAMESPACE = "phases"
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


def _name(text: str) -> str:
    name = _NOT_NAME.sub("_", text)
    return name if name and not name[0].isdigit() else f"_{name}"


def avro_type(data_type: T.DataType, name: str) -> str | dict:
    """The Avro type of a Spark type (``name``: the record name a struct gets)."""
    if isinstance(data_type, T.StringType):
        return "string"
    if isinstance(data_type, T.LongType):
        return "long"
    if isinstance(data_type, T.IntegerType | T.ShortType | T.ByteType):
        return "int"
    if isinstance(data_type, T.DoubleType):
        return "double"
    if isinstance(data_type, T.FloatType):
        return "float"
    if isinstance(data_type, T.BooleanType):
        return "boolean"
    if isinstance(data_type, T.BinaryType):
        return "bytes"
    if isinstance(data_type, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(data_type, T.TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(data_type, T.TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(data_type, T.DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": data_type.precision, "scale": data_type.scale}
    if isinstance(data_type, T.ArrayType):
        return {"type": "array", "items": _nullable(avro_type(data_type.elementType, name), data_type.containsNull)}
    if isinstance(data_type, T.MapType) and isinstance(data_type.keyType, T.StringType):
        return {"type": "map", "values": _nullable(avro_type(data_type.valueType, name), data_type.valueContainsNull)}
    if isinstance(data_type, T.StructType):
        return avro_schema(data_type, name)
    raise SinkError(
        f"a result column of type {data_type.simpleString()} has no Avro type here (strings, numbers, booleans, "
        "bytes, dates, timestamps, decimals, arrays, maps with string keys and structs do)"
    )


def _nullable(avro: str | dict, nullable: bool) -> str | dict | list:
    return ["null", avro] if nullable else avro


def avro_schema(struct: T.StructType, name: str, namespace: str = NAMESPACE) -> dict:
    """The Avro record schema of ``struct``'s columns."""
    fields = []
    for field in struct.fields:
        avro = avro_type(field.dataType, f"{name}_{_name(field.name)}")
        entry: dict = {"name": field.name, "type": _nullable(avro, field.nullable)}
        if field.nullable:
            entry["default"] = None
        fields.append(entry)
    return {"type": "record", "name": _name(name), "namespace": namespace, "fields": fields}


class AvroRecords(RegisteredRecords):
    """The key and value encoding of one topic sink's records in Avro."""

    format_name, schema_type = "Avro", "AVRO"
    compatibility_hint = (
        "a new column may be added when it can be null; a column may not be removed or change type other than widen"
    )

    def schemas(self, columns: T.StructType, key_columns: list[str]) -> tuple[str, str]:
        """(the key schema, the value schema) of results with ``columns``, as JSON text."""
        keys = T.StructType([columns[c] for c in key_columns])
        key = json.dumps(avro_schema(keys, f"{self.pipeline}_key"), sort_keys=True)
        value = json.dumps(avro_schema(columns, f"{self.pipeline}_result"), sort_keys=True)
        return key, value

    def encoded(self, struct: Column, subject: str, schema: str) -> Column:
        """``struct`` as the Confluent wire format of ``schema`` (registered under ``subject`` first)."""
        from pyspark.sql.avro.functions import to_avro

        prefix = b"\x00" + self.schema_id(subject, schema).to_bytes(4, "big")
        return F.concat(F.lit(prefix), to_avro(struct, schema))

    def key_and_value(self, df: DataFrame, columns: list[str], key_columns: list[str]) -> tuple[Column, Column]:
        """The key and value columns of ``df``'s rows (value: ``columns``)."""
        key_schema, value_schema = self.schemas(T.StructType([df.schema[c] for c in columns]), key_columns)
        key = self.encoded(F.struct(*[F.col(f"`{c}`") for c in key_columns]), self.key_subject, key_schema)
        value = self.encoded(F.struct(*[F.col(f"`{c}`") for c in columns]), self.value_subject, value_schema)
        return key, value

    def decoded_values(self, values: DataFrame, reader: T.StructType) -> DataFrame:
        """A frame of binary ``value`` rows in the wire format decoded to ``reader``'s columns (each record by its
        own schema id, resolved to the reader's schema)."""
        from pyspark.sql.avro.functions import from_avro

        schema_id = F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("long")
        ids = [int(r[0]) for r in values.select(schema_id).distinct().collect() if r[0] is not None]
        reader_json = json.dumps(avro_schema(reader, f"{self.pipeline}_result"), sort_keys=True)
        payload = F.substring("value", 6, 2**31 - 1)
        record = F.lit(None).cast(reader)
        for i in ids:
            writer = self.client.schema(i)
            if writer is None:
                raise SinkError(f"the registry at {self.client.url} has no schema id {i}, which a record names")
            record = F.when(schema_id == i, from_avro(payload, writer, {"avroSchema": reader_json})).otherwise(record)
        return values.select(record.alias("r")).select("r.*")
