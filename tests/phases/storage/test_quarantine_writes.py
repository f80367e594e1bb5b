"""The quarantine's writes through delta-rs (a local table, few rows) and through Spark leave the same table: a
backlog's rows replace the earlier ones in one commit, a live micro-batch's go in once by Delta's transaction id."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import Row, SparkSession
from pytest import MonkeyPatch

from phases._internal.storage import quarantine, table_stats, tables
from tests.helpers import spark_jobs

pytestmark = pytest.mark.spark

UTC = dt.UTC
LATE = quarantine.LATE_REASON


def _row(pipeline: str, phase: str, version: int, reason: str, n: int) -> Row:
    return Row(
        pipeline=pipeline,
        phase=phase,
        batch_id=None if phase == "backlog" else n,
        source_version=version,
        reason=reason,
        event_time=dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=n * 1_001),
        watermark=dt.datetime(2026, 1, 2, tzinfo=UTC),
        record=f'{{"n": {n}, "text": "é\\u0000"}}',
        kafka_topic="t" if n % 2 else None,
        kafka_partition=n % 3 if n % 2 else None,
        kafka_offset=n if n % 2 else None,
    )


def _frame(spark: SparkSession, rows: list[Row]):
    return spark.createDataFrame(rows, quarantine.SCHEMA)


def _table(spark: SparkSession, path: str) -> list[tuple]:
    """The table's rows as Spark reads them, in a fixed order."""
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())


def _calls(spark: SparkSession, jobs: list[int]) -> set[str]:
    """What started the jobs' stages (Spark's call site: ``toArrow``, ``collect``, ``save``, ...)."""
    tracker = spark.sparkContext.statusTracker()
    return {
        tracker.getStageInfo(stage).name.split(" at ")[0]  # pyright: ignore[reportOptionalMemberAccess]
        for job in jobs
        for stage in tracker.getJobInfo(job).stageIds  # pyright: ignore[reportOptionalMemberAccess]
    }


def _replace(spark, path, rows, versions, right_input, *, through_spark: bool, monkeypatch) -> None:
    with monkeypatch.context() as m:
        if through_spark:
            m.setattr(tables, "DELTA_RS_MAX_ROWS", -1)
        quarantine.replace_backlog(
            spark,
            path,
            "orders",
            _frame(spark, rows),
            versions,
            empty=not rows,
            right_input=right_input,
            rows=len(rows),
        )


replaces = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["late", "invalid", "right input: late"])), max_size=6),
        st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(3, 5))),
        st.sampled_from([None, True, False]),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replaces=replaces, live_first=st.booleans())
def test_replacing_through_delta_rs_leaves_the_table_spark_replace_where_leaves(
    spark, tmp_path_factory, monkeypatch, replaces, live_first
):
    """Random replaces (rows of some versions and reasons; all versions or a range; one input of two or both), each
    over a table that may hold another pipeline's rows and live rows: delta-rs' table equals Spark's."""
    root = tmp_path_factory.mktemp("replace")
    paths = {way: str(root / way) for way in ("delta_rs", "spark")}
    for through_spark, path in ((False, paths["delta_rs"]), (True, paths["spark"])):
        if live_first:  # the live phase made the table (Spark), with rows replaces must keep
            kept = [_row("orders", "live", 1, "late", 1), _row("clicks", "backlog", 2, "late", 2)]
            _frame(spark, kept).write.format("delta").mode("append").save(path)
        for n, (made, versions, right_input) in enumerate(replaces, start=1):
            rows = []
            for i, (version, reason) in enumerate(made):
                if versions is not None:
                    version = min(max(version, versions[0]), versions[1])
                right = quarantine.RIGHT_INPUT_REASON
                if right_input is True and not reason.startswith(right):
                    reason = right + reason
                elif right_input is False and reason.startswith(right):
                    reason = reason[len(right) :]
                rows.append(_row("orders", "backlog", version, reason, n * 100 + i))
            _replace(spark, path, rows, versions, right_input, through_spark=through_spark, monkeypatch=monkeypatch)
    if not tables.exists(spark, paths["spark"]):
        assert not tables.exists(spark, paths["delta_rs"])
        return
    assert _table(spark, paths["delta_rs"]) == _table(spark, paths["spark"])
    assert (
        spark.read.format("delta").load(paths["delta_rs"]).schema
        == spark.read.format("delta").load(paths["spark"]).schema
    )


