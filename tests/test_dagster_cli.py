"""Dagster's current CLI on this project: ``dg check defs`` and ``dg dev`` (the project's ``[tool.dg]`` settings)
load the same code location as ``dagster dev -w workspace.yaml``, without supersession warnings, and ``dg dev``
stops on SIGTERM even when started from a shell that ignored SIGINT."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.dagster_stack import LOCATION, PROJECT, DagsterStack

DG = str(Path(sys.executable).with_name("dg"))
ENV = {**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parent.parent), "PYTHONPATH": str(PROJECT)}


def test_dg_check_defs_loads_the_code_location():
    out = subprocess.run([DG, "check", "defs"], cwd=PROJECT, env=ENV, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "All definitions loaded successfully" in text
    assert "dg dev" not in text and "superseded" not in text.lower()


@pytest.mark.slow
def test_make_ui_serves_both_pipelines_with_dg_dev_and_stops_on_sigterm_when_started_in_the_background(tmp_path):
    """``make ui`` (scripts/ui.py -> ``dg dev``), started the way ``cmd &`` starts it: with SIGINT ignored."""
    stack = DagsterStack(tmp_path / "home", tmp_path / "data")  # used for its GraphQL helpers only
    log = open(tmp_path / "ui.log", "wb")  # noqa: SIM115 - closed below
    ui = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scripts.ui",
            "--home",
            str(tmp_path / "home"),
            "--data",
            str(tmp_path / "data"),
            "--port",
            str(stack.port),
        ],
        cwd=PROJECT,
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline, status = time.monotonic() + 180, None
        while True:
            assert ui.poll() is None, (tmp_path / "ui.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (
                f"code location not loaded in 180 s (last status {status!r}); the UI's log ends: "
                + (tmp_path / "ui.log").read_text()[-3000:]
            )
            with contextlib.suppress(OSError):
                status = stack._location_status()
                if status == "LOADED":
                    break
            time.sleep(0.5)
        data = stack.graphql(
            "{ assetNodes { assetKey { path } isPartitioned } "
            "workspaceOrError { ... on Workspace { locationEntries { name } } } }"
        )
        assert [e["name"] for e in data["workspaceOrError"]["locationEntries"]] == [LOCATION]
        nodes = {"/".join(n["assetKey"]["path"]): n["isPartitioned"] for n in data["assetNodes"]}
        assert nodes["demo_events_sink"] is False and nodes["demo_daily_backlog_slices"] is True
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=60) is not None  # it stopped: no kill needed
        text = (tmp_path / "ui.log").read_text()
        assert "superseded" not in text.lower() and "use `dg dev`" not in text, text[-2000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGKILL)
        log.close()
