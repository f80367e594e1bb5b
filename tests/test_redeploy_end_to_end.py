"""Changing a running pipeline end to end, through a real Dagster stack on PostgreSQL (webserver + daemon on a loopback
port): the demo pipeline runs live (backlog job, then the switch sensor's live run); its code changes (the code
location now serves the demo's second revision, reloaded as a deploy would) and the assets show a new code version;
the redeploy job builds the next generation beside the live one, checks it, swaps it in and runs its live phase,
while the old live run ends cleanly saying why; then the previous code is deployed again and the same job rolls back.
Every result is checked exactly: each record of the source is in the sink's counts or in the serving generation's
quarantine, once."""

from __future__ import annotations

import time

from assets.pipelines import DEMO, DEMO_REVISED
from phases._internal.sources import synthetic
from phases._internal.storage import table_stats
from phases_dagster.redeploy import REASON_TAG, REDEPLOY_TAG
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names
from scripts.browser import asset_node_text, browser_page, catalog_row_text, wait_for_asset_state
from scripts.dagster_stack import LOCATION, DagsterStack, DeployedLocation
from scripts.local_postgres import LocalPostgres
from tests.helpers import SHORT_LIVED_JVM_OPTIONS
from tests.test_end_to_end import SENSOR_INTERVAL_S, _events_in, _kill_tree, _shot, _wait

NAMES = Names(DEMO)
ROWS_PER_BATCH = 2000


def _accounted(spark, pipeline, storage: StorageResource) -> tuple[int, int]:
    """(events counted in the sink, records in the serving generation's quarantine) of ``pipeline``."""
    where = storage.placement(pipeline)
    return _events_in(where.sink_path), len(table_stats.rows(where.quarantine) or [])


def _wait_exact(
    spark, pipeline, storage: StorageResource, total: int, stack: DagsterStack, live_run: str, timeout_s: float = 240
) -> None:
    """Waits until the sink and the quarantine account for ``total`` records; on a timeout it shows the counts, and
    the status and last messages of the run whose live phase should have applied them."""

    def seen() -> str:
        messages = "\n".join(m[:300] for m in stack.messages(live_run)[-25:])
        return f"{_accounted(spark, pipeline, storage)}; run {live_run} {stack.run_status(live_run)}:\n{messages}"

    _wait(
        f"every one of {total} records counted in the sink or quarantined, once",
        lambda: sum(_accounted(spark, pipeline, storage)) == total,
        timeout_s=timeout_s,
        seen=seen,
    )


def _columns(spark, path: str) -> list[str]:
    return spark.read.format("delta").load(path).columns