def test_a_backlog_rerun_replaces_its_few_quarantine_rows_in_one_commit_without_a_spark_write(spark, tmp_path):
    """The first run's rows create the table, a rerun's replace them and keep the live rows; the only Spark job of
    each is the collect of the rows themselves, and each is one commit."""
    path = str(tmp_path / "quarantine")
    first = _frame(spark, [_row("orders", "backlog", v, LATE, v) for v in range(3)]).persist()
    with spark_jobs(spark, "first run") as jobs:
        assert quarantine.replace_all_backlog(spark, path, "orders", first, empty=False) == (3, 0, 0)
    assert _calls(spark, jobs) == {"collect", "toArrow"}  # the counts, the rows collected: no snapshot, no write
    live = _frame(spark, [_row("orders", "live", 9, LATE, 9)])
    live.write.format("delta").mode("append").save(path)  # the live phase's append (Spark)
    rerun = _frame(spark, [_row("orders", "backlog", 1, LATE, 11), _row("orders", "backlog", 2, "x: bad", 12)])
    with spark_jobs(spark, "rerun") as jobs:
        assert quarantine.replace_all_backlog(spark, path, "orders", rerun, empty=False) == (1, 1, 0)
    assert _calls(spark, jobs) == {"collect", "toArrow"}
    assert [(r.phase, r.record) for r in spark.read.format("delta").load(path).orderBy("record").collect()] == [
        ("backlog", _row("orders", "backlog", 1, LATE, 11).record),
        ("backlog", _row("orders", "backlog", 2, "x: bad", 12).record),
        ("live", _row("orders", "live", 9, LATE, 9).record),
    ]
    from deltalake import DeltaTable

    operations = [h["operation"] for h in DeltaTable(path).history()]
    assert operations == ["WRITE", "WRITE", "WRITE"], operations  # create, the live append, the replace
    # Nothing quarantined in a third run: the backlog's rows go (a delete through delta-rs), the live row stays.
    with spark_jobs(spark, "nothing") as jobs:
        assert quarantine.replace_all_backlog(spark, path, "orders", rerun.limit(0), empty=True) == (0, 0, 0)
    assert jobs == []
    assert [r.phase for r in spark.read.format("delta").load(path).collect()] == ["live"]


def test_a_table_delta_rs_does_not_write_is_replaced_through_spark(spark, tmp_path, caplog):
    """Row tracking is a writer feature deltalake 1.6.6 lacks: it refuses before committing, and Spark replaces."""
    path = str(tmp_path / "quarantine")
    tables.create(spark, path, quarantine.SCHEMA, **{"delta.enableRowTracking": "true"})
    _frame(spark, [_row("orders", "backlog", 1, "late", 1)]).write.format("delta").mode("append").save(path)
    rows = _frame(spark, [_row("orders", "backlog", 2, "late", 2)])
    with caplog.at_level("INFO", logger=quarantine.__name__):
        quarantine.replace_backlog(spark, path, "orders", rows, rows=1)
    assert "replaced through Spark, delta-rs does not" in caplog.text
    assert [r.source_version for r in spark.read.format("delta").load(path).collect()] == [2]


def test_a_live_quarantine_append_through_delta_rs_is_skipped_on_replay_by_either_writer(spark, tmp_path):
    """A micro-batch's quarantine rows go in once through delta-rs with Delta's transaction id: a replay is skipped
    by delta-rs and by Spark's ``txnAppId`` check alike, an empty batch still records its id, and no Spark job reads
    the table's state for the check."""
    path = str(tmp_path / "quarantine")
    quarantine.ensure(spark, path)
    rows = _frame(spark, [_row("orders", "live", 4, LATE, n) for n in range(3)])
    with spark_jobs(spark, "append") as jobs:
        tables.append_once(rows, path, "orders:run:quarantine", 7)
    assert _calls(spark, jobs) == {"toArrow"}
    tables.append_once(rows, path, "orders:run:quarantine", 7)  # a replay, through delta-rs
    with MonkeyPatch.context() as m:
        m.setattr(tables, "DELTA_RS_MAX_ROWS", -1)
        tables.append_once(rows, path, "orders:run:quarantine", 7)  # a replay, through Spark
    tables.append_once(rows.limit(0), path, "orders:run:quarantine", 8)
    assert _table(spark, path) == sorted(tuple(r) for r in rows.collect())
    from deltalake import DeltaTable

    assert DeltaTable(path).transaction_version("orders:run:quarantine") == 8
    assert table_stats.transaction_versions_through_spark(spark, path, ["orders:run:quarantine"]) == {
        "orders:run:quarantine": 8
    }
    # Spark's append of the next batch after delta-rs' commits, and delta-rs' after Spark's.
    with MonkeyPatch.context() as m:
        m.setattr(tables, "DELTA_RS_MAX_ROWS", -1)
        tables.append_once(rows, path, "orders:run:quarantine", 9)
    tables.append_once(rows, path, "orders:run:quarantine", 9)
    assert spark.read.format("delta").load(path).count() == 6
