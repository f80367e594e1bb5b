"""A windowed pipeline through the Dagster layer: the backlog emits closed windows, its checks pass, and a
catch-up increment appends just the windows that closed since (a re-run does not duplicate them)."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Window, WindowedAggregate
from phases._internal.handoff import manifest
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import CheckPolicy, Names, Orchestration
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, write_source
from tests.phases.operators.test_windows import AGGS, _emitted
from tests.phases_dagster.conftest import definitions

S = 1_000_000
VERSIONS = {
    1: [("a", 1 * S, 1), ("b", 4 * S, 2), ("a", 12 * S, 3)],
    2: [("a", 25 * S, 4), ("b", 2 * S, 5), ("c", 31 * S, 6)],  # ("b", 2 s) is late: W = 12 - 5 = 7 s
}
LATER = {3: [("a", 48 * S, 7), ("c", 41 * S, 8)], 4: [("b", 70 * S, 9)]}


def test_windowed_backlog_checks_pass_and_increments_emit_each_window_once(spark, tmp_path):
    root = str(tmp_path)
    write_source(spark, f"{root}/src", VERSIONS)
    window = WindowedAggregate(window=Window(size=timedelta(seconds=10)), aggregations=AGGS)
    p = make_pipeline("src", "engine", delay_s=5, operator=window)
    names = Names(p)
    defs = definitions(spark, root, p, Orchestration(checks=CheckPolicy(max_quarantine_fraction=0.5)))
    job = defs.resolve_job_def(names.backlog_job)
    increment = {"ops": {names.backlog_op: {"config": {"mode": "increment"}}}}
    with dg.instance_for_test() as instance:
        first = job.execute_in_process(instance=instance)
        assert first.success and all(e.passed for e in first.get_asset_check_evaluations())
        expected, _ = reference.run_windows(VERSIONS, 5 * S, 10 * S, 10 * S)
        assert _emitted(spark, f"{root}/engine/sink") == expected and expected
        for rows in LATER.values():
            append_version(spark, f"{root}/src", rows)
        second = job.execute_in_process(instance=instance, run_config=increment)
        assert second.success and all(e.passed for e in second.get_asset_check_evaluations())
        handoff = manifest.latest(spark, f"{root}/engine/manifests", p.name)
        assert handoff.kind == "increment" and handoff.aggregated_rows == 8  # 9 records, one late
        expected, _ = reference.run_windows({**VERSIONS, **LATER}, 5 * S, 10 * S, 10 * S)
        assert _emitted(spark, f"{root}/engine/sink") == expected
        # A crash after the sink write but before the manifest: drop the manifest row, run the increment again.
        manifests = f"{root}/engine/manifests"
        spark.sql(f"DELETE FROM delta.`{manifests}` WHERE manifest_id = '{handoff.manifest_id}'")
        again = BacklogRunner.at(spark, StorageResource(root=root).placement(p)).run_increment()
        assert again.base_manifest_id == handoff.base_manifest_id and again.sink_rows == handoff.sink_rows
        assert _emitted(spark, f"{root}/engine/sink") == expected  # _emitted fails on a duplicated window
