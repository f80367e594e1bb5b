"""A keyed aggregation's changelog sink (``DeltaSink(mode="changelog")``): each live micro-batch appends its
changed keys once; the compacted current table follows outside the micro-batch; ``read_current`` gives the
latest row per key, and it equals the upsert sink's rows at every cut-off, whenever compactions ran."""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import DeltaSink, Window, WindowedAggregate
from phases._internal.errors import DefinitionError
from phases._internal.live.compactor import Compactor
from phases._internal.live.runner import LiveRunner
from phases._internal.placement import Placement
from phases._internal.runtime.session import BACKGROUND_POOL, SCHEDULER_POOL
from phases._internal.storage import changelog
from tests import reference
from tests.conftest import AGGREGATIONS, examples, make_pipeline
from tests.helpers import (
    EVENT_VERSIONS,
    append_version,
    assert_results_equal,
    current_rows,
    materialize,
    sink_rows,
    write_source,
)
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

INVALID = (DefinitionError, ValidationError)


def _changelog_pipeline(source: str, root: str, **sink):
    return make_pipeline(source, root, delay_s=DELAY_S, sink=DeltaSink(path=f"{root}/sink", mode="changelog", **sink))


def _compacted(spark, pipeline) -> dict[str, dict]:
    out = {}
    for r in spark.read.format("delta").load(pipeline.sink.current).collect():
        d = r.asDict()
        for c in (changelog.BATCH_ID, changelog.SOURCE_VERSION, changelog.OP):
            d.pop(c)
        out[d.pop("key")] = d
    return out


@pytest.mark.slow
@settings(max_examples=examples(3), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=EVENT_VERSIONS, cut=st.integers(min_value=0, max_value=4), compactions=st.lists(st.booleans(), max_size=6))
def test_the_changelog_reader_equals_the_upsert_sink_at_every_cut_off(spark, tmp_path, raw, cut, compactions):
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = materialize(raw)
    cutoff = min(cut, len(versions))
    write_source(spark, source, {v: rows for v, rows in versions.items() if v <= cutoff})
    upsert = make_pipeline(source, str(root / "upsert"), delay_s=DELAY_S)
    log = _changelog_pipeline(source, str(root / "changelog"))
    runners = []
    for p in (upsert, log):
        BacklogRunner(spark, p).run()
        runners.append(LiveRunner.from_manifest(spark, p))
    try:
        for r in runners:
            r.start()
        steps = [v for v in sorted(versions) if v > cutoff]
        for i, v in enumerate([None, *steps]):
            if v is not None:
                append_version(spark, source, versions[v])
                for r in runners:
                    r.process_available()
            if i < len(compactions) and compactions[i]:
                changelog.compact_changelog(spark, log)
            applied = {k: rows for k, rows in versions.items() if k <= (v or cutoff)}
            expected = reference.run(applied, DELAY_S * SECOND)[0]
            assert_results_equal(sink_rows(spark, upsert.sink.path), expected)
            assert_results_equal(current_rows(spark, log), expected)
    finally:
        for r in runners:
            r.stop()
    # The changelog holds each micro-batch's changed keys once: one row per key and batch.
    rows = spark.read.format("delta").load(log.sink.path)
    assert rows.count() == rows.select("key", changelog.BATCH_ID).distinct().count()


