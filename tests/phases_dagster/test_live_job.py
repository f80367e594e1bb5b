"""The live job in-process: starts from the sensor's manifest, materializes the live asset with measurements
checked against known input and the sink with its row count, stops cleanly, and a second run resumes from the
checkpoint."""

from __future__ import annotations

import os
import threading
import time

import dagster as dg

from phases._internal.handoff import manifest
from phases_dagster.settings import CheckPolicy, Names, Orchestration
from tests import reference
from tests.helpers import append_version, assert_results_equal, sink_rows, write_source
from tests.phases.backlog.test_backlog import DELAY_S, VERSIONS, S
from tests.phases_dagster.conftest import definitions, relative_pipeline

LENIENT = Orchestration(checks=CheckPolicy(max_quarantine_fraction=0.5))


def _commits(path: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(path) if n.isdigit())


def _live_materializations(result: dg.ExecuteInProcessResult, asset: str) -> list[dict]:
    out = []
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        if materialization.asset_key == dg.AssetKey(asset):
            out.append({k: getattr(v, "value", v) for k, v in materialization.metadata.items()})
    return out


def _asset_events(result: dg.ExecuteInProcessResult, asset: str) -> list[tuple[str, dict]]:
    """(kind, metadata) of the asset's observations and materializations in the run, in order."""
    out = []
    for event in result.all_events:
        if event.event_type == dg.DagsterEventType.ASSET_OBSERVATION:
            data, kind = event.asset_observation_data.asset_observation, "observation"
        elif event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            data, kind = event.step_materialization_data.materialization, "materialization"
        else:
            continue
        if data.asset_key == dg.AssetKey(asset):
            out.append((kind, {k: getattr(v, "value", v) for k, v in data.metadata.items()}))
    return out


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
        run_config = {"ops": {names.live_asset: {"config": config}}}
        live_job = defs.resolve_job_def(names.live_job)

        first = live_job.execute_in_process(instance=instance, run_config=run_config)
        assert first.success
        events = _asset_events(first, names.live_asset)
        # The live asset is materialized once, when the live phase stops: while it runs, its reports are
        # observations, so the UI shows the asset materializing (its run in progress), never a green "materialized".
        assert [kind for kind, _ in events].count("materialization") == 1 and events[-1][0] == "materialization"
        reports = [meta for _, meta in events]
        assert reports[0]["event"] == "started" and reports[-1]["state"] == "stopped", reports[-1]
        assert reports[-1]["reason"].startswith("max_runtime_seconds")
        # Reports with rates: how many the 4 s hold depends on the machine's load (an interval in which a micro-batch
        # runs and none ends has no rate), so at least one, and together they account for every row.
        running = [r for r in reports if r.get("state") == "running" and "rows_in_per_s" in r]
        assert running, reports
        # Truthful measurements against known input: v4's three records were read once, by a batch that took time.
        rows = [int(r["input_rows"].split(" ")[0].replace(",", "")) for r in running]
        assert sum(rows) == len(v4)
        busy = [r for r, n in zip(running, rows, strict=True) if n > 0]
        assert busy and all(r["rows_processed_per_s"] > 0 and r["time_per_micro_batch_s"] > 0 for r in busy)
        # Plotted first, with units in their names, named in the order the UI shows them (by name), and nothing else
        # plotted: the lag behind the head (seconds, versions), rows/s in and while processing, micro-batch seconds.
        plotted = ["lag_s", "lag_to_head_versions", "rows_in_per_s", "rows_processed_per_s", "time_per_micro_batch_s"]
        assert plotted == sorted(plotted)
        for r in running:
            numbers = [k for k, v in r.items() if isinstance(v, int | float) and not isinstance(v, bool)]
            assert numbers == [k for k in plotted if k in r] and list(r)[: len(numbers)] == numbers, r
        assert running[-1]["lag_to_head_versions"] == 0 and running[-1]["lag_s"] == 0.0
        assert running[-1]["event_time_lag"] == "0.000 s"
        assert running[-1]["applied_position"] == "v4" and running[-1]["head_position"] == "v4"
        last = running[-1]  # text with the year: v4's newest record is at 80 s after the tests' base time (2026)
        assert last["applied_max_event_time"] == "2026-01-01 00:01:20 UTC"
        assert last["head_max_event_time"] == last["applied_max_event_time"]
        assert last["watermark"] == f"2026-01-01 00:01:{20 - DELAY_S:02d} UTC"
        # The run that ran the live phase says so (the health sensor finds live runs by this tag, whatever their job).
        run_tags = instance.get_run_by_id(first.run_id).tags
        assert run_tags["phases/live"] == p.name and run_tags["phases/manifest_id"] == mid
        # The quarantine is materialized again by the live run, with its count and reasons (("c", 1 s) was late).
        quarantine_events = _live_materializations(first, names.quarantine)
        assert quarantine_events and quarantine_events[-1]["written_by"] == "live"
        assert quarantine_events[-1]["live_rows"] == 1 and quarantine_events[-1]["late_rows"] >= 1
        assert sum(quarantine_events[-1]["rows_by_reason"].values()) == quarantine_events[-1]["dagster/row_count"]
        sink_events = _live_materializations(first, names.sink)
        assert sink_events and sink_events[-1]["written_by"] == "live"
        # Each of them comes with sink_fresh evaluated for it (the UI showed "0 / 1 passed" after every commit until
        # the health sensor's next report).
        fresh = [e for e in first.get_asset_check_evaluations() if e.check_name == names.fresh]
        assert len(fresh) == len(sink_events) and all(e.passed for e in fresh), fresh
        assert sink_events[-1]["dagster/row_count"] == len(sink_rows(spark, f"{root}/engine/sink"))
        expected, _ = reference.run({**VERSIONS, 4: v4}, DELAY_S * S)
        assert_results_equal(sink_rows(spark, f"{root}/engine/sink"), expected)

        # The second run starts while versions keep arriving faster than micro-batches apply them (an outage's gap
        # on a busy source): it reports from its first micro-batch on, while the arrivals go on, not once they stop.
        checkpoint = f"{root}/engine/checkpoints/{mid}/increment/commits"
        before = _commits(checkpoint)
        arrived = {5: [("g", 90 * S, 30), ("a", 85 * S, 31)]}
        append_version(spark, f"{root}/src", arrived[5])
        writing = threading.Thread(target=_keep_appending, args=(spark, f"{root}/src", arrived, 6, ARRIVALS_S))
        writing.start()
        try:
            busy_config = {**config, "max_runtime_seconds": ARRIVALS_S + 2.0}
            second = live_job.execute_in_process(
                instance=instance, run_config={"ops": {names.live_asset: {"config": busy_config}}}
            )
        finally:
            writing.join()
        assert second.success
        reports = [meta for _, meta in _asset_events(second, names.live_asset)]
        running = [r for r in reports if r.get("state") == "running" and "rows_in_per_s" in r]
        # the first report came while versions were still arriving: it had applied fewer than all of them
        assert len(running) >= 2 and running[0]["applied_position"] != f"v{max(arrived)}", (running[0], max(arrived))
        after = _commits(checkpoint)
        assert after[: len(before)] == before and len(after) > len(before)  # resumed, state not replayed again
        expected, _ = reference.run({**VERSIONS, 4: v4, **arrived}, DELAY_S * S)
        assert_results_equal(sink_rows(spark, f"{root}/engine/sink"), expected)


ARRIVALS_S = 4.0  # how long versions keep arriving while the second live run starts
ARRIVAL_EVERY_S = 1.0


def _keep_appending(spark, path: str, arrived: dict, first: int, seconds: float) -> None:
    """Appends a version every :data:`ARRIVAL_EVERY_S` for ``seconds`` (each on time, one record a key of three),
    recording them: the same arrivals however long an append takes (as fast as appends go, the first micro-batch
    took so many versions that the run made one report in its time)."""
    start = time.monotonic()
    version = first
    while time.monotonic() < start + seconds:
        rows = [(f"k{version % 3}", (90 + version) * S, 100 + version)]
        append_version(spark, path, rows)
        arrived[version] = rows
        version += 1
        time.sleep(max(0.0, start + (version - first) * ARRIVAL_EVERY_S - time.monotonic()))
