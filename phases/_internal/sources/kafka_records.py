"""A Kafka source's records decoded: the rows Spark's Kafka reader gives (``key``, ``value``, ``topic``, ``partition``,
``offset``, ``timestamp``) as the pipeline's columns, the change columns the engine expects and each record's position.

- **JSON values** (the default): ``from_json`` of the value with the declared ``value_schema``;
- **Avro or Protobuf values** in the Confluent wire format (:mod:`phases._internal.sources.avro_values`,
  :mod:`phases._internal.sources.protobuf_values`), and with ``key_format`` the record's **key** too: the key record's
  fields are columns beside the value's (a field the value has as well is taken from the value).

A record that cannot be decoded keeps its reason (``_decode_error``, quarantined by the record checks) and its bytes:
a JSON value as its text, an Avro or Protobuf value in base64 (``_raw``); its topic, partition and offset are kept
for every row.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.definition import KafkaSource
from phases._internal.sources.avro_values import AvroValues
from phases._internal.sources.protobuf_values import ProtobufValues
from phases._internal.sources.registry_values import RegistryValues

DECODE_ERROR = "_decode_error"  # why a value could not be decoded (null when it could)
RAW = "_raw"  # the undecodable value as text (Avro, Protobuf: base64)
TOPIC, PARTITION, OFFSET = "_kafka_topic", "_kafka_partition", "_kafka_offset"
_CORRUPT = "_corrupt_value"


def registered_values(spark: SparkSession, spec: KafkaSource, *, key: bool = False) -> RegistryValues | None:
    """The registry-format values (or keys) of ``spec``: Avro or Protobuf; None for JSON values (or unread keys)."""
    kind = spec.key_format if key else spec.value_format.value
    formats: dict[str, type[RegistryValues]] = {"avro": AvroValues, "protobuf": ProtobufValues}
    return formats[kind](spark, spec, key=key) if kind in formats else None


def decode_json(raw: DataFrame, spec: KafkaSource, schema: T.StructType) -> DataFrame:
    """JSON values of ``schema``'s fields."""
    text = F.col("value").cast("string")
    parsed = F.from_json(
        text,
        T.StructType([*schema.fields, T.StructField(_CORRUPT, T.StringType(), True)]),
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT},
    )
    error = (
        F.when(F.col("value").isNull(), F.lit("undecodable: null value (a tombstone)"))
        .when(F.col("_parsed").isNull(), F.lit("undecodable: not a JSON object"))
        .when(
            F.col(f"_parsed.{_CORRUPT}").isNotNull(),
            F.lit(f"undecodable: not JSON of the declared value_schema ({spec.value_schema})"),
        )
    )
    fields = [(f.name, F.col(f"_parsed.`{f.name}`")) for f in schema.fields]
    return _decoded(raw, {"_parsed": parsed}, error, fields, text)


def decode_registered(raw: DataFrame, values: RegistryValues, keys: RegistryValues | None) -> DataFrame:
    """Avro or Protobuf values (and keys, with ``keys``) by each record's schema ids."""
    record, error = values.decoded(F.col("value"))
    parts = {"_parsed": record}
    fields = values.fields("_parsed")
    if keys is not None:
        key_record, key_error = keys.decoded(F.col("key"))
        parts["_parsed_key"] = key_record
        error = F.coalesce(error, F.regexp_replace(key_error, "^undecodable: ", "undecodable key: "))
        have = {name for name, _ in fields}
        fields += [(name, column) for name, column in keys.fields("_parsed_key") if name not in have]
    return _decoded(raw, parts, error, fields, F.base64("value"))


def _decoded(
    raw: DataFrame, parts: dict[str, Column], error: Column, fields: list[tuple[str, Column]], text: Column
) -> DataFrame:
    """The decoded rows: the ``fields`` (name, column of the decoded ``parts``) where ``error`` is null, the change
    columns, the record's position, and for an undecodable record its reason and ``text``."""
    decoded = raw.select("*", *[column.alias(name) for name, column in parts.items()]).withColumn(DECODE_ERROR, error)
    ok = F.col(DECODE_ERROR).isNull()
    return decoded.select(
        *[F.when(ok, column).alias(name) for name, column in fields],
        F.lit("insert").alias("_change_type"),
        F.col("timestamp").alias("_commit_timestamp"),
        F.col("topic").alias(TOPIC),
        F.col("partition").alias(PARTITION),
        F.col("offset").alias(OFFSET),
        F.col(DECODE_ERROR),
        F.when(~ok, F.coalesce(text, F.lit(""))).alias(RAW),  # a tombstone: the empty string
    )