def test_a_changelog_micro_batch_appends_the_changed_keys_with_batch_source_version_and_op(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, {1: [("a", 100 * SECOND, 1), ("b", 90 * SECOND, 2)]})
    p = _changelog_pipeline(source, str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    append_version(spark, source, [("a", 110 * SECOND, 3), ("c", 120 * SECOND, 4)])
    append_version(spark, source, [("c", 130 * SECOND, 5)])
    live = LiveRunner.from_manifest(spark, p, max_files_per_trigger=1)
    live.start(available_now=True)
    got = sorted(
        (r["key"], r["n"], r["total"], r[changelog.BATCH_ID], r[changelog.SOURCE_VERSION], r[changelog.OP])
        for r in spark.read.format("delta").load(p.sink.path).collect()
    )
    # The handoff's rows (batch -1), then one row per changed key per micro-batch, with the newest source
    # version that changed it; the micro-batches read one version each (one file a trigger).
    first = next(row[3] for row in got if row[3] >= 0)
    assert got == [
        ("a", 1, 1, -1, None, "upsert"),
        ("a", 2, 4, first, 2, "upsert"),
        ("b", 1, 2, -1, None, "upsert"),
        ("c", 1, 4, first, 2, "upsert"),
        ("c", 2, 9, first + 1, 3, "upsert"),
    ]
    current = current_rows(spark, p)
    assert set(current) == {"a", "b", "c"} and (current["c"]["n"], current["c"]["total"]) == (2, 9)


def test_compaction_follows_appends_and_is_rebuilt_after_a_new_handoff(spark, tmp_path):
    source = str(tmp_path / "source")
    backlog = {1: [("a", 100 * SECOND, 1), ("b", 90 * SECOND, 2)]}
    write_source(spark, source, backlog)
    p = _changelog_pipeline(source, str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    first = changelog.compact_changelog(spark, p)
    assert first.rebuilt and first.rows == 2
    assert changelog.compact_changelog(spark, p).rows == 0  # nothing new: nothing merged
    live_versions = {2: [("a", 110 * SECOND, 3), ("c", 120 * SECOND, 4)], 3: [("b", 200 * SECOND, 5)]}
    for v in sorted(live_versions):
        append_version(spark, source, live_versions[v])
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    merged = changelog.compact_changelog(spark, p)
    assert not merged.rebuilt and merged.rows == 3
    expected = reference.run({**backlog, **live_versions}, DELAY_S * SECOND)[0]
    assert_results_equal(_compacted(spark, p), expected)
    # A new backlog over every version rewrites the changelog: the compaction starts over from it.
    append_version(spark, source, [("d", 210 * SECOND, 6)])
    BacklogRunner(spark, p).run(reset=True)
    rebuilt = changelog.compact_changelog(spark, p)
    assert rebuilt.rebuilt
    expected = reference.run({**backlog, **live_versions, 4: [("d", 210 * SECOND, 6)]}, DELAY_S * SECOND)[0]
    assert_results_equal(_compacted(spark, p), expected)
    assert_results_equal(current_rows(spark, p), expected)


def test_a_compaction_run_is_reported_only_once_its_log_checkpoint_is_written(spark, tmp_path, monkeypatch):
    # The compactor once published a run's compaction before tidying the changelog (its log checkpoint), so a
    # reader of ``last`` could look for the checkpoint before it was written (a CI failure of the test below).
    tidied: list[object] = []

    def compact(spark, pipeline):
        return object()

    def slow_tidy(spark, pipeline):
        time.sleep(1)
        tidied.append(compactor.last)

    monkeypatch.setattr(changelog, "compact", compact)
    monkeypatch.setattr(changelog, "tidy", slow_tidy)
    p = _changelog_pipeline(str(tmp_path / "source"), str(tmp_path / "run"), compact_every=timedelta(seconds=0.1))
    compactor = Compactor(spark, Placement(p)).start()
    try:
        deadline = time.monotonic() + 30
        while compactor.last is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert compactor.last is not None, "no compaction run finished in 30 s"
        assert tidied, "the compaction was reported before the changelog's log checkpoint was written"
        assert compactor.runs >= 1 and compactor.last_error is None
    finally:
        compactor.stop()


def test_a_compaction_runs_in_the_scheduler_pool_that_yields_the_task_slots_to_the_micro_batches(
    spark, tmp_path, monkeypatch
):
    # A first compaction of a million keys held both cores for seconds under Spark's FIFO scheduler, and the live
    # phase's versions queued behind it (benchmarks/profiles/live-20k-2026-12-07.txt).
    pools: list[str | None] = []

    def compact(spark_, where):
        pools.append(spark_.sparkContext.getLocalProperty(SCHEDULER_POOL))
        spark_.sparkContext.setJobGroup(group, "the compaction's jobs")
        spark_.range(4).repartition(2).count()  # Spark jobs of the compactor's session, in the thread's pool
        return object()

    monkeypatch.setattr(changelog, "compact", compact)
    monkeypatch.setattr(changelog, "tidy", lambda spark, where: None)
    p = _changelog_pipeline(str(tmp_path / "source"), str(tmp_path / "run"), compact_every=timedelta(seconds=0.1))
    group = f"compaction-{uuid.uuid4().hex}"
    compactor = Compactor(spark, Placement(p)).start()
    try:
        deadline = time.monotonic() + 60
        while compactor.runs < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        compactor.stop()
    assert compactor.runs >= 1 and compactor.last_error is None, compactor.last_error
    assert set(pools) == {BACKGROUND_POOL}
    # Its jobs' stages ran in that pool (Spark's status store, as the UI shows it; a stage a job skipped, its shuffle
    # output reused, keeps the store's "default").
    tracker, store = spark.sparkContext.statusTracker(), spark.sparkContext._jsc.sc().statusStore()
    stage_ids = {i for job in tracker.getJobIdsForGroup(group) for i in tracker.getJobInfo(job).stageIds}
    attempts = [store.lastStageAttempt(i) for i in sorted(stage_ids)]
    ran = [(a.stageId(), a.schedulingPool()) for a in attempts if str(a.status()) != "SKIPPED"]
    assert ran and {pool for _, pool in ran} == {BACKGROUND_POOL}, ran
    # The thread that started the compactor keeps its own pool.
    assert spark.sparkContext.getLocalProperty(SCHEDULER_POOL) is None
    # The session's fair scheduler gives the background pool only the cores the default pool leaves.
    sc = spark.sparkContext._jsc.sc()
    assert sc.getSchedulingMode().toString() == "FAIR"
    found = spark.sparkContext._jvm.scala.jdk.javaapi.CollectionConverters.asJava(sc.getAllPools())
    weights = {pool.name(): (pool.weight(), pool.minShare()) for pool in found}
    assert weights["default"][1] > weights[BACKGROUND_POOL][1] == 0
    assert weights["default"][0] > weights[BACKGROUND_POOL][0]


def test_the_running_live_phase_compacts_in_the_background_not_in_its_micro_batches(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, {1: [("a", 100 * SECOND, 1)]})
    p = _changelog_pipeline(source, str(tmp_path / "run"), compact_every=timedelta(seconds=1))
    BacklogRunner(spark, p).run()
    live = LiveRunner.from_manifest(spark, p)
    live.start()
    try:
        append_version(spark, source, [("a", 110 * SECOND, 3), ("b", 120 * SECOND, 4)])
        live.process_available()
        head = spark.read.format("delta").load(p.sink.path).agg({changelog.BATCH_ID: "max"}).collect()[0][0]
        log_version = int(spark.sql(f"DESCRIBE HISTORY delta.`{p.sink.path}` LIMIT 1").collect()[0]["version"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (
            live.compactor.last is None or live.compactor.last.through_version < log_version
        ):
            time.sleep(0.5)
        assert live.compactor.last is not None, "no compaction ran"
        # tidy() checkpoints the changelog's log through Delta's internal DeltaLog.forTable(...).checkpoint().
        assert live.compactor.last_error is None, (
            f"compaction or DeltaLog.checkpoint() failed: {live.compactor.last_error}"
        )
        checkpoints = [
            int(f.split(".")[0]) for f in os.listdir(f"{p.sink.path}/_delta_log") if f.endswith(".checkpoint.parquet")
        ]
        assert max(checkpoints, default=-1) >= log_version, (
            f"the background compaction through version {log_version} wrote no checkpoint of the changelog's log "
            f"at or after it (checkpoints: {sorted(checkpoints)})"
        )
        props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{p.sink.path}`").collect()}
        assert {k: props.get(k) for k in changelog.PROPERTIES} == changelog.PROPERTIES
        # The micro-batches only appended (no MERGE); the compactor brought the current table up to them.
        history = spark.sql(f"DESCRIBE HISTORY delta.`{p.sink.path}`").collect()
        assert {h["operation"] for h in history} <= {"CREATE TABLE", "WRITE", "SET TBLPROPERTIES", "OPTIMIZE"}
        compacted = spark.read.format("delta").load(p.sink.current)
        assert compacted.agg({changelog.BATCH_ID: "max"}).collect()[0][0] == head
        assert_results_equal(_compacted(spark, p), current_rows(spark, p))
    finally:
        live.stop()
    assert live.compactor is None


def test_changelog_mode_is_for_operators_that_replace_a_keys_row(tmp_path):
    window = WindowedAggregate(window=Window(size=timedelta(seconds=10)), aggregations=AGGREGATIONS)
    with pytest.raises(INVALID) as err:
        make_pipeline(str(tmp_path), str(tmp_path), sink=DeltaSink(path="s", mode="changelog"), operator=window)
    assert "keyed_aggregate" in str(err.value) and "use sink.mode 'upsert'" in str(err.value)
    with pytest.raises(INVALID, match="current_path is the compacted table of a changelog sink"):
        DeltaSink(path="s", current_path="c")
    with pytest.raises(INVALID, match="'upsert' or 'changelog'|upsert.*changelog"):
        DeltaSink(path="s", mode="merge")
    with pytest.raises(INVALID, match="upsert_write says how an upsert sink is written; sink.mode is 'changelog'"):
        DeltaSink(path="s", mode="changelog", upsert_write="rewrite")
    with pytest.raises(INVALID, match="'auto', 'merge' or 'rewrite'|auto.*merge.*rewrite"):
        DeltaSink(path="s", upsert_write="overwrite")
    # How the upsert is written shapes no state: the fingerprint stays.
    assert (
        make_pipeline(str(tmp_path), str(tmp_path)).fingerprint()
        == make_pipeline(str(tmp_path), str(tmp_path), sink=DeltaSink(path="s", upsert_write="merge")).fingerprint()
    )
    # The sink's mode shapes its table: switching it needs a new backlog (the fingerprint differs).
    upsert = make_pipeline(str(tmp_path), str(tmp_path))
    assert (
        upsert.fingerprint() != upsert.model_copy(update={"sink": DeltaSink(path="x", mode="changelog")}).fingerprint()
    )
    assert DeltaSink(path="/t/sink/", mode="changelog").current == "/t/sink_current"
