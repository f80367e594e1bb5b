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


# The services' console level. At "info" the daemon writes two lines per sensor tick ("Checking for new runs for
# sensor", "Sensor ... skipped: <reason>"): with two pipelines' four sensors they were most of the log. Each tick's
# reason is kept with the tick (Automation → the sensor); warnings and errors still show.
LOG_LEVEL = "warning"


def dev_command(port: int, workspace_yaml: bool | str = False, log_level: str = LOG_LEVEL) -> tuple[str, list[str]]:
    """(program, argv) of the UI, run in the project folder: ``dg dev`` (the project's ``[tool.dg]``), or
    ``dagster dev -w workspace.yaml`` (``workspace_yaml``: True, or the path of another workspace file);
    ``log_level``: the services' console level."""
    if workspace_yaml:
        dagster = str(Path(sys.executable).with_name("dagster"))
        return dagster, [
            dagster,
            "dev",
            "-w",
            workspace_yaml if isinstance(workspace_yaml, str) else "workspace.yaml",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "--log-level",
            log_level,
        ]
    dg = str(Path(sys.executable).with_name("dg"))
    return dg, [dg, "dev", "--host", "127.0.0.1", "--port", str(port), "--log-level", log_level]


def prepare_home(home: Path, storage_yaml: str = "") -> None:
    """A DAGSTER_HOME with telemetry off and run monitoring on; ``storage_yaml`` (a ``storage:`` section, e.g.
    :meth:`scripts.local_postgres.LocalPostgres.dagster_yaml`) replaces the default SQLite files under it."""
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(DAGSTER_YAML + storage_yaml)


class DeployedLocation:
    """A code location of its own in ``folder`` (its ``workspace.yaml`` and ``location.py``), serving the demo
    pipeline as one of its revisions: :meth:`deploy` writes the code a deploy of changed code would bring, and
    :meth:`DagsterStack.reload` loads it. ``pipeline``: a name in :mod:`assets.pipelines` (``DEMO``,
    ``DEMO_REVISED``)."""

    CODE = (
        '"""The code location a deploy loads: the demo pipeline as {pipeline}."""\n\n'
        "from assets.definitions import build_definitions\n"
        "from assets.pipelines import {pipeline}\n\n"
        "defs = build_definitions({pipeline})\n"
    )

    def __init__(self, folder: Path, pipeline: str = "DEMO"):
        self.folder = Path(folder).resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.workspace = self.folder / "workspace.yaml"
        self.workspace.write_text(
            "load_from:\n"
            "  - python_file:\n"
            f"      relative_path: {self.folder / 'location.py'}\n"
            "      attribute: defs\n"
            f"      working_directory: {PROJECT}\n"
            f"      location_name: {LOCATION}\n"
        )
        self.deploy(pipeline)

    def deploy(self, pipeline: str) -> None:
        (self.folder / "location.py").write_text(self.CODE.format(pipeline=pipeline))


