"""Nothing grows without bound: a crashed backlog's orphaned state table is removed by the next backlog,
tables the live phase rewrites get auto compaction, and maintain() compacts and vacuums without touching
what the live phase still needs."""

from __future__ import annotations

import os
import uuid

from phases import maintain
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.deployment import place
from phases._internal.live.runner import LiveRunner
from phases._internal.storage import maintenance
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, sink_rows, spark_jobs, write_source
from tests.phases.live.test_live import BACKLOG, DELAY_S, LIVE, S


def test_the_next_backlog_removes_a_crashed_backlogs_orphaned_state_table(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, BACKLOG)
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    first = BacklogRunner(spark, p).run()
    orphan = f"{p.locations.state_root}/{uuid.uuid4().hex}"  # a backlog that died before its manifest
    spark.range(3).write.format("delta").save(orphan)
    runner = BacklogRunner(spark, p)
    second = runner.run()
    assert runner.removed_orphans == [orphan] and not os.path.exists(orphan)
    assert os.path.exists(first.state_path) and os.path.exists(second.state_path)  # named by manifests


def test_the_orphan_check_reads_which_state_tables_manifests_name_without_a_spark_job(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, BACKLOG)
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    named = BacklogRunner(spark, p).run()
    orphan = f"{p.locations.state_root}/{uuid.uuid4().hex}"
    spark.range(3).write.format("delta").save(orphan)
    with spark_jobs(spark, "the orphan check") as jobs:
        removed = maintenance.remove_orphan_state(spark, place(spark, p))
    assert removed == [orphan] and not os.path.exists(orphan) and os.path.exists(named.state_path)
    assert jobs == []


def test_maintenance_compacts_and_vacuums_and_the_live_phase_goes_on(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, BACKLOG)
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    BacklogRunner(spark, p).run()
    live = LiveRunner.from_manifest(spark, p)
    live.start(available_now=True)
    # Auto compaction on the table every micro-batch rewrites (the upserted sink); the handoff's state table is
    # the handoff's record (the live state is in the state store) and stays as the backlog wrote it.
    props = spark.sql(f"SHOW TBLPROPERTIES delta.`{p.sink.path}`").collect()
    assert {r["key"]: r["value"] for r in props}.get("delta.autoOptimize.autoCompact") == "true"
    props = spark.sql(f"SHOW TBLPROPERTIES delta.`{live.state_path}`").collect()
    assert "delta.autoOptimize.autoCompact" not in {r["key"] for r in props}
    append_version(spark, source, LIVE[3])
    LiveRunner.from_manifest(spark, p).start(available_now=True)

    report = maintain(spark, p)
    assert {p.locations.quarantine, p.locations.manifests, live.state_path, p.sink.path} <= set(report)
    assert all(entry["vacuumed"] for entry in report.values())

    append_version(spark, source, LIVE[4])
    LiveRunner.from_manifest(spark, p).start(available_now=True)  # the manifest check still passes
    expected, _ = reference.run({**BACKLOG, **LIVE}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
