"""Test helpers: write event versions to a source table, read sinks and quarantine back as Python."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from deltalake import DeltaTable
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from phases._internal.sources import synthetic
from tests.reference import FAR_FUTURE_US, Row

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

# A child process a test starts for one short job (a crash test's backlog or live phase, a Dagster run) pays
# the JVM's warm-up: most of its CPU goes to the C2 compiler for code that then runs a handful of times. The C1
# compiler alone halves that child's CPU (40 -> 22 CPU seconds for a live phase killed in its first micro-batch,
# benchmarks/profiles/short-lived-jvms-2026-11-27.txt); a test's own long-lived JVM keeps both (C1 alone doubles a
# property test's time). What runs is unchanged: only when and how the JVM compiles bytecode. C1 alone also shrinks
# the JVM's default code cache from 240 MB to 48 MB, which a Dagster run that builds a generation and then runs its
# live phase filled ("VirtualMachineError: Out of space in CodeCache for adapters" failed its live query): the
# tiered default is kept.
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
SHORT_LIVED_JVM_CONF = {"spark.driver.extraJavaOptions": SHORT_LIVED_JVM_OPTIONS}


def ts(us: int | None) -> datetime | None:
    return None if us is None else EPOCH + timedelta(microseconds=us)


def us_of(value: datetime | str | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - EPOCH) // timedelta(microseconds=1)


def create_source(spark: SparkSession, path: str) -> None:
    synthetic.create_source(spark, path)


_EPOCH_US = (EPOCH - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _sql_literal(value: str | int | None, sql_type: str) -> str:
    if value is None:
        return f"CAST(NULL AS {sql_type})"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(int(value))


def event_frame(spark: SparkSession, rows: list[Row]) -> DataFrame:
    """``rows`` as a DataFrame of :data:`synthetic.EVENT_SCHEMA`, from an inline table of literals: a local relation
    that runs no Python-fed task (``spark.createDataFrame`` of a list parallelizes it, a job of its own)."""
    if not rows:
        return spark.createDataFrame([], synthetic.EVENT_SCHEMA)
    values = ", ".join(
        f"({_sql_literal(k, 'STRING')}, "
        f"{'CAST(NULL AS TIMESTAMP)' if t is None else f'TIMESTAMP_MICROS({_EPOCH_US + t})'}, "
        f"{_sql_literal(v, 'BIGINT')})"
        for k, t, v in rows
    )
    frame = spark.sql(f"SELECT * FROM VALUES {values} AS events(key, ts, value)")
    return frame.select(*(frame[f.name].cast(f.dataType).alias(f.name) for f in synthetic.EVENT_SCHEMA.fields))


def append_version(spark: SparkSession, path: str, rows: list[Row], files: int = 1) -> None:
    """Commits ``rows`` as one source version, written as up to ``files`` data files."""
    df = event_frame(spark, rows)
    synthetic.append(spark, path, df.repartition(files) if files > 1 else df.coalesce(1))


def table_rows(spark: SparkSession, path: str) -> list[dict]:
    """A small Delta table's rows as dicts, read with delta-rs (an independent reader, and no Spark job competing
    with the runs under test); timestamps as naive UTC datetimes, as Spark's ``collect`` gives them here. Through
    Spark when delta-rs cannot read the table whole (deletion vectors, a feature it lacks)."""
    try:
        table = DeltaTable(path)
        if "deletionVectors" in (table.protocol().reader_features or []):
            raise ValueError("deletion vectors")
        found = table.to_pyarrow_table().to_pylist()
    except Exception:  # noqa: BLE001  (any reason delta-rs cannot: Spark reads it)
        return [r.asDict() for r in spark.read.format("delta").load(path).collect()]
    return [{c: _naive(v) for c, v in row.items()} for row in found]


def _naive(value):
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def sink_rows(spark: SparkSession, path: str) -> dict[str, dict]:
    out = {}
    for d in table_rows(spark, path):
        out[d.pop("key")] = d
    return out


def current_rows(spark: SparkSession, pipeline) -> dict[str, dict]:
    """A changelog sink's latest row per key (:func:`phases._internal.storage.changelog.read_current`), by key."""
    from phases._internal.storage.changelog import read_current

    out = {}
    for r in read_current(spark, pipeline).collect():
        d = r.asDict()
        out[d.pop("key")] = d
    return out


def quarantine_rows(spark: SparkSession, root: str) -> list[tuple[int, Row, str]]:
    """(source version, (key, ts µs, value), reason) of every quarantined record, sorted (none when no
    record was ever quarantined: the backlog creates the table with its first row)."""
    from phases._internal.storage import tables

    rows = []
    if not tables.exists(spark, f"{root}/quarantine"):
        return rows
    for r in table_rows(spark, f"{root}/quarantine"):
        rec = json.loads(r["record"])
        rows.append((r["source_version"], (rec.get("key"), us_of(rec.get("ts")), rec.get("value")), r["reason"]))
    return sorted(rows, key=repr)


def assert_results_equal(actual: dict[str, dict], expected: dict[str, dict]) -> None:
    assert set(actual) == set(expected), f"keys differ: {set(actual) ^ set(expected)}"
    for key, want in expected.items():
        got = actual[key]
        for col, value in want.items():
            if isinstance(value, float):
                assert got[col] is not None and abs(got[col] - value) < 1e-9, (key, col, got[col], value)
            else:
                assert got[col] == value, (key, col, got[col], value)


