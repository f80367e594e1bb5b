"""A pipeline declared as a Dagster Component (``defs.yaml``) builds the same definitions as its Python declaration:
asset keys, checks, sensors (and whether they start running), jobs, code versions (the fingerprint). ``dg scaffold
defs`` writes a commented YAML that loads as it is; a YAML mistake names the file, the field and the valid values."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox

from phases import Aggregation, DefinitionError, DeltaSink, DeltaSource, KeyedAggregate, Locations, Pipeline
from phases.feed import append, create_source
from phases_dagster import (
    Orchestration,
    TwoPhasePipelineComponent,
    default_resources,
    pipeline_definitions,
)
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names
from scripts.dagster_stack import free_port


def _python_pipeline(name: str) -> Pipeline:
    """What the scaffolded ``defs.yaml`` declares, in Python."""
    return Pipeline(
        name=name,
        source=DeltaSource(path=f"{name}/source"),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=timedelta(minutes=2),
        operator=KeyedAggregate(
            aggregations=[
                Aggregation(name="events", kind="count"),
                Aggregation(name="total", kind="sum", column="value"),
            ]
        ),
        sink=DeltaSink(path=f"{name}/sink"),
        locations=Locations(root=f"{name}/engine"),
    )


def _shape(defs: dg.Definitions) -> dict:
    """What a code location serves of ``defs``: assets with their code versions and dependencies, checks, sensors with
    their default status, jobs."""
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assets[key.to_user_string()] = (node.code_version, sorted(k.to_user_string() for k in node.parent_keys))
    checks = sorted(str(key) for key in graph.asset_check_keys)
    sensors = {s.name: s.default_status for s in defs.sensors or []}
    jobs = sorted(j.name for j in defs.resolve_all_job_defs())
    return {"assets": assets, "checks": checks, "sensors": sensors, "jobs": jobs}


# The project's resources, once for all its components (docs/components.md).
RESOURCES_PY = """import dagster as dg

