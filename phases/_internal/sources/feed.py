"""Public helpers to make and feed a source table the pipeline accepts: a Delta table with the change data
feed on from its first version, appended to (one commit = one source version = one arrival)."""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from phases._internal.storage import tables

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType(), True),
        T.StructField("ts", T.TimestampType(), True),
        T.StructField("value", T.LongType(), True),
    ]
)


def create_source(spark: SparkSession, path: str, schema: T.StructType | str = EVENT_SCHEMA) -> None:
    """Creates an empty append-only source table at ``path`` with the change data feed on from version 0
    (``schema``: a StructType or a DDL string such as ``"key string, ts timestamp, value long"``)."""
    columns = spark.createDataFrame([], schema).schema  # a DDL string parsed (no job runs)
    tables.create(spark, path, columns, **{"delta.enableChangeDataFeed": "true"})  # pyright: ignore[reportArgumentType]


def append(
    spark: SparkSession, path: str, rows: DataFrame | Iterable[tuple], schema: T.StructType | None = None
) -> int:
    """Appends ``rows`` (a DataFrame, or tuples in the table's column order) as one new source version;
    returns that version."""
    df = rows
    if not isinstance(rows, DataFrame):
        df = spark.createDataFrame(list(rows), schema or spark.read.format("delta").load(path).schema)
    df.write.format("delta").mode("append").save(path)  # pyright: ignore[reportAttributeAccessIssue]
    from phases._internal.storage import tables

    return tables.version(spark, path)