def backdate_commits(path: str, when: dict[int, datetime]) -> None:
    """Gives source versions the commit times ``when`` (test data spread over several days).

    Without in-commit timestamps (off by default), Delta takes a commit's time from its log file's
    modification time, so setting that time is how a table written over days looks.
    """
    import os

    for version, at in when.items():
        stamp = at.timestamp()
        os.utime(f"{path}/_delta_log/{version:020d}.json", (stamp, stamp))


@contextmanager
def spark_jobs(spark: SparkSession, description: str) -> Iterator[list[int]]:
    """The ids of the Spark jobs the block starts in this thread (in a job group of its own), filled when it ends."""
    sc, group = spark.sparkContext, f"jobs-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, description)
    ran: list[int] = []
    try:
        yield ran
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # pyright: ignore[reportArgumentType]
        sc.setJobDescription(None)  # pyright: ignore[reportArgumentType]
        ran.extend(sc.statusTracker().getJobIdsForGroup(group))


def write_source(spark: SparkSession, path: str, versions: dict[int, list[Row]], files: int = 1) -> None:
    """A fresh source table whose versions 1..n hold ``versions`` (version 0 is the empty table)."""
    create_source(spark, path)
    for v in sorted(versions):
        append_version(spark, path, versions[v], files)


def assert_grouped_by_key(partitions: list[list]) -> None:
    """Each key (first field of a row) is one contiguous run in exactly one partition."""
    owner: dict = {}
    for index, rows in enumerate(partitions):
        keys = [r[0] for r in rows]
        runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
        assert len(runs) == len(set(runs)), f"partition {index}: a key appears in two runs: {runs}"
        for k in runs:
            assert owner.setdefault(k, index) == index, f"key {k!r} in partitions {owner[k]} and {index}"


def crash_on_state_write(monkeypatch, message: str) -> None:
    """Makes the live phase's next replacement of its keys' rows in the state store (a process function's, an interval
    join's) raise ``RuntimeError(message)``; everything written before it in the micro-batch is committed.
    ``monkeypatch.undo()`` ends it."""
    from phases._internal.state.keyed_store import RowStateStore

    def crash_before_store_write(self, rows, version):
        raise RuntimeError(message)

    monkeypatch.setattr(RowStateStore, "replace", crash_before_store_write)


def produce(
    bootstrap_servers: str,
    topic: str,
    records: list[tuple[int, Row | bytes | None]],
    settings: dict[str, str] | None = None,
) -> list[tuple[int, int]]:
    """Produces ``(partition, record)`` pairs in order (a Row as the JSON value the Kafka tests declare, bytes or
    None as they are) and returns each one's (partition, offset). ``settings``: more librdkafka settings
    (credentials)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap_servers, "log_level": 0, "linger.ms": 0, **(settings or {})})
    positions: list[tuple[int, int] | None] = [None] * len(records)

    def delivered(i):
        def report(err, msg):
            assert err is None, err
            positions[i] = (msg.partition(), msg.offset())

        return report

    for i, (partition, record) in enumerate(records):
        if isinstance(record, tuple):
            key, t, value = record
            when = ts(t)
            record = json.dumps(
                {"key": key, "ts": when.isoformat().replace("+00:00", "Z") if when else None, "value": value}
            ).encode()
        producer.produce(topic, value=record, partition=partition, on_delivery=delivered(i))
        producer.flush()  # one at a time: offsets follow the given order within each partition
    return positions


# --- random event versions for property tests -------------------------------------------------------------------
# A record: key (sometimes null), event time = arrival clock of its version + jitter (sometimes far behind, so some
# records are late; jitter FAR: decades ahead of its commit, quarantined by max_future and never moving the
# watermark), value (sometimes null).
FAR = 11
_RECORD = st.tuples(
    st.one_of(st.sampled_from(["a", "b", "c", "d"]), st.none()),
    st.integers(min_value=-40, max_value=FAR),
    st.one_of(st.integers(min_value=-50, max_value=50), st.none()),
)
EVENT_VERSIONS = st.lists(st.lists(_RECORD, min_size=1, max_size=10), min_size=1, max_size=5)
_SECOND = 1_000_000


def materialize(raw: list[list[tuple]]) -> dict[int, list[Row]]:
    """Version i+1 (version 0 is the empty table) holds raw[i] of :data:`EVENT_VERSIONS`, event times around
    i*20 s."""
    versions = {}
    for i, rows in enumerate(raw):
        clock = (i + 1) * 20 * _SECOND
        versions[i + 1] = [
            (
                None if key is None and j % 2 else key or "a",
                (FAR_FUTURE_US if jitter == FAR else 0) + clock + min(jitter, FAR - 1) * _SECOND,
                value,
            )
            for j, (key, jitter, value) in enumerate(rows)
        ]
    return versions


def remove_newest_commits(path: str, count: int) -> list[int]:
    """Removes the Delta table's newest ``count`` commits, as a restore of its files from a slightly older backup (or
    a careless clean-up) would: each commit's JSON, its hidden checksum files, and a checkpoint past the new head.
    Returns the versions removed."""
    log = f"{path}/_delta_log"
    versions = sorted(int(n.split(".")[0]) for n in os.listdir(log) if n.endswith(".json") and n[:1].isdigit())
    gone = versions[-count:] if count else []
    keep = versions[-count - 1] if len(versions) > count else -1
    for name in os.listdir(log):
        head = name.lstrip(".").split(".")[0]
        if head.isdigit() and int(head) > keep:
            os.remove(f"{log}/{name}")
    for name in ("_last_checkpoint", "._last_checkpoint.crc"):
        if os.path.exists(f"{log}/{name}"):
            os.remove(f"{log}/{name}")
    return gone
