"""End to end through a real Dagster stack: webserver + daemon on a loopback port, the backlog launched over
GraphQL, the switch sensor launching the live run, new data reaching the sink, the live run terminated
from outside, the materialization metadata read back, and a headless Chromium screenshot of the asset graph."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

from pyspark.sql import functions as F

from assets.checks import CHECK_NAMES, NO_FAR_FUTURE
from assets.pipelines import DEMO
from assets.settings import Names
from phases import synthetic
from resources.storage import StorageResource
from scripts.dagster_stack import DagsterStack, screenshot

NAMES = Names(DEMO)


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


def test_backlog_sensor_live_and_termination_through_the_dagster_ui(spark, tmp_path):
    data_root, timings = tmp_path / "data", {}
    p = StorageResource(root=str(data_root)).resolve(DEMO)
    synthetic.create_source(spark, p.source.path)
    for i in range(4):
        synthetic.append(spark, p.source.path, synthetic.event_batch(spark, rows=5000, keys=2000, batch_index=i))

    stack = DagsterStack(tmp_path / "dagster_home", data_root, sensor_interval_s=2)
    t0 = time.monotonic()
    timings["stack loaded"] = stack.start()
    try:
        t = time.monotonic()
        dom = screenshot(
            f"{stack.url}/asset-groups", tmp_path / "asset_graph.png", wait_for=(NAMES.backlog, NAMES.live_asset)
        )
        timings["screenshot"] = time.monotonic() - t
        assert NAMES.backlog in dom and NAMES.live_asset in dom
        width, height, colours = _png_size_and_colours(tmp_path / "asset_graph.png")
        assert (width, height) == (1600, 1000) and colours > 10, "blank screenshot"

        t = time.monotonic()
        backlog_run = stack.launch(NAMES.backlog_job)
        stack.wait_run(backlog_run, {"SUCCESS"}, timeout_s=400)
        timings["backlog run"] = time.monotonic() - t
        meta = stack.latest_materialization(NAMES.backlog)
        assert meta["run_id"] == backlog_run and meta["source_version"] == 4
        assert meta["input_rows"] == 20_000 and meta["keys"] > 1000 and meta["rows_per_s"] > 0
        assert meta["quarantined_rows"] == meta["late_rows"] + meta["invalid_rows"]
        checks = stack.check_results(backlog_run)
        assert set(checks) == {*CHECK_NAMES, NO_FAR_FUTURE} and all(checks.values()), checks

        t = time.monotonic()
        live = stack.wait_for_run_of(NAMES.live_job, timeout_s=120)
        timings["sensor launched live"] = time.monotonic() - t
        tags = {tag["key"]: tag["value"] for tag in live["tags"]}
        assert tags["dagster/run_key"] == f"live:{meta['manifest_id']}"
        assert tags["dagster/sensor_name"] == NAMES.switch
        stack.wait_for_message(live["runId"], "live phase running", timeout_s=300)
        timings["live phase running"] = time.monotonic() - t

        t = time.monotonic()
        synthetic.append(spark, p.source.path, synthetic.event_batch(spark, rows=3000, keys=2000, batch_index=4))
        expected_events = meta["aggregated_rows"] + 3000  # every new record is on time (no late fraction hit)
        deadline = time.monotonic() + 180
        total = None
        while time.monotonic() < deadline:
            total = spark.read.format("delta").load(p.sink.path).agg(F.sum("events")).collect()[0][0]
            late_live = spark.read.format("delta").load(p.locations.quarantine).filter("phase = 'live'").count()
            if total == expected_events - late_live:
                break
            time.sleep(1)
        assert total == expected_events - late_live, (total, expected_events, late_live)
        timings["new version in sink"] = time.monotonic() - t

        t = time.monotonic()
        stack.terminate(live["runId"])
        stack.wait_run(live["runId"], {"CANCELED"}, timeout_s=120)
        timings["live run terminated"] = time.monotonic() - t
        messages = stack.messages(live["runId"])
        assert any("live phase queries stopped" in m for m in messages)
        observations = stack.observations(NAMES.live_asset)
        assert any(o.get("event") == "started" for o in observations)
        ticks = stack.sensor_ticks(NAMES.switch)
        assert any(live["runId"] in tick["runIds"] for tick in ticks) or any(
            "already launched" in (tick["skipReason"] or "") for tick in ticks
        )
    finally:
        stack.stop()
    timings["total"] = time.monotonic() - t0
    print("\nend-to-end timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