def test_a_changed_definition_is_redeployed_beside_the_live_one_then_rolled_back_in_dagster(spark, tmp_path):
    data_root, code = tmp_path / "data", tmp_path / "code"
    storage = StorageResource(root=str(data_root))
    p = storage.placement(DEMO)
    source = p.source_path(DEMO.source)
    synthetic.create_source(spark, source)
    batches = 0

    def append_batch() -> None:
        nonlocal batches
        batch = synthetic.event_batch(spark, rows=ROWS_PER_BATCH, keys=500, batch_index=batches)
        synthetic.append(spark, source, batch)
        batches += 1

    for _ in range(3):
        append_batch()
    location = DeployedLocation(code, "DEMO")
    postgres = LocalPostgres(tmp_path / "postgres").start()
    env = {"JAVA_TOOL_OPTIONS": SHORT_LIVED_JVM_OPTIONS, "PHASES_RELAUNCH_BACKOFF_S": "10"}
    stack = DagsterStack(
        tmp_path / "dagster_home",
        data_root,
        sensor_interval_s=SENSOR_INTERVAL_S,
        env=env,
        storage_yaml=postgres.dagster_yaml(),
        workspace=location.workspace,
    )
    try:
        stack.start()
        assert stack.parents(NAMES.swap) == {NAMES.next_generation}
        assert stack.parents(NAMES.live_asset) == {NAMES.backlog, NAMES.state}  # resuming asks about nothing else
        stack.wait_run(stack.launch(NAMES.backlog_job), {"SUCCESS"}, timeout_s=400)
        old_live = stack.wait_for_run_of(NAMES.live_job, timeout_s=120)["runId"]  # the switch sensor's
        stack.wait_for_message(old_live, "live phase running", timeout_s=300)
        append_batch()
        _wait_exact(spark, DEMO, storage, batches * ROWS_PER_BATCH, stack, old_live)

        # A deploy of changed code: the assets' code version (the definition's fingerprint) changes.
        assert stack.code_version(NAMES.backlog) == DEMO.fingerprint()
        location.deploy("DEMO_REVISED")
        stack.reload()
        assert stack.code_version(NAMES.backlog) == DEMO_REVISED.fingerprint()
        assert stack.code_version(NAMES.next_generation) == DEMO_REVISED.fingerprint()

        reason = "a five-minute watermark and a count of values"
        config = {"reason": reason}
        run_config = {"ops": {NAMES.next_generation: {"config": config}, NAMES.live_asset: {"config": config}}}
        started = time.monotonic()
        redeploy = stack.launch(NAMES.redeploy_job, run_config)
        stack.wait_for_message(redeploy, "live phase running", timeout_s=600)
        # The old live run ended cleanly on the swap's request, saying why; the new live phase runs in the redeploy's.
        assert stack.wait_run(old_live, {"SUCCESS"}, timeout_s=60) == "SUCCESS"
        stopped = [m for m in stack.materializations(NAMES.live_asset) if m["run_id"] == old_live]
        assert stopped and stopped[0]["state"] == "stopped" and "redeploy" in stopped[0]["reason"], stopped
        built = stack.latest_materialization(NAMES.next_generation)
        assert (built["run_id"], built["way"], built["generation"]) == (redeploy, "backfill", 1)
        checks = stack.check_results(redeploy)
        assert checks and all(checks.values()), checks
        swapped = stack.latest_materialization(NAMES.swap)
        assert (swapped["from_generation"], swapped["generation"], swapped["reason"]) == (0, 1, reason)
        tags = {t["key"]: t["value"] for t in stack.runs(NAMES.redeploy_job)[0]["tags"]}
        assert tags[REDEPLOY_TAG] == "backfill" and tags[REASON_TAG] == reason
        steps = [o["step"] for o in stack.observations(NAMES.next_generation, 50) if o["run_id"] == redeploy]
        assert set(steps) == {"planned", "backlog", "live caught up", "checked"}, steps
        assert "valued" in _columns(spark, p.consumer_sink)
        append_batch()
        _wait_exact(spark, DEMO_REVISED, storage, batches * ROWS_PER_BATCH, stack, redeploy)
        redeploy_s = time.monotonic() - started

        # The health sensor and the checks watch the generation that serves: the redeploy's run is its live phase.
        # (They read generation 0's handoff once, and said "stopped; not relaunched" while generation 1 served.)
        _wait(
            "live_phase_running passing for the redeploy's run",
            lambda: (
                (e := stack.check_executions(NAMES.live_asset, NAMES.live_running))
                and e[0]["success"]
                and redeploy in e[0]["description"]
            ),
            timeout_s=90,
            seen=lambda: stack.check_executions(NAMES.live_asset, NAMES.live_running)[:3],
        )
        _wait(
            "sink_fresh passing while generation 1 serves",
            lambda: (e := stack.check_executions(NAMES.sink, NAMES.fresh)) and e[0]["success"],
            timeout_s=90,
            seen=lambda: stack.check_executions(NAMES.sink, NAMES.fresh)[:3],
        )
        # Its process lost: the live asset turns red in the lineage and the catalog, and the health sensor relaunches
        # it, from generation 1's handoff, within its backoff; the browser shows the relaunched run materializing.
        group_url, catalog_url = f"{stack.url}/locations/{LOCATION}/asset-groups/{NAMES.group}", f"{stack.url}/assets"
        _kill_tree(stack.run_pid(redeploy))
        stack.wait_run(redeploy, {"FAILURE"}, timeout_s=120)
        with browser_page() as page:
            node = wait_for_asset_state(lambda: asset_node_text(page, group_url, NAMES.live_asset), "Failed", 60)
            assert "Materializing" not in node, node
            _shot(page, "redeployed_live_failed")
            # The catalog row too, unless the health sensor relaunched it meanwhile (its backoff is 10 s here): then
            # the row materializes under the relaunch's run id. Never as materializing under the killed run's.
            row = _wait(
                "the catalog row red, or materializing under a run other than the killed one",
                lambda: (
                    (text := catalog_row_text(page, catalog_url, NAMES.live_asset))
                    and ("Failed" in text or ("Materializing" in text and redeploy[:8] not in text))
                    and text
                ),
                timeout_s=60,
                seen=lambda: catalog_row_text(page, catalog_url, NAMES.live_asset),
            )
            assert not ("Materializing" in row and redeploy[:8] in row), row
        relaunched = _wait(
            "a relaunch of the serving generation's live run",
            lambda: next(
                (
                    r
                    for r in stack.runs(NAMES.live_job)
                    if {t["key"]: t["value"] for t in r["tags"]}.get("phases/relaunch_of") == redeploy
                ),
                None,
            ),
            timeout_s=180,
            seen=lambda: [tick["skipReason"] for tick in stack.sensor_ticks(NAMES.health)][:5],
        )["runId"]
        built_manifest = stack.latest_materialization(NAMES.next_generation)["manifest_id"]
        rtags = {t["key"]: t["value"] for t in stack.runs(NAMES.live_job)[0]["tags"]}
        assert rtags["phases/manifest_id"] == built_manifest, rtags
        stack.wait_for_message(relaunched, "live phase running", timeout_s=300)
        append_batch()
        _wait_exact(spark, DEMO_REVISED, storage, batches * ROWS_PER_BATCH, stack, relaunched)
        _wait(
            "live_phase_running passing for the relaunched run",
            lambda: (
                (e := stack.check_executions(NAMES.live_asset, NAMES.live_running))
                and e[0]["success"]
                and relaunched in e[0]["description"]
            ),
            timeout_s=90,
            seen=lambda: stack.check_executions(NAMES.live_asset, NAMES.live_running)[:3],
        )
        with browser_page() as page:  # caught up: running again, no longer red, its checks passing
            node = wait_for_asset_state(lambda: asset_node_text(page, group_url, NAMES.live_asset), "Materializing")
            assert "Failed" not in node, node
            row = wait_for_asset_state(lambda: catalog_row_text(page, catalog_url, NAMES.live_asset), "Materializing")
            assert relaunched[:8] in row, row
            _shot(page, "redeployed_live_relaunched")

        # The previous code again: the same job swaps the kept generation 0 back, without a backlog.
        location.deploy("DEMO")
        stack.reload()
        config = {"reason": "roll back"}
        run_config = {"ops": {NAMES.next_generation: {"config": config}, NAMES.live_asset: {"config": config}}}
        rollback = stack.launch(NAMES.redeploy_job, run_config)
        stack.wait_for_message(rollback, "live phase running", timeout_s=600)
        assert stack.wait_run(relaunched, {"SUCCESS"}, timeout_s=60) == "SUCCESS"
        back = stack.latest_materialization(NAMES.swap)
        assert (back["run_id"], back["way"], back["from_generation"], back["generation"]) == (
            rollback,
            "rollback",
            1,
            0,
        )
        assert "backlog_s" not in stack.latest_materialization(NAMES.next_generation)
        assert "valued" not in _columns(spark, p.consumer_sink)
        append_batch()
        _wait_exact(spark, DEMO, storage, batches * ROWS_PER_BATCH, stack, rollback)
        stack.terminate(rollback)
        stack.wait_run(rollback, {"SUCCESS", "CANCELED"}, timeout_s=120)
        assert redeploy_s > 0
    finally:
        stack.stop()
        postgres.stop()
