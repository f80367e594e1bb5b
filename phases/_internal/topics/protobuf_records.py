"""A result topic's records in Protobuf (:class:`phases.KafkaSink` with ``value_format="protobuf"``): the Confluent
wire format, the schemas registered in the sink's schema registry as .proto texts.

- **Schemas.** The value schema is a proto3 file (package ``phases``) with one message of every result column, the
  key schema one of the key columns, made from the columns' Spark types (:func:`proto_schema`): strings, ``int64``
  for longs and ``int32`` for smaller integers, ``double``, ``float``, ``bool``, ``bytes``; a timestamp is a
  ``google.protobuf.Timestamp``, a date an ``int32`` of days since 1970-01-01, a decimal a ``string`` of its exact
  digits; arrays are ``repeated`` fields, maps with string, integer or boolean keys ``map`` fields, structs nested
  messages. Fields are numbered in column order. A column that may be null is ``optional`` (it has presence: a null
  is absent, not zero); a null array or map is written empty, which Protobuf cannot tell apart. The value message is
  named ``<pipeline>_result`` and the key message ``<pipeline>_key``.
- **Registration and compatibility** as for Avro (:mod:`phases._internal.topics.avro_records`): under the sink's
  subjects before the first record that uses a schema; a redeploy asks the subjects' rules before its swap. Field
  numbers follow the column order, so a redeploy that adds a column at the end stays compatible, and one that
  inserts, removes or reorders columns is refused by a ``BACKWARD`` rule.
- **Encoding** runs in the JVM (the engine's helper, ``ProtobufRecords.encode``), behind the magic byte, the schema
  id and the message index ``[0]``. Tombstones keep a null value.
"""

from __future__ import annotations

import re

from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.errors import SinkError
from phases._internal.runtime import protobuf_schemas
from phases._internal.runtime.protobuf_schemas import helper, java_error
from phases._internal.runtime.schema_registry import SubjectVersion
from phases._internal.topics.registered_records import RegisteredRecords

PACKAGE = "phases"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")
_MAP_KEYS = (T.StringType, T.LongType, T.IntegerType, T.ShortType, T.ByteType, T.BooleanType)


def _message_name(text: str) -> str:
    name = _NOT_NAME.sub("_", text)
    return name if name and not name[0].isdigit() else f"_{name}"


def _scalar(data_type: T.DataType, name: str, nested: list[str], depth: int) -> str:
    """The Protobuf type of a non-repeated Spark type (a struct adds its message to ``nested``)."""
    simple = {
        T.StringType: "string",
        T.LongType: "int64",
        T.IntegerType: "int32",
        T.ShortType: "int32",
        T.ByteType: "int32",
        T.DoubleType: "double",
        T.FloatType: "float",
        T.BooleanType: "bool",
        T.BinaryType: "bytes",
        T.DateType: "int32",
        T.DecimalType: "string",
        T.TimestampType: "google.protobuf.Timestamp",
        T.TimestampNTZType: "google.protobuf.Timestamp",
    }
    for spark_type, proto in simple.items():
        if isinstance(data_type, spark_type):
            return proto
    if isinstance(data_type, T.StructType):
        message = f"{_message_name(name)}_type"
        nested.append(_message(data_type, message, depth + 1))
        return message
    raise SinkError(
        f"a result column of type {data_type.simpleString()} has no Protobuf type here (strings, numbers, booleans, "
        "bytes, dates, timestamps, decimals, arrays of these, maps with string, integer or boolean keys, and structs "
        "do)"
    )


def _message(struct: T.StructType, name: str, depth: int = 0) -> str:
    indent = "  " * depth
    nested: list[str] = []
    fields: list[str] = []
    for number, field in enumerate(struct.fields, start=1):
        if not _IDENTIFIER.match(field.name):
            raise SinkError(
                f"result column {field.name!r} is not a Protobuf field name (letters, digits and underscores, not "
                "starting with a digit): rename it in the definition (an alias) to write Protobuf records"
            )
        data_type = field.dataType
        if isinstance(data_type, T.ArrayType):
            if isinstance(data_type.elementType, T.ArrayType | T.MapType):
                raise SinkError(f"result column {field.name!r}: Protobuf has no repeated field of arrays or maps")
            proto = f"repeated {_scalar(data_type.elementType, field.name, nested, depth)}"
        elif isinstance(data_type, T.MapType):
            if not isinstance(data_type.keyType, _MAP_KEYS) or isinstance(data_type.valueType, T.ArrayType | T.MapType):
                raise SinkError(
                    f"result column {field.name!r} ({data_type.simpleString()}): a Protobuf map needs string, integer "
                    "or boolean keys and values that are not arrays or maps"
                )
            key = _scalar(data_type.keyType, field.name, nested, depth)
            proto = f"map<{key}, {_scalar(data_type.valueType, field.name, nested, depth)}>"
        else:
            proto = _scalar(data_type, field.name, nested, depth)
            if field.nullable:
                proto = f"optional {proto}"
        fields.append(f"{indent}  {proto} {field.name} = {number};")
    return "\n".join([f"{indent}message {name} {{", *nested, *fields, f"{indent}}}"])


