"""The engine's empty tables (sink, quarantine, state, changelog, a demo source) are created by one ``CREATE TABLE``
commit, not by writing an empty DataFrame (a Spark job and a data file). The table must be the one the write made:
the same schema (every column nullable, at every depth) and the same properties."""

from __future__ import annotations

import json
import shutil

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.handoff import manifest
from phases._internal.sources import feed
from phases._internal.storage import tables

LEAF = T.StructType([T.StructField("y", T.IntegerType(), False)])
INNER = T.StructType(
    [T.StructField("x", T.LongType(), False), T.StructField("m", T.MapType(T.StringType(), LEAF, False))]
)
SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType(), False),
        T.StructField("s", INNER, False),
        T.StructField("a", T.ArrayType(INNER, False), False),
        T.StructField("ts", T.TimestampType(), True, {"comment": "event time"}),
    ]
)


def _metadata(path) -> dict:
    """The metaData action of the table's first commit."""
    first = sorted((path / "_delta_log").glob("*.json"))[0]
    return next(json.loads(line)["metaData"] for line in first.read_text().splitlines() if '"metaData"' in line)


def test_an_empty_table_is_created_as_an_empty_write_would_create_it(spark, tmp_path):
    written, created = tmp_path / "written", tmp_path / "created"
    properties = {"delta.checkpointInterval": "100", "delta.enableChangeDataFeed": "true"}
    writer = spark.createDataFrame([], SCHEMA).write.format("delta").mode("ignore")
    for key, value in properties.items():
        writer = writer.option(key, value)
    writer.save(str(written))
    tables.ensure(spark, str(created), SCHEMA, **properties)

    want, got = _metadata(written), _metadata(created)
    assert got["schemaString"] == want["schemaString"]
    assert got["configuration"] == want["configuration"] == properties
    assert not list(created.glob("*.parquet")), "no data file"
    assert tables.version(spark, str(created)) == 0 and spark.read.format("delta").load(str(created)).count() == 0

    tables.ensure(spark, str(created), SCHEMA)  # there: nothing happens
    assert tables.version(spark, str(created)) == 0


def test_a_table_whose_every_commit_was_removed_is_created_again(spark, tmp_path):
    """Restoring a table from a backup taken before its first commit leaves a ``_delta_log`` folder without commits:
    Delta's create-if-missing takes that folder for a table and fails with ``DELTA_TABLE_NOT_FOUND``."""
    path = tmp_path / "t"
    tables.ensure(spark, str(path), SCHEMA)
    assert spark.read.format("delta").load(str(path)).count() == 0  # the session caches the table's log
    spark.read.format("delta").load(str(path)).unionByName(
        spark.sql("SELECT 'k' AS key").select("key"), allowMissingColumns=True
    ).write.format("delta").mode("append").save(str(path))
    assert spark.read.format("delta").load(str(path)).count() == 1
    for commit in (path / "_delta_log").iterdir():
        if commit.is_file():
            commit.unlink()
    for data in path.glob("*.parquet"):
        data.unlink()
    assert not tables.exists(spark, str(path))
    tables.ensure(spark, str(path), SCHEMA)
    assert tables.version(spark, str(path)) == 0 and spark.read.format("delta").load(str(path)).count() == 0


def test_a_table_whose_log_was_removed_with_its_data_files_left_is_created_beside_them(spark, tmp_path):
    """Delta refuses to create a table where data files lie without a log (``DELTA_MISSING_DELTA_TABLE``): the new
    table is made by an empty write, holds no row, and the files stay."""
    path = tmp_path / "t"
    tables.ensure(spark, str(path), SCHEMA)
    row = spark.sql("SELECT 'k' AS key")
    reader = spark.read.format("delta")
    reader.load(str(path)).unionByName(row, allowMissingColumns=True).write.format("delta").mode("append").save(
        str(path)
    )
    assert reader.load(str(path)).count() == 1
    shutil.rmtree(path / "_delta_log")
    files = sorted(path.glob("*.parquet"))
    assert files
    tables.ensure(spark, str(path), SCHEMA)
    assert tables.version(spark, str(path)) == 0 and reader.load(str(path)).count() == 0
    assert set(files) <= set(path.glob("*.parquet")), "the files left were deleted"