from phases_dagster import default_resources


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(resources=default_resources())
"""


def test_a_scaffolded_yaml_declaration_builds_what_its_python_declaration_builds():
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=TwoPhasePipelineComponent, defs_path="clicks")
        (sandbox.defs_folder_path / "resources.py").write_text(RESOURCES_PY)
        text = (path / "defs.yaml").read_text()
        assert text.startswith("# A two-phase pipeline") and "running_by_default: false" in text
        with sandbox.build_component_tree() as tree:
            assert isinstance(tree.load_component(path), TwoPhasePipelineComponent)
            defs = tree.build_defs()
        # The Python declaration with the default settings: its sensors start stopped, as the YAML spells out.
        expected = dg.Definitions.merge(
            pipeline_definitions(_python_pipeline("clicks"), Orchestration()),
            dg.Definitions(resources=default_resources()),
        )
        assert _shape(defs) == _shape(expected)
        assert set(_shape(defs)["sensors"].values()) == {dg.DefaultSensorStatus.STOPPED}


def test_a_scaffolded_yaml_runs_as_it_is_and_a_changed_one_is_redeployed_by_its_job(spark, instance, tmp_path):
    """The scaffolded ``defs.yaml``, unedited, over the table ``phases.feed.create_source`` makes at the path it names:
    its backlog job hands off, and the sink holds each key's count and sum of the events (none late). Then the YAML
    gains an aggregation: the reloaded definitions' redeploy job builds the new generation, swaps it in and starts its
    live phase, as for a Python declaration; the sink holds the new column."""
    resources = {
        "spark": SparkResource(shuffle_partitions=2, stop_after_run=False),
        "storage": StorageResource(root=str(tmp_path)),
    }
    source = str(tmp_path / "clicks" / "source")
    create_source(spark, source)
    start = datetime(2026, 12, 1, 12, 0)
    events = [("a", start, 1), ("b", start + timedelta(seconds=5), 2), ("a", start + timedelta(seconds=9), 3)]
    append(spark, source, events[:2])
    append(spark, source, events[2:])
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=TwoPhasePipelineComponent, defs_path="clicks")
        declared = path / "defs.yaml"
        names = Names(Pipeline.model_validate(yaml.safe_load(declared.read_text())["attributes"]["pipeline"]))
        with sandbox.build_component_tree() as tree:
            defs = dg.Definitions.merge(tree.build_defs(), dg.Definitions(resources=resources))
        assert defs.resolve_job_def(names.backlog_job).execute_in_process(instance=instance).success
        rows = spark.read.format("delta").load(str(tmp_path / "clicks" / "sink")).collect()
        assert {row["key"]: (row["events"], row["total"]) for row in rows} == {"a": (2, 4), "b": (1, 2)}

        declared.write_text(
            declared.read_text().replace(
                "        - {name: total, kind: sum, column: value}\n",
                "        - {name: total, kind: sum, column: value}\n        - {name: top, kind: max, column: value}\n",
            )
        )
        with sandbox.build_component_tree() as tree:
            changed = dg.Definitions.merge(tree.build_defs(), dg.Definitions(resources=resources))
    config = {"reason": "one more aggregation", "stop_timeout_seconds": 120}
    live = {"report_interval_seconds": 1.0, "max_runtime_seconds": 2.0}
    run_config = {"ops": {names.next_generation: {"config": config}, names.live_asset: {"config": {**config, **live}}}}
    redeploy = changed.resolve_job_def(names.redeploy_job)
    assert redeploy.execute_in_process(instance=instance, run_config=run_config).success
    rows = spark.read.format("delta").load(str(tmp_path / "clicks" / "sink")).collect()
    assert {row["key"]: (row["events"], row["total"], row["top"]) for row in rows} == {"a": (2, 4, 3), "b": (1, 2, 2)}


def test_a_yaml_mistake_names_the_file_the_field_and_the_valid_values():
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=TwoPhasePipelineComponent, defs_path="clicks")
        declared = yaml.safe_load((path / "defs.yaml").read_text())
        declared["attributes"]["pipeline"]["operator"]["aggregations"][1]["kind"] = "median"
        (path / "defs.yaml").write_text(yaml.safe_dump(declared))
        (sandbox.defs_folder_path / "resources.py").write_text(RESOURCES_PY)
        with pytest.raises(Exception) as raised, sandbox.build_component_tree() as tree:
            tree.build_defs()
        error = raised.value
        while not isinstance(error, DefinitionError) and error.__cause__ is not None:
            error = error.__cause__
        assert isinstance(error, DefinitionError), repr(raised.value)
        message = str(error)
        assert f"{path / 'defs.yaml'}: attributes.pipeline" in message
        assert "operator.keyed_aggregate.aggregations.1.kind" in message and "'count'" in message, message


DG = str(Path(sys.executable).with_name("dg"))
DEFINITIONS_PY = """from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""


def _project(root: Path) -> dict[str, str]:
    """A user's own dg project in ``root`` (the layout docs/components.md shows), and the environment ``dg`` runs in."""
    package = root / "src" / "clickproj"
    (package / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "clickproj"\nversion = "0.1.0"\n\n[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "clickproj"\nregistry_modules = ["phases_dagster"]\n'
    )
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS_PY)
    (package / "defs" / "resources.py").write_text(RESOURCES_PY)
    return {**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parent.parent), "PYTHONPATH": str(root / "src")}


