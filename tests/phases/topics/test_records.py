"""The result topic's record format (:mod:`phases._internal.topics.records`), through Spark's encoder, the real
broker and a read_committed consumer: every type comes back exact (microsecond timestamps in UTC, decimals with their
digits and scale, nulls kept), keys are the key columns, a tombstone is a null value, headers name the write."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

from phases._internal.topics import records
from phases._internal.topics.reading import fold_upsert, read_committed
from phases._internal.topics.transactions import Marker, TopicWriter

SCHEMA = (
    "key string, n bigint, total decimal(38,9), ts timestamp, day date, ratio double, tags array<string>, gone boolean"
)


def test_every_type_comes_back_exact_and_a_tombstone_removes_its_key(spark, kafka):
    rows = [
        ("a", 2**62, Decimal("12345678901234567890123456789.123456789"), datetime(2026, 1, 1, 0, 0, 59, 123456,
         tzinfo=UTC), date(2026, 1, 1), 0.1, ["x", None], False),
        ("b", None, Decimal("1.100000000"), None, None, None, None, False),
        ("c", -1, Decimal("0E-9"), datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), date(1900, 2, 28),
         -2.5e300, [], True),
    ]  # fmt: skip
    df = spark.createDataFrame(rows, SCHEMA)
    topic = f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    writer = TopicWriter(kafka.bootstrap_servers, topic, "events")
    try:
        frame = records.encoded(df, ["key"], tombstone="gone")
        header = records.headers("events", "h1", 4)
        assert writer.write(records.records(frame, header), Marker(4, "h1")) == 3
    finally:
        writer.close()
    read = list(read_committed(kafka.bootstrap_servers, topic))
    assert sorted(r.key for r in read) == [b'{"key":"a"}', b'{"key":"b"}', b'{"key":"c"}']
    assert all(r.headers == {"phases.pipeline": b"events", "phases.handoff": b"h1", "phases.batch": b"4"} for r in read)
    current = {json.loads(k)["key"]: json.loads(v, parse_float=Decimal) for k, v in fold_upsert(read).items()}
    assert set(current) == {"a", "b"}  # c's value is a tombstone
    assert current["a"] == {
        "key": "a",
        "n": 2**62,
        "total": Decimal("12345678901234567890123456789.123456789"),
        "ts": "2026-01-01T00:00:59.123456Z",
        "day": "2026-01-01",
        "ratio": Decimal("0.1"),
        "tags": ["x", None],
    }
    assert current["b"] == {"key": "b", "n": None, "total": Decimal("1.100000000"), "ts": None, "day": None,
                            "ratio": None, "tags": None}  # fmt: skip
    assert str(current["b"]["total"]) == "1.100000000"  # the scale travels with the digits
    [tombstone] = [r for r in read if r.key == b'{"key":"c"}']
    assert tombstone.value is None