class DagsterStack:
    def __init__(
        self,
        home: Path,
        data_root: Path,
        *,
        port: int | None = None,
        sensor_interval_s: int = 2,
        env: dict[str, str] | None = None,
        cli: str = "dagster",
        storage_yaml: str = "",
        workspace: Path | None = None,
    ):
        """``env``: more environment for the stack (e.g. ``PHASES_RELAUNCH_BACKOFF_S``, ``PHASES_SINK_MAX_LAG_S``).
        ``cli``: ``dagster`` (``dagster dev -w workspace.yaml``) or ``dg`` (``dg dev`` with the project's
        ``[tool.dg]`` settings). ``storage_yaml``: the instance's storage (default: SQLite under ``home``).
        ``workspace``: another workspace file than the project's (a code location of a test's own, e.g. one whose
        definitions a test changes and reloads, :meth:`reload`)."""
        if cli not in ("dagster", "dg"):
            raise ValueError(f"cli must be 'dagster' or 'dg'; got {cli!r}")
        self.cli = cli
        self.storage_yaml = storage_yaml
        self.workspace = workspace
        self.extra_env = dict(env or {})
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
        prepare_home(self.home, self.storage_yaml)
        env = {
            **os.environ,
            "DAGSTER_HOME": str(self.home),
            "PHASES_DATA_ROOT": str(self.data_root),
            "PHASES_SENSOR_INTERVAL_S": str(self.sensor_interval_s),
            "PYTHONPATH": str(PROJECT),
            **self.extra_env,
        }
        if self.cli == "dg":
            env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
        workspace = str(self.workspace) if self.workspace is not None else self.cli == "dagster"
        _, cmd = dev_command(self.port, workspace_yaml=workspace)
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

    def reload(self, timeout_s: float = 180) -> None:
        """Reloads the code location (what a deploy of changed code does) and waits until it is loaded again."""
        data = self.graphql(
            "mutation($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) { __typename "
            "... on PythonError { message } } }",
            {"name": LOCATION},
        )
        if data["reloadRepositoryLocation"]["__typename"] == "PythonError":
            raise StackError(f"reloading the code location failed: {data['reloadRepositoryLocation']}")
        deadline = time.monotonic() + timeout_s
        while self._location_status() != "LOADED":
            if time.monotonic() > deadline:
                raise StackError(f"code location not loaded again after {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.5)

    def code_version(self, asset: str) -> str | None:
        """The asset's code version as the UI shows it."""
        data = self.graphql(
            "query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode { opVersion } } }",
            {"key": {"path": [asset]}},
        )
        return data["assetNodeOrError"].get("opVersion")

    def launch(self, job_name: str, run_config: dict | None = None, tags: dict | None = None) -> str:
        return self.client().submit_job_execution(
            job_name,
            repository_location_name=LOCATION,
            repository_name=REPOSITORY,
            run_config=run_config or {},
            tags=tags,
        )

    def materialize(self, assets: list[str], checks: list[tuple[str, str]] | None = None) -> str:
        """Launches what the UI's "Materialize" / "Materialize all" buttons launch: a run of the implicit asset job
        with ``assets`` and their ``checks`` ((asset, check name) pairs) selected. Returns the run id."""
        data = self.graphql(
            "mutation($params: ExecutionParams!) { launchPipelineExecution(executionParams: $params) { __typename "
            "... on LaunchRunSuccess { run { runId } } ... on PythonError { message } "
            "... on InvalidSubsetError { message } ... on RunConfigValidationInvalid { errors { message } } } }",
            {
                "params": {
                    "selector": {
                        "repositoryLocationName": LOCATION,
                        "repositoryName": REPOSITORY,
                        "pipelineName": "__ASSET_JOB",
                        "assetSelection": [{"path": [a]} for a in assets],
                        "assetCheckSelection": [
                            {"assetKey": {"path": [a]}, "name": name} for a, name in (checks or [])
                        ],
                    },
                    "mode": "default",
                    "executionMetadata": {"tags": []},
                }
            },
        )
        out = data["launchPipelineExecution"]
        if out["__typename"] != "LaunchRunSuccess":
            raise StackError(f"materializing {assets} was refused: {out}")
        return out["run"]["runId"]

    def asset_status(self, asset: str) -> dict:
        """What the lineage graph's node and the catalog show of an asset's materialization: its latest
        materialization's run, the latest run that planned it (status) and the runs in progress for it."""
        data = self.graphql(
            "query($keys: [AssetKeyInput!]!) { assetsLatestInfo(assetKeys: $keys) { inProgressRunIds "
            "unstartedRunIds latestMaterialization { runId } latestRun { runId status } } }",
            {"keys": [{"path": [asset]}]},
        )
        [info] = data["assetsLatestInfo"]
        return {
            "materialized_run": (info["latestMaterialization"] or {}).get("runId"),
            "latest_run": (info["latestRun"] or {}).get("runId"),
            "latest_run_status": (info["latestRun"] or {}).get("status"),
            "in_progress": info["inProgressRunIds"] + info["unstartedRunIds"],
        }

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
            "{ events { __typename ... on MessageEvent { message } ... on ErrorEvent { error { message } } } } } } }",
            {"id": run_id, "limit": limit},
        )
        # A failed step's message says only that it failed: its error's first line follows it.
        return [
            (e.get("message") or "") + (f": {e['error']['message'].strip()[:500]}" if e.get("error") else "")
            for e in data["runOrError"]["eventConnection"]["events"]
        ]

    def event_types(self, run_id: str, limit: int = 2000) -> list[str]:
        data = self.graphql(
            "query($id: ID!, $limit: Int) { runOrError(runId: $id) { ... on Run { eventConnection(limit: $limit) "
            "{ events { __typename } } } } }",
            {"id": run_id, "limit": limit},
        )
        return [e["__typename"] for e in data["runOrError"]["eventConnection"]["events"]]

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
            if e.get("__typename") == "JsonMetadataEntry":
                out[e["label"]] = json.loads(e["jsonString"])
                continue
            if e.get("__typename") == "TableSchemaMetadataEntry":
                out[e["label"]] = e["schema"]["columns"]
                continue
            for field in ("intValue", "floatValue", "text", "path", "url", "timestamp", "boolValue"):
                if field in e and e[field] is not None:
                    out[e["label"]] = e[field]
                    break
        return out

    _ENTRIES = (
        "metadataEntries { __typename label ... on IntMetadataEntry { intValue } "
        "... on FloatMetadataEntry { floatValue } ... on TextMetadataEntry { text } ... on PathMetadataEntry { path } "
        "... on UrlMetadataEntry { url } ... on JsonMetadataEntry { jsonString } "
        "... on TableSchemaMetadataEntry { schema { columns { name type } } } "
        "... on TimestampMetadataEntry { timestamp } ... on BoolMetadataEntry { boolValue } }"
    )

    def materialization_entries(self, asset: str, limit: int = 50) -> list[dict]:
        """The raw metadata entries (with their GraphQL type) of the asset's newest materializations."""
        data = self.graphql(
            "query($path: [String!]!, $limit: Int) { assetOrError(assetKey: {path: $path}) { ... on Asset { "
            f"assetMaterializations(limit: $limit) {{ runId timestamp {self._ENTRIES} }} }} }} }}",
            {"path": [asset], "limit": limit},
        )
        return (data["assetOrError"] or {}).get("assetMaterializations") or []

    def materializations(self, asset: str, limit: int = 50) -> list[dict]:
        return [
            {"run_id": m["runId"], **self._metadata(m["metadataEntries"])}
            for m in self.materialization_entries(asset, limit)
        ]

    def parents(self, asset: str) -> set[str]:
        data = self.graphql(
            "query($path: [String!]!) { assetNodeOrError(assetKey: {path: $path}) { ... on AssetNode { "
            "dependencyKeys { path } } } }",
            {"path": [asset]},
        )
        return {"/".join(k["path"]) for k in data["assetNodeOrError"]["dependencyKeys"]}

    def check_executions(self, asset: str, check: str, limit: int = 50) -> list[dict]:
        """Evaluations of one asset check, newest first: status, success, description, metadata."""
        data = self.graphql(
            "query($key: AssetKeyInput!, $check: String!, $limit: Int!) { assetCheckExecutions(assetKey: $key, "
            "checkName: $check, limit: $limit) { runId status timestamp evaluation { success description "
            f"{self._ENTRIES} }} }} }}",
            {"key": {"path": [asset]}, "check": check, "limit": limit},
        )
        out = []
        for e in data["assetCheckExecutions"]:
            ev = e["evaluation"] or {}
            out.append(
                {
                    "run_id": e["runId"],
                    "status": e["status"],
                    "success": ev.get("success"),
                    "description": ev.get("description"),
                    **self._metadata(ev.get("metadataEntries") or []),
                }
            )
        return out

    def run_pid(self, run_id: str) -> int:
        """The process id of a run's worker, from its 'Started process for run (pid: N)' engine event."""
        for message in self.messages(run_id):
            if "Started process for run" in message and "pid: " in message:
                return int(message.split("pid: ")[1].split(")")[0])
        raise StackError(f"run {run_id} logged no process id")

    def latest_materialization(self, asset: str) -> dict | None:
        data = self.graphql(
            "query($path: [String!]!) { assetOrError(assetKey: {path: $path}) { ... on Asset { "
            f"assetMaterializations(limit: 1) {{ runId {self._ENTRIES} }} }} }} }}",
            {"path": [asset]},
        )
        mats = (data["assetOrError"] or {}).get("assetMaterializations") or []
        return {"run_id": mats[0]["runId"], **self._metadata(mats[0]["metadataEntries"])} if mats else None

    def observation_entries(self, asset: str, limit: int = 20) -> list[dict]:
        """The raw metadata entries (with their GraphQL type) of the asset's newest observations."""
        data = self.graphql(
            "query($path: [String!]!, $limit: Int) { assetOrError(assetKey: {path: $path}) { ... on Asset { "
            f"assetObservations(limit: $limit) {{ runId {self._ENTRIES} }} }} }} }}",
            {"path": [asset], "limit": limit},
        )
        return (data["assetOrError"] or {}).get("assetObservations") or []

    def observations(self, asset: str, limit: int = 20) -> list[dict]:
        return [
            {"run_id": o["runId"], **self._metadata(o["metadataEntries"])}
            for o in self.observation_entries(asset, limit)
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