def test_a_source_created_empty_records_its_change_feed_from_its_first_version_and_is_not_created_twice(
    spark, tmp_path
):
    path = str(tmp_path / "source")
    feed.create_source(spark, path, "key string, ts timestamp, value long")
    feed.append(spark, path, [("a", None, 1)])
    changes = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(path)
    assert [(r["key"], r["_change_type"], r["_commit_version"]) for r in changes.collect()] == [("a", "insert", 1)]
    with pytest.raises(AnalysisException, match="already exists"):
        feed.create_source(spark, path)


def _handoff(manifest_id: str, **fields) -> manifest.HandoffManifest:
    base = dict(
        pipeline="p", fingerprint="f" * 32, state_spec="{}", state_schema_version=1, operator_version=1,
        source_path="/s", source_version=2**40, backlog_max_event_time_us=None, final_watermark_us=None,
        state_path="/state", state_table_version=0, state_rows=3, input_rows=5, aggregated_rows=4, late_rows=1,
        invalid_rows=0, sink_version=1, backlog_seconds=1.5, created_at_us=7,
    )  # fmt: skip
    return manifest.HandoffManifest(manifest_id=manifest_id, **{**base, **fields})


def test_a_log_row_is_appended_as_a_row_of_its_schema_would_be_written(spark, tmp_path):
    """The log tables' one-row appends (manifests, slice and step logs) are made of literals, not of a shipped Python
    row: the table, its schema and its rows must be what writing the row itself makes."""
    rows = [
        _handoff("m1"),  # the optional fields null
        _handoff("m2", base_manifest_id="m1", backlog_max_event_time_us=9, source_position="{}", sink_rows=3),
        # Text a SQL literal would have to quote and escape, the extremes of the numbers
        _handoff(
            "m3",
            base_manifest_id="m2",
            source_position='{"it\'s": "a \\\\ b\\n", "ü": "€ \U0001f600"}',
            source_path="s3a://b/it's ; -- x",
            final_watermark_us=-(2**63),
            sink_rows=2**63 - 1,
            backlog_seconds=float("inf"),
        ),
    ]
    appended, written = tmp_path / "appended", tmp_path / "written"
    for row in rows:
        manifest.write(spark, str(appended), row)
        values = row.model_dump()
        spark.createDataFrame([tuple(values[f.name] for f in manifest.SCHEMA.fields)], manifest.SCHEMA).write.format(
            "delta"
        ).mode("append").save(str(written))

    assert _metadata(appended)["schemaString"] == _metadata(written)["schemaString"]
    got = spark.read.format("delta").load(str(appended)).collect()
    assert sorted((manifest.HandoffManifest(**r.asDict()) for r in got), key=lambda m: m.manifest_id) == rows
    assert manifest.latest(spark, str(appended), "p") == rows[2]
    assert tables.version(spark, str(appended)) == 2  # one commit a row, the first creates the table
    assert len(list(appended.glob("*.parquet"))) == 3  # one file a row


def _commit_infos(path) -> list[dict]:
    """The commitInfo of each commit of the table's log, oldest first."""
    return [
        next(json.loads(line)["commitInfo"] for line in commit.read_text().splitlines() if '"commitInfo"' in line)
        for commit in sorted((path / "_delta_log").glob("*.json"))
    ]


def _engines(path) -> list[str]:
    """The engine of each commit of the table's log, oldest first (its commitInfo's engineInfo or clientVersion)."""
    return [str(info.get("engineInfo") or info.get("clientVersion")) for info in _commit_infos(path)]


def _operations(path) -> list[str]:
    """The operation of each commit of the table's log, oldest first."""
    return [str(info.get("operation")) for info in _commit_infos(path)]


