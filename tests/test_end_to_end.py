"""End to end through a real Dagster stack on PostgreSQL: webserver + daemon on a loopback port, a real browser
(Playwright driving the system Chromium) reading the lineage graph and the catalog as a user does.

The backlog is launched over GraphQL and the switch sensor launches the live run. While it runs, the live asset
looks running (materializing) in the lineage and the catalog; new data, some of it late, reaches the sink, and the
quarantine's count and reasons move. The live run's process is killed with data waiting: the live asset turns red
(failed) in both views within a minute, its ``live_phase_running`` check says the phase was lost, ``sink_fresh``
fails at once, and the health sensor relaunches it from its checkpoint. "Materialize all" on the live pipeline runs
no backlog and marks no table failed, and the switch sensor still reads the handoff's checks as passed; the same
button on the redeploy group builds, stops and swaps nothing. A terminate clicked in the UI is a clean stop
(materialized, not running, its check warning), and the live asset's own "Materialize", pressed on its page, resumes
the live phase without a confirmation dialog, as a run the health sensor recognises.

Then, on the same stack and data, the pipeline's code changes (the code location now serves the demo's second
revision, reloaded as a deploy would) and the assets show a new code version; the redeploy job builds the next
generation beside the live one, checks it, swaps it in and runs its live phase, while the old live run ends cleanly
saying why; its process is killed and the health sensor relaunches the serving generation; then the previous code is
deployed again and the same job rolls back. Every result is checked exactly: each record of the source is in the
sink's counts or in the serving generation's quarantine, once. One stack for both parts: a second stack, backlog and
switch would cost about a tenth of the suite's CPU again. Screenshots are kept in ``.artifacts/ui/``."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
import subprocess
import time
import zlib
from pathlib import Path

from assets.pipelines import DEMO, DEMO_REVISED
from phases._internal.sources import synthetic
from phases._internal.storage import table_stats
from phases_dagster.checks import CHECK_NAMES, NO_FAR_FUTURE
from phases_dagster.redeploy import REASON_TAG, REDEPLOY_TAG
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names
from scripts.browser import asset_node_text, browser_page, catalog_row_text, wait_for_asset_state, wait_for_texts
from scripts.dagster_stack import LOCATION, PROJECT, DagsterStack, DeployedLocation
from scripts.local_postgres import LocalPostgres
from tests.helpers import SHORT_LIVED_JVM_OPTIONS

NAMES = Names(DEMO)
# The sensors' interval in the Dagster end-to-end tests: every reaction the tests wait for (the switch, a relaunch,
# a check) comes within a minute either way, and an idle stack with sensors every 2 s took half again the CPU.
SENSOR_INTERVAL_S = 5


def _png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the first rows) of a PNG, without an image library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        length = struct.unpack(">I", data[pos : pos + 4])[0]
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return width, height, len(set(raw[: 4 * width * 50]))


def _events_in(sink_path: str) -> int:
    """Events counted in a sink, read with delta-rs: the tests poll it every second while runs write it, and no
    Spark job in the test's JVM then competes with the runs' for the cores."""
    return sum(r["events"] for r in table_stats.rows(sink_path) or [])


def _sink_events(p) -> tuple[int, int]:
    """(events counted in the sink, records the live phase quarantined)."""
    late_live = len(table_stats.rows(p.quarantine, where=("phase", "live")) or [])
    return _events_in(p.sink_path), late_live


def _wait_sink(p, expected_events: int, timeout_s: float = 180) -> None:
    deadline, got = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        total, late_live = _sink_events(p)
        got = (total, expected_events - late_live)
        if total == expected_events - late_live:
            return
        time.sleep(1)
    raise AssertionError(f"sink events {got[0]}, expected {got[1]}")


def _wait(what: str, probe, timeout_s: float, every_s: float = 1.0, seen=None):
    """``probe()``'s first true value; fails after ``timeout_s`` with the last value seen (or ``seen()``: what to
    show instead, e.g. the sensor ticks or the run's status)."""
    deadline, value = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every_s)
    shown = seen() if seen is not None else value
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s; last seen: {shown!r}"[:4000])


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (the run worker and its Spark JVM), as a lost machine would."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    for child in children:
        _kill_tree(int(child))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