def proto_schema(struct: T.StructType, name: str) -> str:
    """The proto3 file of one message ``name`` with ``struct``'s columns."""
    body = _message(struct, _message_name(name))
    imports = 'import "google/protobuf/timestamp.proto";\n' if "google.protobuf.Timestamp" in body else ""
    return f'syntax = "proto3";\npackage {PACKAGE};\n{imports}\n{body}\n'


class ProtobufRecords(RegisteredRecords):
    """The key and value encoding of one topic sink's records in Protobuf."""

    format_name, schema_type = "Protobuf", "PROTOBUF"
    compatibility_hint = (
        "Protobuf fields are numbered in column order: a new column may be added at the end; none may be removed, "
        "reordered or change type"
    )

    def schemas(self, columns: T.StructType, key_columns: list[str]) -> tuple[str, str]:
        """(the key schema, the value schema) of results with ``columns``, as .proto texts."""
        keys = T.StructType([columns[c] for c in key_columns])
        return proto_schema(keys, f"{self.pipeline}_key"), proto_schema(columns, f"{self.pipeline}_result")

    def encoded(self, struct: Column, input_type: T.StructType, subject: str, schema: str) -> Column:
        """``struct`` as the Confluent wire format of ``schema`` (registered under ``subject`` first)."""
        schema_id = self.schema_id(subject, schema)
        data = protobuf_schemas.compile_text(schema, "result.proto", f"topic sink subject {subject!r}", SinkError)
        return spark_internals.column_of(
            helper(SparkSession.active()).encode(
                spark_internals.java_column(struct),
                bytearray(data),
                "result.proto",
                "",
                schema_id,
                input_type.json(),
            )
        )

    def key_and_value(self, df: DataFrame, columns: list[str], key_columns: list[str]) -> tuple[Column, Column]:
        value_type = T.StructType([df.schema[c] for c in columns])
        key_type = T.StructType([df.schema[c] for c in key_columns])
        key_schema, value_schema = self.schemas(value_type, key_columns)
        key = self.encoded(F.struct(*[F.col(f"`{c}`") for c in key_columns]), key_type, self.key_subject, key_schema)
        value = self.encoded(
            F.struct(*[F.col(f"`{c}`") for c in columns]), value_type, self.value_subject, value_schema
        )
        return key, value

    def decoded_values(self, values: DataFrame, reader: T.StructType) -> DataFrame:
        schema_id = F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("long")
        ids = sorted(int(r[0]) for r in values.select(schema_id).distinct().collect() if r[0] is not None)
        sets, files = [], []
        for i in ids:
            text = self.client.schema(i)
            if text is None:
                raise SinkError(f"the registry at {self.client.url} has no schema id {i}, which a record names")
            data, file = protobuf_schemas.descriptor_set(
                self.client, SubjectVersion(0, i, text, "PROTOBUF"), self.value_subject, SinkError
            )
            sets.append(bytearray(data))
            files.append(file)
        spark = values.sparkSession
        try:
            decoded = spark_internals.column_of(
                helper(spark).decode(
                    spark_internals.java_column(F.col("value")),
                    spark_internals.java_list(spark, sets),
                    spark_internals.java_list(spark, ids),
                    spark_internals.java_list(spark, files),
                    reader.json(),
                    self.value_subject,
                )
            )
        except Py4JJavaError as exc:
            raise SinkError(f"the topic's Protobuf schemas cannot be read: {java_error(exc)}") from None
        rows = values.select(decoded.alias("d"))
        bad = rows.filter(F.col("d.error").isNotNull()).select("d.error").limit(1).collect()
        if bad:
            raise SinkError(f"a record of the result topic cannot be decoded: {bad[0][0]}")
        return rows.select("d.record.*")