def test_a_local_log_row_is_appended_by_delta_rs_without_a_spark_job(spark, tmp_path):
    # Through Spark, a manifest's one-row append was a Spark job, a commit and Delta's snapshot after it: 0.3-0.4 s of a
    # small backlog (benchmarks/profiles/backlog-driver-2026-12-07.txt).
    path = tmp_path / "manifests"
    before = spark_internals.jobs_submitted(spark)
    manifest.write(spark, str(path), _handoff("m1"))
    manifest.write(spark, str(path), _handoff("m2", base_manifest_id="m1"))
    assert spark_internals.jobs_submitted(spark) == before
    assert all("delta-rs" in engine for engine in _engines(path)), _engines(path)
    assert manifest.latest(spark, str(path), "p") == _handoff("m2", base_manifest_id="m1")


def test_a_log_table_spark_wrote_takes_rows_from_delta_rs_and_spark_takes_a_table_delta_rs_cannot_write(
    spark, tmp_path
):
    # A log table an earlier version of the engine wrote through Spark: delta-rs appends to it, Spark reads both rows.
    older = tmp_path / "older"
    tables._append_row_through_spark(spark, str(older), manifest.SCHEMA, _handoff("m1").model_dump())
    manifest.write(spark, str(older), _handoff("m2", base_manifest_id="m1"))
    engines = _engines(older)
    assert "delta-rs" not in engines[0] and "delta-rs" in engines[1], engines
    assert manifest.latest(spark, str(older), "p") == _handoff("m2", base_manifest_id="m1")
    assert spark.read.format("delta").load(str(older)).count() == 2
    # Tables delta-rs 1.6.6 refuses (writer features it lacks, column mapping with a column added): through Spark.
    for i, feature in enumerate(
        (
            "'delta.enableRowTracking' = 'true'",
            "'delta.enableInCommitTimestamps' = 'true'",
            "'delta.columnMapping.mode' = 'name'",
        )
    ):
        featured = tmp_path / f"featured{i}"
        tables._append_row_through_spark(spark, str(featured), manifest.SCHEMA, _handoff("m1").model_dump())
        spark.sql(f"ALTER TABLE delta.`{featured}` SET TBLPROPERTIES ({feature})")
        commits = len(_engines(featured))
        manifest.write(spark, str(featured), _handoff("m2", base_manifest_id="m1"))
        assert len(_engines(featured)) == commits + 1 and "delta-rs" not in _engines(featured)[-1], feature
        assert manifest.latest(spark, str(featured), "p") == _handoff("m2", base_manifest_id="m1")


def test_a_delta_rs_error_after_its_commit_leaves_the_row_once_and_one_before_it_leaves_it_to_spark(
    spark, tmp_path, monkeypatch
):
    import deltalake
    from deltalake.exceptions import DeltaError

    real = deltalake.write_deltalake

    def commits_then_fails(*args, **kwargs):
        real(*args, **kwargs)
        raise DeltaError("a post-commit step failed")

    def fails_before_committing(*args, **kwargs):
        raise DeltaError("refused")

    path = tmp_path / "log"
    monkeypatch.setattr(deltalake, "write_deltalake", commits_then_fails)
    manifest.write(spark, str(path), _handoff("m1"))
    assert len(_engines(path)) == 1 and "delta-rs" in _engines(path)[0]  # written once, not again through Spark
    assert tables.ROW_TOKEN in next(iter(sorted((path / "_delta_log").glob("*.json")))).read_text()
    monkeypatch.setattr(deltalake, "write_deltalake", fails_before_committing)
    manifest.write(spark, str(path), _handoff("m2", base_manifest_id="m1"))
    assert len(_engines(path)) == 2 and "delta-rs" not in _engines(path)[1]  # through Spark
    got = sorted(r["manifest_id"] for r in spark.read.format("delta").load(str(path)).collect())
    assert got == ["m1", "m2"]
