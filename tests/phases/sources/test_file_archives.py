"""The files users have, as a hybrid source's archive: Parquet written by pandas (nanosecond timestamps, pyarrow's
default) and by pyarrow in microseconds, Parquet written by Spark, JSON lines; with and without the records' Kafka
positions. Each reads back exactly (event times to the microsecond); a nanosecond value that is not a whole
microsecond is a SourceError naming the file, the column and the unit."""

from __future__ import annotations

import json
import uuid

import pandas as pd
import pytest

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import HybridSource, KafkaHandoff, KafkaSource
from phases._internal.errors import SourceError
from phases._internal.live.runner import LiveRunner
from phases._internal.sources.hybrid import HybridArchiveSource
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import EPOCH, assert_results_equal, produce, sink_rows, us_of
from tests.phases.sources.test_kafka_source import VALUE_SCHEMA, chunk_versions

S = 1_000_000
DELAY_S = 15
# (partition, offset) -> (key, event time µs after 2026-01-01 with sub-second digits, value): two files, offsets 0..3.
FILES = [
    {(0, 0): ("a", 100 * S + 123_456, 1), (0, 1): ("b", 101 * S + 7, 2)},
    {(0, 2): ("a", 103 * S + 999_999, 3), (0, 3): ("c", 104 * S, 4)},
]
WRITERS = ["pandas (ns)", "pyarrow (us)", "spark", "json lines"]


def _frame(rows: dict, positions: bool) -> pd.DataFrame:
    data = {
        "key": [k for k, _, _ in rows.values()],
        "ts": pd.to_datetime(
            [us for _, us, _ in rows.values()], unit="us", origin=pd.Timestamp(EPOCH.replace(tzinfo=None))
        ),
        "value": [v for _, _, v in rows.values()],
    }
    if positions:
        data["kafka_partition"] = [p for p, _ in rows]
        data["kafka_offset"] = [o for _, o in rows]
    frame = pd.DataFrame(data)
    frame["ts"] = frame["ts"].astype("datetime64[ns]")  # pandas' own unit: what df.to_parquet() writes by default
    return frame


def _write(spark, folder, writer: str, positions: bool, files=FILES) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(files):
        frame = _frame(rows, positions)
        target = folder / f"part-{i:05d}.{'json' if writer == 'json lines' else 'parquet'}"
        if writer == "pandas (ns)":
            frame.to_parquet(target)  # pandas' defaults: TIMESTAMP(NANOS)
        elif writer == "pyarrow (us)":
            frame.to_parquet(target, coerce_timestamps="us")
        elif writer == "json lines":
            frame["ts"] = frame["ts"].map(lambda t: t.isoformat() + "Z")
            target.write_text("\n".join(json.dumps(r) for r in frame.to_dict(orient="records")) + "\n")
        else:
            spark_dir = folder / f"_spark{i}"
            spark.createDataFrame(frame).coalesce(1).write.parquet(str(spark_dir))
            (spark_dir / next(n.name for n in spark_dir.iterdir() if n.name.endswith(".parquet"))).rename(target)


def _spec(archive, fmt: str, topic: str, servers: str, positions: bool, offsets: dict) -> HybridSource:
    columns = {"archive_partition_column": "kafka_partition", "archive_offset_column": "kafka_offset"}
    return HybridSource(
        backlog={"kind": "files", "path": str(archive), "format": fmt},
        live=KafkaSource(topic=topic, bootstrap_servers=servers, value_schema=VALUE_SCHEMA),
        handoff=KafkaHandoff(offsets=offsets),
        **(columns if positions else {}),
    )


def _rows(df) -> list[tuple]:
    return sorted((r["key"], us_of(r["ts"]), r["value"], r["_commit_version"]) for r in df.collect())


def test_every_archive_file_kind_reads_exactly_with_and_without_kafka_positions(spark, kafka, tmp_path):
    topic = f"archive-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    produce(kafka.bootstrap_servers, topic, [(0, row) for rows in FILES for row in rows.values()])
    for writer in WRITERS:
        for positions in (True, False):
            archive = tmp_path / f"{writer.split()[0]}-{positions}"
            _write(spark, archive, writer, positions)
            fmt = "json" if writer == "json lines" else "parquet"
            # With positions the handoff cuts inside the archive (offset 3 goes live); without, it is where it ends.
            cut = 3 if positions else 4
            spec = _spec(archive, fmt, topic, kafka.bootstrap_servers, positions, {0: cut})
            source = HybridArchiveSource(spark, spec, spec.backlog.path, spec.live.bootstrap_servers)
            source.require_change_feed(source.head_version())
            got = _rows(source.read_backlog(source.head_version()))
            want = sorted(
                (k, us, v, version)
                for version, rows in enumerate(FILES)
                for (_, offset), (k, us, v) in rows.items()
                if offset < cut
            )
            assert got == want, (writer, positions)


def test_a_nanosecond_value_that_is_no_whole_microsecond_names_the_file_column_and_unit(spark, kafka, tmp_path):
    topic = f"archive-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    archive = tmp_path / "archive"
    _write(spark, archive, "pandas (ns)", False, files=FILES[:1])
    frame = _frame(FILES[1], False)
    frame.loc[1, "ts"] = frame.loc[1, "ts"] + pd.Timedelta(nanoseconds=1)
    frame.to_parquet(archive / "part-00001.parquet")
    spec = _spec(archive, "parquet", topic, kafka.bootstrap_servers, False, {0: 0})
    source = HybridArchiveSource(spark, spec, spec.backlog.path, spec.live.bootstrap_servers)
    with pytest.raises(SourceError) as err:
        source.read_backlog(source.head_version())
    msg = str(err.value)
    assert "part-00001.parquet" in msg and "column 'ts'" in msg and "nanoseconds" in msg
    assert "1767225704000000001 ns" in msg


def test_a_pandas_archive_taken_whole_then_the_topic_equals_the_reference(spark, kafka, tmp_path):
    """The README's "archive taken whole" case (no position columns) used to fail at construction with pyspark's
    AssertionError, and a pandas-written archive at the backlog's first read."""
    topic = f"archive-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    live = [(0, ("a", 120 * S, 10)), (0, ("d", 90 * S, 11)), (0, ("e", 125 * S + 5, 12))]  # "d" is late
    archive = tmp_path / "archive"
    _write(spark, archive, "pandas (ns)", False)
    positions = produce(kafka.bootstrap_servers, topic, live)
    p = make_pipeline(
        _spec(archive, "parquet", topic, kafka.bootstrap_servers, False, {0: 0}), str(tmp_path / "run"), delay_s=DELAY_S
    )
    BacklogRunner(spark, p).run()
    runner = LiveRunner.from_manifest(spark, p)
    runner.start(available_now=True)
    versions = {i: list(rows.values()) for i, rows in enumerate(FILES)}
    versions.update(chunk_versions(runner.arrival_chunks(), dict(zip(positions, [r for _, r in live], strict=True))))
    expected, _ = reference.run(versions, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
