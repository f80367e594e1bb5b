"""The Avro schemas a topic sink registers for its results (:mod:`phases._internal.topics.avro_records`): each Spark
type's Avro type, nullable columns as unions with null first and a null default (so that a column a redeploy adds
keeps the subject BACKWARD-compatible), records named after the pipeline. No JVM: the schemas are made in Python."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from phases import SinkError
from phases._internal.topics.avro_records import avro_schema, avro_type


@pytest.mark.parametrize(
    ("spark_type", "avro"),
    [
        (T.StringType(), "string"),
        (T.LongType(), "long"),
        (T.IntegerType(), "int"),
        (T.ShortType(), "int"),
        (T.DoubleType(), "double"),
        (T.FloatType(), "float"),
        (T.BooleanType(), "boolean"),
        (T.BinaryType(), "bytes"),
        (T.DateType(), {"type": "int", "logicalType": "date"}),
        (T.TimestampType(), {"type": "long", "logicalType": "timestamp-micros"}),
        (T.TimestampNTZType(), {"type": "long", "logicalType": "local-timestamp-micros"}),
        (T.DecimalType(12, 3), {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}),
        (T.ArrayType(T.LongType(), True), {"type": "array", "items": ["null", "long"]}),
        (T.MapType(T.StringType(), T.DoubleType(), False), {"type": "map", "values": "double"}),
    ],
)
def test_each_spark_type_has_its_avro_type(spark_type, avro):
    assert avro_type(spark_type, "r") == avro


def test_a_result_record_names_its_fields_and_makes_nullable_columns_optional():
    columns = T.StructType(
        [
            T.StructField("key", T.StringType(), False),
            T.StructField("n", T.LongType(), True),
            T.StructField("window", T.StructType([T.StructField("start", T.TimestampType(), True)]), True),
        ]
    )
    schema = avro_schema(columns, "daily-totals_result")
    assert schema["name"] == "daily_totals_result" and schema["namespace"] == "phases"
    key, n, window = schema["fields"]
    assert key == {"name": "key", "type": "string"}
    assert n == {"name": "n", "type": ["null", "long"], "default": None}
    assert window["type"][0] == "null" and window["type"][1]["name"] == "daily_totals_result_window"
    assert window["default"] is None


def test_a_type_without_an_avro_type_is_refused_naming_it():
    with pytest.raises(SinkError, match="map<bigint,string>"):
        avro_type(T.MapType(T.LongType(), T.StringType()), "r")
