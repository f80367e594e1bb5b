"""A real Dagster stack (webserver + daemon via ``dagster dev``) on a loopback port, driven over GraphQL.

Used by the demo and the end-to-end test. Runs persist under ``home`` (``DAGSTER_HOME``); the pipelines'
Delta tables live under ``data_root`` (``PHASES_DATA_ROOT``, read by the storage resource).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from dagster_graphql import DagsterGraphQLClient

PROJECT = Path(__file__).resolve().parent.parent
LOCATION = "two_phase_pipelines"
REPOSITORY = "__repository__"

DAGSTER_YAML = """\
telemetry:
  enabled: false
nux:
  enabled: false
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
"""


class StackError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_home(home: Path) -> None:
    """A DAGSTER_HOME with telemetry off and run monitoring on (runs of dead processes get marked failed)."""
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(DAGSTER_YAML)


class DagsterStack:
    def __init__(self, home: Path, data_root: Path, *, port: int | None = None, sensor_interval_s: int = 2):
        self.home = Path(home).resolve()
        self.data_root = Path(data_root).resolve()
        self.port = port or free_port()
        self.sensor_interval_s = sensor_interval_s
        self.proc: subprocess.Popen | None = None
        self.log_path = self.home / "dagster-dev.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout_s: float = 180) -> float:
        """Starts ``dagster dev`` and waits until the code location is loaded; returns the seconds taken."""
        prepare_home(self.home)
        env = {
            **os.environ,
            "DAGSTER_HOME": str(self.home),
            "PHASES_DATA_ROOT": str(self.data_root),
            "PHASES_SENSOR_INTERVAL_S": str(self.sensor_interval_s),
            "PYTHONPATH": str(PROJECT),
        }
        dagster = Path(sys.executable).with_name("dagster")
        cmd = [str(dagster), "dev", "-w", str(PROJECT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(self.port)]
        started = time.monotonic()
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            cwd=PROJECT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A shell started with & ignores SIGINT, and dagster dev then ignores SIGTERM too (DAGSTER_NOTES).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self._log = log
        while True:
            if self.proc.poll() is not None:
                raise StackError(f"dagster dev exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() - started > timeout_s:
                raise StackError(f"code location not loaded after {timeout_s:.0f} s; see {self.log_path}")
            try:
                status = self._location_status()
                if status == "LOADED":
                    return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # anything left in the session (code servers, run workers)
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()
        self.proc = None

    def __enter__(self) -> DagsterStack:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- GraphQL -----------------------------------------------------------------------------------
    def graphql(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            out = json.loads(resp.read())
        if out.get("errors"):
            raise StackError(f"GraphQL errors: {out['errors']}")
        return out["data"]

    def client(self) -> DagsterGraphQLClient:
        return DagsterGraphQLClient("127.0.0.1", port_number=self.port)

    def _location_status(self) -> str | None:
        data = self.graphql(
            "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
            "locationOrLoadError { __typename ... on PythonError { message } } } } } }"
        )
        for entry in data["workspaceOrError"]["locationEntries"]:
            if entry["name"] == LOCATION:
                err = entry["locationOrLoadError"]
                if err and err["__typename"] == "PythonError":
                    raise StackError(f"code location failed to load: {err['message']}")
                return entry["loadStatus"]
        return None

    def launch(self, job_name: str, run_config: dict | None = None) -> str:
        return self.client().submit_job_execution(
            job_name, repository_location_name=LOCATION, repository_name=REPOSITORY, run_config=run_config or {}
        )

    def run_status(self, run_id: str) -> str:
        return self.client().get_run_status(run_id).value

    def wait_run(self, run_id: str, statuses: set[str], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.run_status(run_id)
            if status in statuses:
                return status
            if status in {"FAILURE", "CANCELED"} and status not in statuses:
                raise StackError(f"run {run_id} ended {status}:\n" + "\n".join(self.messages(run_id)[-15:]))
            if time.monotonic() > deadline:
                raise StackError(f"run {run_id} still {status} after {timeout_s:.0f} s")
            time.sleep(1)

    def runs(self, job_name: str) -> list[dict]:
        data = self.graphql(
            "query($job: String!) { runsOrError(filter: {pipelineName: $job}) { ... on Runs { results { "
            "runId status tags { key value } } } } }",
            {"job": job_name},
        )
        return data["runsOrError"]["results"]

    def wait_for_run_of(self, job_name: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            runs = self.runs(job_name)
            if runs:
                return runs[0]
            time.sleep(1)
        raise StackError(f"no run of {job_name} after {timeout_s:.0f} s")

    def terminate(self, run_id: str) -> None:
        self.client().terminate_run(run_id)

    def messages(self, run_id: str, limit: int = 1000) -> list[str]:
        data = self.graphql(
            "query($id: ID!, $limit: Int) { runOrError(runId: $id) { ... on Run { eventConnection(limit: $limit) "
            "{ events { __typename ... on MessageEvent { message } } } } } }",
            {"id": run_id, "limit": limit},
        )
        return [e.get("message") or "" for e in data["runOrError"]["eventConnection"]["events"]]

    def wait_for_message(self, run_id: str, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(text in m for m in self.messages(run_id)):
                return
            status = self.run_status(run_id)
            if status in {"FAILURE", "CANCELED", "SUCCESS"}:
                raise StackError(f"run {run_id} ended {status} before logging {text!r}")
            time.sleep(1)
        raise StackError(f"run {run_id} did not log {text!r} within {timeout_s:.0f} s")

    def _metadata(self, entries: list[dict]) -> dict:
        out = {}
        for e in entries:
            for field in ("intValue", "floatValue", "text", "path", "timestamp", "boolValue"):
                if field in e and e[field] is not None:
                    out[e["label"]] = e[field]
                    break
        return out

    _ENTRIES = (
        "metadataEntries { label ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue } "
        "... on TextMetadataEntry { text } ... on PathMetadataEntry { path } "
        "... on TimestampMetadataEntry { timestamp } ... on BoolMetadataEntry { boolValue } }"
    )

    def latest_materialization(self, asset: str) -> dict | None:
        data = self.graphql(
            "query($path: [String!]!) { assetOrError(assetKey: {path: $path}) { ... on Asset { "
            f"assetMaterializations(limit: 1) {{ runId {self._ENTRIES} }} }} }} }}",
            {"path": [asset]},
        )
        mats = (data["assetOrError"] or {}).get("assetMaterializations") or []
        return {"run_id": mats[0]["runId"], **self._metadata(mats[0]["metadataEntries"])} if mats else None

    def observations(self, asset: str, limit: int = 20) -> list[dict]:
        data = self.graphql(
            "query($path: [String!]!, $limit: Int) { assetOrError(assetKey: {path: $path}) { ... on Asset { "
            f"assetObservations(limit: $limit) {{ runId {self._ENTRIES} }} }} }} }}",
            {"path": [asset], "limit": limit},
        )
        return [
            {"run_id": o["runId"], **self._metadata(o["metadataEntries"])}
            for o in (data["assetOrError"] or {}).get("assetObservations") or []
        ]

    def check_results(self, run_id: str) -> dict[str, bool]:
        events = self.graphql(
            "query($id: ID!) { runOrError(runId: $id) { ... on Run { eventConnection(limit: 1000) { events { "
            "__typename ... on AssetCheckEvaluationEvent { evaluation { checkName success } } } } } } }",
            {"id": run_id},
        )["runOrError"]["eventConnection"]["events"]
        return {
            e["evaluation"]["checkName"]: e["evaluation"]["success"]
            for e in events
            if e["__typename"] == "AssetCheckEvaluationEvent"
        }

    def sensor_ticks(self, sensor: str, limit: int = 10) -> list[dict]:
        data = self.graphql(
            "query($sel: SensorSelector!, $limit: Int) { sensorOrError(sensorSelector: $sel) { ... on Sensor { "
            "sensorState { status ticks(limit: $limit) { status skipReason runIds } } } } }",
            {
                "sel": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "sensorName": sensor},
                "limit": limit,
            },
        )
        return data["sensorOrError"]["sensorState"]["ticks"]


def screenshot(
    url: str,
    png: Path,
    *,
    width: int = 1600,
    height: int = 1000,
    wait_for: tuple[str, ...] = (),
    timeout_s: float = 180.0,
) -> str:
    """A headless Chromium screenshot of ``url``; returns the rendered DOM (for text checks).

    Headless Chromium has no "wait for element" flag, only a virtual-time budget after which it dumps the
    page. One fixed budget is a race with the UI's own loading (a full-suite run once got the DOM before the
    asset names had rendered), so the DOM is dumped with a growing budget until every text in ``wait_for`` is
    in it, up to ``timeout_s``; only then is the picture taken, with the budget that worked.
    """
    chromium = next((c for c in ("chromium", "chromium-browser") if _which(c)), None)
    if chromium is None:
        raise StackError("chromium is not installed (scripts/setup.sh installs Debian's chromium package)")
    base = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
    ]
    deadline, budget_ms, dom = time.monotonic() + timeout_s, 10_000, ""
    while True:
        flags = [*base, f"--virtual-time-budget={budget_ms}"]
        out = subprocess.run([chromium, *flags, "--dump-dom", url], check=True, capture_output=True, timeout=180)
        dom = out.stdout.decode(errors="replace")
        missing = [text for text in wait_for if text not in dom]
        if not missing:
            break
        if time.monotonic() > deadline:
            raise StackError(f"{url} did not show {missing} within {timeout_s:.0f} s")
        budget_ms = min(budget_ms * 2, 60_000)
        time.sleep(1)
    subprocess.run([chromium, *flags, f"--screenshot={png}", url], check=True, capture_output=True, timeout=180)
    return dom


def _which(cmd: str) -> bool:
    from shutil import which

    return which(cmd) is not None
