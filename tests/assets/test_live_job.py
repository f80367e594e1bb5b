"""The live job in-process: starts from the sensor's manifest, reports progress as observations, stops
cleanly, and a second run resumes from the checkpoints."""

from __future__ import annotations

import os

import dagster as dg

from assets.settings import CheckPolicy, Names, Orchestration
from phases import manifest
from tests import reference
from tests.assets.conftest import definitions, relative_pipeline
from tests.helpers import append_version, assert_results_equal, sink_rows, write_source
from tests.phases.test_backlog import DELAY_S, VERSIONS, S

LENIENT = Orchestration(checks=CheckPolicy(max_quarantine_fraction=0.5))


def _commits(path: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(path) if n.isdigit())


def test_live_job_reports_progress_and_resumes_from_its_checkpoint(spark, tmp_path):
    root = str(tmp_path)
    write_source(spark, f"{root}/src", VERSIONS)
    p = relative_pipeline(delay_s=DELAY_S)
    names, defs = Names(p), definitions(spark, root, p, LENIENT)
    with dg.instance_for_test() as instance:
        assert defs.resolve_job_def(names.backlog_job).execute_in_process(instance=instance).success
        mid = manifest.latest(spark, f"{root}/engine/manifests", p.name).manifest_id
        v4 = [("a", 80 * S, 20), ("f", 75 * S, 21), ("c", 1 * S, 22)]  # ("c", 1 s) is late
        append_version(spark, f"{root}/src", v4)
        config = {"manifest_id": mid, "report_interval_seconds": 1.0, "max_runtime_seconds": 4.0}
        run_config = {"ops": {names.live_op: {"config": config}}}
        live_job = defs.resolve_job_def(names.live_job)

        first = live_job.execute_in_process(instance=instance, run_config=run_config)
        assert first.success
        observations = [
            e.event_specific_data.asset_observation
            for e in first.all_events
            if e.event_type_value == "ASSET_OBSERVATION"
        ]
        progress = [o.metadata for o in observations if o.metadata["event"].value == "progress"]
        assert observations[0].metadata["event"].value == "started" and len(progress) >= 2
        assert {"batch_id", "input_rows_per_s", "watermark", "watermark_lag_s", "behind"} <= set(progress[-1])
        assert progress[-1]["behind"].value == 0
        expected, _ = reference.run({**VERSIONS, 4: v4}, DELAY_S * S)
        assert_results_equal(sink_rows(spark, f"{root}/engine/sink"), expected)

        checkpoint = f"{root}/engine/checkpoints/{mid}/increment/commits"
        before = _commits(checkpoint)
        v5 = [("g", 90 * S, 30), ("a", 85 * S, 31)]
        append_version(spark, f"{root}/src", v5)
        assert live_job.execute_in_process(instance=instance, run_config=run_config).success
        after = _commits(checkpoint)
        assert after[: len(before)] == before and len(after) > len(before)  # resumed, state not replayed again
        expected, _ = reference.run({**VERSIONS, 4: v4, 5: v5}, DELAY_S * S)
        assert_results_equal(sink_rows(spark, f"{root}/engine/sink"), expected)
