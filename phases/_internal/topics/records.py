"""The records a result topic holds: a DataFrame of results encoded as Kafka keys and values, with headers.

The format is JSON by default (below), or Avro in the Confluent wire format (``value_format="avro"``:
:mod:`phases._internal.topics.avro_records`) with the same keys, values, tombstones and headers. JSON (UTF-8):

- the **key** is a JSON object of the pipeline's key columns (``{"key": "k1"}``), so one key's records always carry
  the same bytes and go to one partition, in order (a windowed result's window bounds are in its value);
- the **value** is a JSON object of every result column. Nulls are kept (``"total": null``), timestamps are
  ISO-8601 in UTC with microseconds (``"2026-01-01T00:00:59.123456Z"``), dates ``yyyy-MM-dd``, decimals JSON numbers
  with their exact digits and scale (read them as decimals, not floats), integers JSON integers, binary base64,
  arrays and structs nested; a value of None (a tombstone) removes the key in an upsert topic;
- the **headers** name the pipeline (``phases.pipeline``), the handoff (``phases.handoff``) and the micro-batch
  (``phases.batch``, ``-1`` for the handoff's results); a redeploy's **boundary record** (one in each partition of a
  changelog or append topic, at the swap: :mod:`phases._internal.topics.swap_publish`) also carries
  ``phases.boundary``, the generation that serves from it on.

Encoding runs in Spark (``to_json``); the driver collects the encoded rows as Arrow (keys and values only: about
100 MB for a million results of this size) and hands them to the producer
(:class:`phases._internal.topics.transactions.TopicWriter`), whose one transaction a write needs one client.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from phases._internal.topics.transactions import Record

if TYPE_CHECKING:
    from phases._internal.topics.registered_records import RegisteredRecords

# Spark's JSON writer options of the format above.
JSON_OPTIONS = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "dateFormat": "yyyy-MM-dd",
    "timeZone": "UTC",
    "ignoreNullFields": "false",
}
KEY, VALUE = "_kafka_key", "_kafka_value"
HEADER_PIPELINE, HEADER_HANDOFF, HEADER_BATCH = "phases.pipeline", "phases.handoff", "phases.batch"


def encoded(
    df: DataFrame,
    key_columns: Sequence[str],
    *,
    tombstone: str | None = None,
    registered: RegisteredRecords | None = None,
) -> DataFrame:
    """``df`` as two binary columns: the key of ``key_columns`` and the value of every column (less ``tombstone``, a
    boolean column: where true, the value is null, a tombstone), as JSON, or with ``registered`` (Avro or Protobuf)
    in the Confluent wire format (:mod:`phases._internal.topics.record_formats`)."""
    columns = [c for c in df.columns if c != tombstone]
    if registered is not None:
        key, value = registered.key_and_value(df, columns, list(key_columns))
    else:
        value = F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns]), JSON_OPTIONS).cast("binary")
        key = F.to_json(F.struct(*[F.col(f"`{c}`") for c in key_columns]), JSON_OPTIONS).cast("binary")
    if tombstone is not None:
        value = F.when(F.col(f"`{tombstone}`"), F.lit(None).cast("binary")).otherwise(value)
    return df.select(key.alias(KEY), value.alias(VALUE))


def headers(pipeline: str, handoff: str, batch: int) -> tuple[tuple[str, bytes], ...]:
    return (
        (HEADER_PIPELINE, pipeline.encode()),
        (HEADER_HANDOFF, handoff.encode()),
        (HEADER_BATCH, str(batch).encode()),
    )


def records(encoded_df: DataFrame, header: tuple[tuple[str, bytes], ...]) -> Iterator[Record]:
    """The records of an :func:`encoded` frame, collected to the driver as Arrow."""
    for batch in encoded_df.toArrow().to_batches():
        keys, values = batch.column(KEY).to_pylist(), batch.column(VALUE).to_pylist()
        for key, value in zip(keys, values, strict=True):
            yield Record(key, value, header)