def _dg(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([DG, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_dg_lists_scaffolds_and_checks_the_component_in_a_users_own_project(tmp_path):
    env = _project(tmp_path)
    listed = _dg(tmp_path, env, "list", "components")
    assert "phases_dagster.TwoPhasePipelineComponent" in listed.stdout, listed.stdout + listed.stderr
    scaffolded = _dg(tmp_path, env, "scaffold", "defs", "phases_dagster.TwoPhasePipelineComponent", "clicks")
    assert scaffolded.returncode == 0, scaffolded.stderr
    declared = tmp_path / "src" / "clickproj" / "defs" / "clicks" / "defs.yaml"
    assert declared.read_text().startswith("# A two-phase pipeline")
    checked = _dg(tmp_path, env, "check", "defs")
    assert checked.returncode == 0 and "All definitions loaded successfully" in checked.stdout + checked.stderr
    _served_by_dg_dev_until_one_ctrl_c(tmp_path, env)
    declared.write_text(declared.read_text().replace("kind: sum, column: value", "kind: median, column: value"))
    broken = _dg(tmp_path, env, "check", "defs")
    said = broken.stdout + broken.stderr
    assert broken.returncode == 1, said
    assert f"{declared}: attributes.pipeline" in said
    assert "aggregations.1.kind: Input should be 'count', 'sum', 'min', 'max', 'avg' or 'reduce'" in said, said


SERVED = """{
  sensorsOrError(repositorySelector: {repositoryName: "__repository__", repositoryLocationName: "%(location)s"}) {
    ... on Sensors { results { name sensorState { status } } }
  }
  componentTypesForLocationOrError(locationName: "%(location)s") {
    ... on ComponentTypes { componentTypes { name description example schema } }
  }
}"""


def _served_by_dg_dev_until_one_ctrl_c(root: Path, env: dict[str, str]) -> None:
    """``dg dev`` serves the project: its pipeline's sensors are stopped on the new instance, the UI's Docs tab lists
    the component with its description and a whole example; then one Ctrl-C (SIGINT to the foreground process group,
    with the default disposition a terminal gives) stops every process it started."""
    port = free_port()
    home = root / "dagster_home"
    home.mkdir()
    dev = subprocess.Popen(
        [DG, "dev", "--host", "127.0.0.1", "--port", str(port)],
        cwd=root,
        env={**env, "DAGSTER_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        served = _wait_served(port, root.name, dev)
        sensors = {s["name"]: s["sensorState"]["status"] for s in served["sensorsOrError"]["results"]}
        assert sensors == {"clicks_switch": "STOPPED", "clicks_live_health": "STOPPED"}
        docs = {c["name"]: c for c in served["componentTypesForLocationOrError"]["componentTypes"]}
        listed = docs["phases_dagster.TwoPhasePipelineComponent"]
        assert listed["description"].startswith("A two-phase pipeline: a sorted Spark batch backlog")
        example = yaml.safe_load(listed["example"])["attributes"]
        assert example["pipeline"]["operator"]["kind"] == "keyed_aggregate"
        assert example["orchestration"]["switch"] == {"running_by_default": False}
        attributes = listed["schema"]["properties"]
        assert attributes["pipeline"]["description"].startswith("The pipeline's definition: the fields of")
        assert attributes["orchestration"]["description"].startswith("How Dagster runs it")
        os.killpg(dev.pid, signal.SIGINT)
        dev.wait(timeout=30)  # stuck past this is a hang, not slowness: it stops in about 2 s
        listed = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-s", str(dev.pid)], capture_output=True, text=True)
        running = [line for line in listed.stdout.splitlines() if line.split()[1][0] != "Z"]  # exited, not yet reaped
        assert running == [], f"processes of dg dev still running after Ctrl-C: {running}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(dev.pid, signal.SIGKILL)


def _wait_served(port: int, location: str, dev: subprocess.Popen, timeout_s: float = 120) -> dict:
    """What SERVED asks of ``dg dev`` on ``port``, once its code location answers."""
    body = json.dumps({"query": SERVED % {"location": location}}).encode()
    deadline = time.monotonic() + timeout_s
    while True:
        assert dev.poll() is None, f"dg dev exited with {dev.returncode}"
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/graphql", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                data = json.loads(response.read()).get("data") or {}
            if data.get("sensorsOrError", {}).get("results"):
                return data
        except OSError:
            pass
        assert time.monotonic() < deadline, f"dg dev did not serve {location} in {timeout_s:.0f} s"
        time.sleep(0.5)


def test_a_changed_yaml_reloads_with_the_new_definitions_code_version_and_its_redeploy_job():
    """A redeploy of a YAML-declared pipeline starts as a Python one's: the changed definition (a longer watermark
    delay) loads with its own fingerprint as the assets' code version, and the pipeline keeps its redeploy job."""
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=TwoPhasePipelineComponent, defs_path="clicks")
        (sandbox.defs_folder_path / "resources.py").write_text(RESOURCES_PY)
        with sandbox.build_component_tree() as tree:
            before = _shape(tree.build_defs())
        declared = path / "defs.yaml"
        declared.write_text(declared.read_text().replace("watermark_delay: PT2M", "watermark_delay: PT5M"))
        with sandbox.build_component_tree() as tree:
            after = _shape(tree.build_defs())
    changed = _python_pipeline("clicks").model_copy(update={"watermark_delay": timedelta(minutes=5)})
    assert before["assets"]["clicks_backlog"][0] == _python_pipeline("clicks").fingerprint()
    assert after["assets"]["clicks_backlog"][0] == changed.fingerprint() != before["assets"]["clicks_backlog"][0]
    assert "clicks_redeploy_job" in after["jobs"] and after["jobs"] == before["jobs"]