GRAPHQL_INT_MAX = 2**31 - 1
ARTIFACTS = Path(os.environ.get("PHASES_TEST_ARTIFACTS", PROJECT / ".artifacts" / "ui"))


def _shot(page, name: str) -> Path:
    """Saves a screenshot as a test artifact (``.artifacts/ui/``, or ``PHASES_TEST_ARTIFACTS``)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def _plots(page, url: str, label: str) -> None:
    """Opens an asset's overview, switches its metadata to plots and waits for the plot of ``label``."""
    page.goto(url)
    wait_for_texts(page, ("Metadata",))
    page.get_by_role("button", name="Plots").first.click()
    page.get_by_text(label, exact=True).first.wait_for(state="visible", timeout=120_000)
    page.get_by_text(label, exact=True).first.scroll_into_view_if_needed()


def _press_in_the_browser(
    stack: DagsterStack, url: str, button: str, name: str, shows: str | None = None, *, confirm: str | None = None
) -> str:
    """Presses ``button`` on the page at ``url`` (after ``shows`` is on it), as a user would, and returns the run it
    launched. No dialog may ask "Are you sure?" (nothing waits on an asset that only a redeploy materializes), unless
    ``confirm`` names what it must list (an upstream asset never materialized): then its Confirm is pressed."""
    before = {r["runId"] for r in stack.runs("__ASSET_JOB")}
    with browser_page() as page:
        page.goto(url)
        if shows is not None:
            wait_for_texts(page, (shows,))
        # A button's accessible name carries its icon's too: it is found by its text ("Materialize all (5)": with the
        # count of what it selects).
        found = page.get_by_role("button").filter(has_text=re.compile(rf"^{re.escape(button)}( \(\d+\))?$"))
        try:
            found.first.wait_for(state="visible", timeout=60_000)
        except Exception:
            _shot(page, f"{name}_no_button")
            names = page.get_by_role("button").all_inner_texts()
            raise AssertionError(f"no {button!r} button on {url}; the buttons: {names}") from None
        found.first.click()
        if confirm is not None:
            dialog = page.get_by_role("dialog")
            dialog.get_by_text("Are you sure?").wait_for(state="visible", timeout=60_000)
            assert dialog.get_by_text(confirm, exact=True).count() == 1, dialog.inner_text()
            _shot(page, f"{name}_confirm")
            dialog.get_by_role("button", name="Confirm").click()
        try:
            launched = _wait(
                f"the run {button!r} launched",
                lambda: next((r["runId"] for r in stack.runs("__ASSET_JOB") if r["runId"] not in before), None),
                timeout_s=60,
            )
        except AssertionError:
            _shot(page, f"{name}_not_launched")
            raise
        if confirm is not None:  # the confirmed dialog closes as the run launches: wait until it has gone
            page.get_by_role("dialog").get_by_text("Are you sure?").wait_for(state="hidden", timeout=30_000)
        assert page.get_by_text("Are you sure").count() == 0, f"{button!r} asked to confirm"
        _shot(page, name)
    return launched


def _materialize_all_in_the_browser(
    stack: DagsterStack, group_url: str, name: str, shows: str = NAMES.live_asset
) -> str:
    """The group's "Materialize all" in the lineage."""
    return _press_in_the_browser(stack, group_url, "Materialize all", name, shows)


def test_the_demo_through_the_dagster_ui_then_a_changed_definition_redeployed_and_rolled_back(spark, tmp_path):
    data_root, timings = tmp_path / "data", {}
    storage = StorageResource(root=str(data_root))
    p = storage.placement(DEMO)
    source_path = p.source_path(DEMO.source)
    synthetic.create_source(spark, source_path)
    for i in range(4):
        synthetic.append(spark, source_path, synthetic.event_batch(spark, rows=5000, keys=2000, batch_index=i))

    # A short freshness bound and a relaunch backoff long enough to see the check fail while the live run is dead.
    env = {
        "PHASES_SINK_MAX_LAG_S": "5",
        "PHASES_RELAUNCH_BACKOFF_S": "20",
        "JAVA_TOOL_OPTIONS": SHORT_LIVED_JVM_OPTIONS,
    }
    t0 = time.monotonic()
    postgres = LocalPostgres(tmp_path / "postgres").start()  # a production-like instance: storage in PostgreSQL
    timings["postgres up"] = time.monotonic() - t0
    # A code location of its own, serving the demo pipeline: a deploy of changed code rewrites it.
    location = DeployedLocation(tmp_path / "code", "DEMO")
    stack = DagsterStack(
        tmp_path / "dagster_home",
        data_root,
        sensor_interval_s=SENSOR_INTERVAL_S,
        env=env,
        storage_yaml=postgres.dagster_yaml(),
        workspace=location.workspace,
    )
    try:
        timings["stack loaded"] = stack.start()
        assert not list((tmp_path / "dagster_home").glob("**/*.db")), "the instance must not use SQLite files"
        # The lineage is the tables: source -> handoff manifest -> state / sink / quarantine; live after the handoff.
        assert stack.parents(NAMES.backlog) == {NAMES.source}
        for table in (NAMES.state, NAMES.sink, NAMES.quarantine):
            assert stack.parents(table) == {NAMES.backlog}
        assert stack.parents(NAMES.live_asset) == {NAMES.backlog, NAMES.state}  # resuming asks about nothing else

        t = time.monotonic()
        with browser_page() as page:  # the group's lineage in a real browser: every table is a node
            page.goto(f"{stack.url}/locations/two_phase_pipelines/asset-groups/{NAMES.group}")
            wait_for_texts(page, (NAMES.source, NAMES.backlog, NAMES.state, NAMES.sink, NAMES.quarantine))
            wait_for_texts(page, (NAMES.live_asset,))
            graph = _shot(page, "asset_graph")
        timings["lineage page"] = time.monotonic() - t
        width, height, colours = _png_size_and_colours(graph)
        assert (width, height) == (1600, 1000) and colours > 10, "blank screenshot"

        t = time.monotonic()
        backlog_run = stack.launch(NAMES.backlog_job)
        stack.wait_run(backlog_run, {"SUCCESS"}, timeout_s=400)
        timings["backlog run"] = time.monotonic() - t
        meta = stack.latest_materialization(NAMES.backlog)
        assert meta["run_id"] == backlog_run and meta["source_version"] == "4"
        assert meta["handoff"]["source_version"] == 4 and meta["handoff"]["final_watermark_us"] > GRAPHQL_INT_MAX
        assert meta["input_rows"] == 20_000 and meta["keys"] > 1000 and meta["rows_per_s"] > 0
        assert meta["quarantined_rows"] == meta["late_rows"] + meta["invalid_rows"]
        assert abs(meta["final_watermark"] - meta["handoff"]["final_watermark_us"] / 1e6) < 1e-3
        checks = stack.check_results(backlog_run)
        assert set(checks) == {*CHECK_NAMES, NO_FAR_FUTURE} and all(checks.values()), checks
        sink = stack.latest_materialization(NAMES.sink)
        assert sink["run_id"] == backlog_run and sink["dagster/row_count"] == meta["keys"]
        assert [c["name"] for c in sink["dagster/column_schema"]][0] == "key"
        assert sink["dagster/table_name"] == "demo_events.sink" and sink["dagster/uri"] == p.sink_path
        [latest] = stack.materialization_entries(NAMES.backlog, 1)
        types = {e["label"]: e["__typename"] for e in latest["metadataEntries"]}
        assert types["final_watermark"] == "TimestampMetadataEntry" and types["handoff"] == "JsonMetadataEntry"
        assert types["source_version"] == "TextMetadataEntry" and types["manifest_id"] == "TextMetadataEntry"
        assert types["input_rows"] == "IntMetadataEntry" and types["rows_per_s"] == "FloatMetadataEntry"
        assert types["state_path"] == "PathMetadataEntry" and types["source_path"] == "PathMetadataEntry"
        # The health sensor observed the source: its data version and row count.
        source = _wait(
            "an observation of the source at version 4",
            lambda: next((o for o in stack.observations(NAMES.source) if o.get("position") == "v4"), None),
            timeout_s=60,
        )
        assert source["dagster/row_count"] == 20_000 and source["max_event_time"] > 1e9
        # Every number GraphQL reads as an Int fits in 32 bits (larger ones come back null).
        for asset in (NAMES.backlog, NAMES.state, NAMES.sink, NAMES.quarantine):
            for m in stack.materialization_entries(asset):
                ints = [e for e in m["metadataEntries"] if e["__typename"] == "IntMetadataEntry"]
                assert all(e["intValue"] is not None for e in ints), (asset, ints)

        t = time.monotonic()
        live = stack.wait_for_run_of(NAMES.live_job, timeout_s=120)
        timings["sensor launched live"] = time.monotonic() - t
        tags = {tag["key"]: tag["value"] for tag in live["tags"]}
        assert tags["dagster/run_key"] == f"live:{meta['manifest_id']}"
        assert tags["dagster/sensor_name"] == NAMES.switch
        stack.wait_for_message(live["runId"], "live phase running", timeout_s=300)
        timings["live phase running"] = time.monotonic() - t
        group_url, catalog_url = f"{stack.url}/locations/{LOCATION}/asset-groups/{NAMES.group}", f"{stack.url}/assets"
        with browser_page() as page:  # a running live phase looks running: its node and its catalog row
            node = wait_for_asset_state(lambda: asset_node_text(page, group_url, NAMES.live_asset), "Materializing")
            assert "Materialized" not in node and "Failed" not in node, node
            row = wait_for_asset_state(lambda: catalog_row_text(page, catalog_url, NAMES.live_asset), "Materializing")
            assert live["runId"][:8] in row, row
            _shot(page, "catalog_live_running")
        assert stack.asset_status(NAMES.live_asset)["in_progress"] == [live["runId"]]

        t = time.monotonic()
        # Some of the new records are late: the quarantine's count and reasons move while the live phase runs.
        batch = synthetic.event_batch(spark, rows=3000, keys=2000, batch_index=4, late_fraction=0.02)
        synthetic.append(spark, source_path, batch)
        expected_events = (
            meta["aggregated_rows"] + 3000
        )  # _wait_sink subtracts the late ones the live phase quarantined
        _wait_sink(p, expected_events)
        timings["new version in sink"] = time.monotonic() - t
        live_sink = _wait(
            "a sink materialization by the live run",
            lambda: next((m for m in stack.materializations(NAMES.sink) if m["run_id"] == live["runId"]), None),
            timeout_s=60,
        )
        assert live_sink["written_by"] == "live" and live_sink["dagster/row_count"] >= meta["keys"]
        late_live = _sink_events(p)[1]
        assert late_live > 0
        quarantined = _wait(
            "a quarantine materialization by the live run with its late rows",
            lambda: next(
                (
                    m
                    for m in stack.materializations(NAMES.quarantine)
                    if m["run_id"] == live["runId"] and m.get("live_rows") == late_live
                ),
                None,
            ),
            timeout_s=60,
        )
        assert quarantined["dagster/row_count"] == meta["quarantined_rows"] + late_live
        assert quarantined["rows_by_reason"] == {"late: event time <= watermark": quarantined["dagster/row_count"]}
        assert quarantined["late_rows"] == quarantined["dagster/row_count"]
        state_seen = _wait(
            "the live state store's version on the state asset",
            lambda: next((o for o in stack.observations(NAMES.state) if o["run_id"] == live["runId"]), None),
            timeout_s=60,
        )
        assert int(state_seen["live_store_version"]) >= 2 and "state-store" in state_seen["live_state_store"]
        assert state_seen["live_store_bytes"] > 0
        report = _wait(
            "a live report of the new rows",
            lambda: next(
                (
                    o
                    for o in stack.observations(NAMES.live_asset, 100)
                    if o["run_id"] == live["runId"] and o.get("rows_processed_per_s", 0) > 0
                ),
                None,
            ),
            timeout_s=120,
        )
        assert report["state"] == "running" and report["watermark"].startswith("2026-01-01 ")
        assert report["lag_s"] >= 0 and report["lag_to_head_versions"] >= 0
        live_types = {
            e["label"]: e["__typename"]
            for o in stack.observation_entries(NAMES.live_asset, 100)
            if o["runId"] == live["runId"]
            for e in o["metadataEntries"]
        }
        assert live_types["watermark"] == "TextMetadataEntry" and live_types["last_batch_id"] == "TextMetadataEntry"
        assert live_types["rows_processed_per_s"] == "FloatMetadataEntry"
        assert live_types["lag_to_head_versions"] == "IntMetadataEntry"
        # While it runs, the live asset is never materialized (its run stays in progress in the UI).
        assert all(m["run_id"] != live["runId"] for m in stack.materializations(NAMES.live_asset))
        with browser_page() as page:  # the sink's and the live asset's plots
            _plots(page, f"{stack.url}/assets/{NAMES.sink}", "dagster/row_count")
            _shot(page, "sink_plots")
            _plots(page, f"{stack.url}/assets/{NAMES.live_asset}", "lag_s")
            _shot(page, "live_plots")
        assert _wait(
            "the freshness check passing",
            lambda: (e := stack.check_executions(NAMES.sink, NAMES.fresh)) and e[0]["success"],
            timeout_s=60,
            seen=lambda: stack.check_executions(NAMES.sink, NAMES.fresh)[:3],
        )
        running_check = _wait(
            "live_phase_running passing",
            lambda: (e := stack.check_executions(NAMES.live_asset, NAMES.live_running)) and e[0]["success"] and e[0],
            timeout_s=60,
            seen=lambda: stack.check_executions(NAMES.live_asset, NAMES.live_running)[:3],
        )
        assert running_check["live_state"] == "running" and running_check["run_id"] == live["runId"]

        # The live run's process is lost (SIGKILL, its JVM too) while new data waits: the live asset turns red in the
        # lineage and the catalog, its live_phase_running check fails (ERROR, "lost"), and sink_fresh fails at once,
        # though max_lag has not passed. Then the health sensor relaunches it from its checkpoint.
        t = time.monotonic()
        _kill_tree(stack.run_pid(live["runId"]))
        stack.wait_run(live["runId"], {"FAILURE"}, timeout_s=120)
        synthetic.append(spark, source_path, synthetic.event_batch(spark, rows=2000, keys=2000, batch_index=5))
        with browser_page() as page:
            node = wait_for_asset_state(lambda: asset_node_text(page, group_url, NAMES.live_asset), "Failed", 60)
            assert "Materializing" not in node, node
            _shot(page, "asset_graph_live_failed")
            wait_for_asset_state(lambda: catalog_row_text(page, catalog_url, NAMES.live_asset), "Failed", 60)
            _shot(page, "catalog_live_failed")
        timings["kill seen red in the UI"] = time.monotonic() - t
        lost = _wait(
            "live_phase_running failing with the live phase lost",
            lambda: next(
                (
                    e
                    for e in stack.check_executions(NAMES.live_asset, NAMES.live_running)
                    if e["success"] is False and e.get("live_state") == "lost"
                ),
                None,
            ),
            timeout_s=60,
            seen=lambda: stack.check_executions(NAMES.live_asset, NAMES.live_running)[:3],
        )
        assert lost["description"].startswith("lost: its process died"), lost
        stale = _wait(
            "sink_fresh failing at once: data waits and the live phase is lost",
            lambda: next(
                (
                    e
                    for e in stack.check_executions(NAMES.sink, NAMES.fresh)
                    if e["success"] is False
                    and e.get("live_state") == "lost"
                    and isinstance(e.get("behind"), int)
                    and e["behind"] >= 1
                ),
                None,
            ),
            timeout_s=60,
            seen=lambda: stack.check_executions(NAMES.sink, NAMES.fresh)[:3],
        )
        assert "the live phase is lost" in stale["description"], stale
        timings["failure seen"] = time.monotonic() - t
        failed = next(o for o in stack.observations(NAMES.live_asset) if o.get("state") == "lost")
        assert failed["run_id"] == live["runId"]
        # "Materialize all" right after the kill: it waits on no lease and turns no table red; the relaunch follows.
        after_kill = _materialize_all_in_the_browser(stack, group_url, "materialize_all_after_kill")
        stack.wait_run(after_kill, {"SUCCESS"}, timeout_s=300)
        for table in (NAMES.backlog, NAMES.state, NAMES.sink, NAMES.quarantine):
            assert stack.asset_status(table)["latest_run_status"] != "FAILURE", table
        relaunched = _wait(
            "a relaunched live run",
            lambda: next((r for r in stack.runs(NAMES.live_job) if r["runId"] != live["runId"]), None),
            timeout_s=120,
        )
        rtags = {tag["key"]: tag["value"] for tag in relaunched["tags"]}
        assert rtags["phases/relaunch"] == "1" and rtags["phases/relaunch_of"] == live["runId"]
        assert "failed" in rtags["phases/relaunch_reason"]
        stack.wait_for_message(relaunched["runId"], "live phase running", timeout_s=300)
        _wait_sink(p, expected_events + 2000)
        timings["relaunched and caught up"] = time.monotonic() - t
        assert _wait(
            "the freshness check passing again",
            lambda: (e := stack.check_executions(NAMES.sink, NAMES.fresh)) and e[0]["success"],
            timeout_s=60,
            seen=lambda: stack.check_executions(NAMES.sink, NAMES.fresh)[:3],
        )

        # "Materialize all" on the live pipeline: the backlog step does nothing, no table is marked failed, no live
        # run is started, and the switch sensor still reads the handoff's checks as passed.
        t = time.monotonic()
        tables = (NAMES.backlog, NAMES.state, NAMES.sink, NAMES.quarantine)
        before = {a: stack.latest_materialization(a)["run_id"] for a in (NAMES.backlog, NAMES.state)}
        # The button itself, in the browser: the group holds the tables and the live asset; the redeploy's assets are
        # in a group of their own (they stopped a healthy live phase when this button ran them).
        everything = _materialize_all_in_the_browser(stack, group_url, "materialize_all_healthy")
        stack.wait_run(everything, {"SUCCESS"}, timeout_s=300)
        assert not any("redeploy" in m for m in stack.messages(everything)), "the redeploy assets ran"
        assert any("not run: the pipeline has switched to live" in m for m in stack.messages(everything))
        assert {a: stack.latest_materialization(a)["run_id"] for a in before} == before
        for table in tables:
            assert stack.asset_status(table)["latest_run_status"] != "FAILURE", table
        assert [r["runId"] for r in stack.runs(NAMES.live_job)] == [relaunched["runId"], live["runId"]]
        assert stack.run_status(relaunched["runId"]) == "STARTED"
        # The redeploy group's "Materialize all": outside the redeploy job its assets do nothing and say why.
        redeploy_group = f"{stack.url}/locations/{LOCATION}/asset-groups/{NAMES.redeploy_group}"
        pressed = _materialize_all_in_the_browser(stack, redeploy_group, "materialize_all_redeploy", NAMES.swap)
        stack.wait_run(pressed, {"SUCCESS"}, timeout_s=300)
        assert any(f"runs only in {NAMES.redeploy_job}" in m for m in stack.messages(pressed))
        for asset in (NAMES.next_generation, NAMES.swap):
            assert stack.latest_materialization(asset) is None, asset
        assert stack.run_status(relaunched["runId"]) == "STARTED"
        assert [r["runId"] for r in stack.runs(NAMES.live_job)] == [relaunched["runId"], live["runId"]]
        restated = _wait(
            "the handoff's checks shown as passed again",
            lambda: all(
                (e := stack.check_executions(NAMES.backlog, c, 1)) and e[0]["success"] for c in (*CHECK_NAMES,)
            ),
            timeout_s=60,
            seen=lambda: {c: stack.check_executions(NAMES.backlog, c, 1) for c in CHECK_NAMES},
        )
        assert restated
        ticks = stack.sensor_ticks(NAMES.switch)
        assert not any("invalid" in (tick["skipReason"] or "") for tick in ticks), ticks
        timings["materialize all"] = time.monotonic() - t

        # Terminating from the UI is a clean stop: no step failure, the live asset says "stopped" and why, its
        # check warns that nothing runs, and the health sensor does not relaunch it.
        t = time.monotonic()
        with browser_page() as page:  # the user's way: the run page's Terminate button, then the dialog's
            page.goto(f"{stack.url}/runs/{relaunched['runId']}")
            page.get_by_role("button", name="Terminate").first.click()
            page.get_by_role("dialog").get_by_role("button", name="Terminate").click()
            page.goto(f"{stack.url}/assets/{NAMES.live_asset}")
            wait_for_texts(page, ("terminated: the run was asked to stop",), timeout_s=120)
            page.get_by_text("stopped", exact=True).first.wait_for(state="visible")
            _shot(page, "live_stopped")
        status = _wait(
            "the terminated run to end",
            lambda: (s := stack.run_status(relaunched["runId"])) in {"CANCELED", "SUCCESS"} and s,
            timeout_s=120,
        )
        timings["live run terminated"] = time.monotonic() - t
        events = stack.event_types(relaunched["runId"])
        assert "ExecutionStepFailureEvent" not in events, events
        stopped = stack.materializations(NAMES.live_asset)[0]
        assert stopped["run_id"] == relaunched["runId"] and stopped["state"] == "stopped", stopped
        assert stopped["reason"].startswith("terminated")
        _wait(
            "live_phase_running warning that the live phase is stopped",
            lambda: (
                (e := stack.check_executions(NAMES.live_asset, NAMES.live_running))
                and e[0]["success"] is False
                and e[0].get("live_state") == "stopped"
                and e[0]
            ),
            timeout_s=60,
            seen=lambda: stack.check_executions(NAMES.live_asset, NAMES.live_running)[:3],
        )
        with browser_page() as page:  # a stopped live phase: materialized, not running, and its check warns
            node = wait_for_asset_state(lambda: asset_node_text(page, group_url, NAMES.live_asset), "0 / 1 Passed")
            assert "Materializing" not in node and "Failed" not in node, node
            _shot(page, "asset_graph_live_stopped")
        _wait(
            "a health tick that saw the stop and did not relaunch",
            lambda: any("not relaunched" in (tick["skipReason"] or "") for tick in stack.sensor_ticks(NAMES.health)),
            timeout_s=60,
            seen=lambda: [tick["skipReason"] for tick in stack.sensor_ticks(NAMES.health)][:5],
        )
        assert len(stack.runs(NAMES.live_job)) == 2
        print(f"\nterminated run ended {status}")

        # Resuming from the live asset's own "Materialize" button (a run of the implicit asset job, not the live
        # job): the health sensor recognises it as the live phase.
        t = time.monotonic()
        resumed = _press_in_the_browser(
            stack, f"{stack.url}/assets/{NAMES.live_asset}", "Materialize", "resume_from_asset"
        )
        assert stack.run_status(resumed) in {"QUEUED", "STARTING", "STARTED"}, stack.run_status(resumed)
        stack.wait_for_message(resumed, "live phase running", timeout_s=300)
        seen = _wait_live_running_passes(stack, resumed, "the run started from the asset's page", timeout_s=60)
        assert seen and _wait(
            "the health sensor seeing that run",
            lambda: any(resumed in (tick["skipReason"] or "") for tick in stack.sensor_ticks(NAMES.health)),
            timeout_s=60,
            seen=lambda: [tick["skipReason"] for tick in stack.sensor_ticks(NAMES.health)][:5],
        )
        timings["resumed from the asset's page"] = time.monotonic() - t

        # The run started from the asset's page serves on into the second part: a redeploy stops it, as any live run.
        t = time.monotonic()
        _redeploy_then_roll_back(spark, stack, location, storage, source_path, resumed)
        timings["redeploy, relaunch and rollback"] = time.monotonic() - t
    finally:
        stack.stop()
        postgres.stop()
    timings["total"] = time.monotonic() - t0
    print("\nend-to-end timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))


# --- the second part: a deploy of changed code, the redeploy job, a relaunch of the new generation, a rollback ----
REDEPLOY_ROWS = 2000  # records a batch appended during the second part


def _accounted(pipeline, storage: StorageResource) -> tuple[int, int]:
    """(events counted in the sink, records in the serving generation's quarantine) of ``pipeline``."""
    where = storage.placement(pipeline)
    return _events_in(where.sink_path), len(table_stats.rows(where.quarantine) or [])


def _wait_exact(spark, pipeline, storage: StorageResource, source: str, stack: DagsterStack, live_run: str) -> None:
    """Waits until the sink and the quarantine account for every record of the source (counted in the source table
    itself); on a timeout it shows the counts, and the status and last messages of the run whose live phase should
    have applied them."""
    total = spark.read.format("delta").load(source).count()

    def seen() -> str:
        messages = "\n".join(m[:300] for m in stack.messages(live_run)[-25:])
        return f"{_accounted(pipeline, storage)} of {total}; run {live_run} {stack.run_status(live_run)}:\n{messages}"

    _wait(
        f"every one of {total} records counted in the sink or quarantined, once",
        lambda: sum(_accounted(pipeline, storage)) == total,
        timeout_s=240,
        seen=seen,
    )


def _wait_live_running_passes(stack: DagsterStack, run_id: str, what: str, timeout_s: float = 90):
    """Waits until the live asset's newest live_phase_running evaluation passes naming ``run_id``; returns it."""
    return _wait(
        f"live_phase_running passing for {what}",
        lambda: (
            (e := stack.check_executions(NAMES.live_asset, NAMES.live_running))
            and e[0]["success"]
            and run_id in e[0]["description"]
        ),
        timeout_s=timeout_s,
        seen=lambda: stack.check_executions(NAMES.live_asset, NAMES.live_running)[:3],
    )


def _columns(spark, path: str) -> list[str]:
    return spark.read.format("delta").load(path).columns


def _redeploy_then_roll_back(
    spark, stack: DagsterStack, location: DeployedLocation, storage, source: str, old_live: str
) -> None:
    """The second part: ``old_live`` is the run whose live phase serves (one started from the live asset's page)."""
    p = storage.placement(DEMO)
    batch_index = iter(range(100, 200))  # after the first part's batches: event times go on advancing

    def append_batch() -> None:
        batch = synthetic.event_batch(spark, rows=REDEPLOY_ROWS, keys=500, batch_index=next(batch_index))
        synthetic.append(spark, source, batch)

    append_batch()
    _wait_exact(spark, DEMO, storage, source, stack, old_live)
    assert stack.parents(NAMES.swap) == {NAMES.next_generation}

    # A deploy of changed code: the assets' code version (the definition's fingerprint) changes.
    assert stack.code_version(NAMES.backlog) == DEMO.fingerprint()
    location.deploy("DEMO_REVISED")
    stack.reload()
    assert stack.code_version(NAMES.backlog) == DEMO_REVISED.fingerprint()
    assert stack.code_version(NAMES.next_generation) == DEMO_REVISED.fingerprint()

    reason = "a five-minute watermark and a count of values"
    config = {"reason": reason}
    run_config = {"ops": {NAMES.next_generation: {"config": config}, NAMES.live_asset: {"config": config}}}
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
    _wait_exact(spark, DEMO_REVISED, storage, source, stack, redeploy)

    # The health sensor and the checks watch the generation that serves: the redeploy's run is its live phase.
    # (They read generation 0's handoff once, and said "stopped; not relaunched" while generation 1 served.)
    _wait_live_running_passes(stack, redeploy, "the redeploy's run")
    _wait(
        "sink_fresh passing while generation 1 serves",
        lambda: (e := stack.check_executions(NAMES.sink, NAMES.fresh)) and e[0]["success"],
        timeout_s=90,
        seen=lambda: stack.check_executions(NAMES.sink, NAMES.fresh)[:3],
    )
    # Its process lost: the live asset turns red in the lineage and the catalog, and the health sensor relaunches it,
    # from generation 1's handoff, after its backoff; the browser shows the relaunched run materializing.
    group_url, catalog_url = f"{stack.url}/locations/{LOCATION}/asset-groups/{NAMES.group}", f"{stack.url}/assets"
    _kill_tree(stack.run_pid(redeploy))
    stack.wait_run(redeploy, {"FAILURE"}, timeout_s=120)
    with browser_page() as page:
        node = wait_for_asset_state(lambda: asset_node_text(page, group_url, NAMES.live_asset), "Failed", 60)
        assert "Materializing" not in node, node
        _shot(page, "redeployed_live_failed")
        # The catalog row too, unless the health sensor relaunched it meanwhile: then the row materializes under the
        # relaunch's run id. Never as materializing under the killed run's.
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
    _wait_exact(spark, DEMO_REVISED, storage, source, stack, relaunched)
    _wait_live_running_passes(stack, relaunched, "the relaunched run")
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
    assert (back["run_id"], back["way"], back["from_generation"], back["generation"]) == (rollback, "rollback", 1, 0)
    assert "backlog_s" not in stack.latest_materialization(NAMES.next_generation)
    assert "valued" not in _columns(spark, p.consumer_sink)
    append_batch()
    _wait_exact(spark, DEMO, storage, source, stack, rollback)
    stack.terminate(rollback)
    stack.wait_run(rollback, {"SUCCESS", "CANCELED"}, timeout_s=120)
