"""Two chained pipelines in a real Dagster stack (webserver + daemon on PostgreSQL) and a real browser: the
downstream's lineage shows the upstream's sink as its input, and every button on it is safe. The downstream's
"Materialize all" before the upstream handed off (Dagster asks first: the upstream's sink was never materialized)
does nothing and says why; the upstream's starts the chain, which
the switch sensors carry to both live phases; the downstream's again, once it is live, does nothing either. Both
sinks then equal their references. The upstream is declared in YAML (a TwoPhasePipelineComponent in the location's
defs folder), the downstream in Python: one lineage across both ways; the location's Docs tab shows the component."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from phases import Pipeline
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names
from scripts.browser import browser_page, wait_for_texts
from scripts.dagster_stack import LOCATION, DagsterStack
from scripts.local_postgres import LocalPostgres
from tests import reference
from tests.helpers import write_source
from tests.phases.chains.test_pipeline_source import DOWN_SIZE_S, UP_SIZE_S
from tests.phases.operators.test_windows import emitted_windows
from tests.phases_dagster.test_pipeline_chain import DELAY_S, LATER, VERSIONS, S, _pipelines
from tests.test_end_to_end import SHORT_LIVED_JVM_OPTIONS, _press_in_the_browser, _shot, _wait

pytestmark = pytest.mark.slow

SENSOR_INTERVAL_S = 2
# The upstream declared the Dagster way (a Component's defs.yaml): the chain test's "minutes" pipeline, field for field.
UPSTREAM_YAML = f"""type: phases_dagster.TwoPhasePipelineComponent
attributes:
  pipeline:
    name: minutes
    source: {{kind: delta, path: src}}
    key_columns: [key]
    event_time: ts
    watermark_delay: PT{DELAY_S}S
    operator:
      kind: window_aggregate
      window: {{size: PT{UP_SIZE_S}S}}
      aggregations:
        - {{name: n, kind: count}}
        - {{name: total, kind: sum, column: value}}
        - {{name: hi, kind: max, column: value}}
    sink: {{kind: delta, path: minutes}}
    locations: {{root: engine/minutes}}
    checkpoint_interval: PT0.5S
  orchestration:
    checks: {{max_quarantine_fraction: 0.5}}
    switch: {{running_by_default: true, minimum_interval_seconds: {SENSOR_INTERVAL_S}}}
    health: {{running_by_default: true, minimum_interval_seconds: {SENSOR_INTERVAL_S}}}
"""
LOCATION_CODE = f'''"""The chain test's code location: the upstream declared in YAML (defs/), the downstream in
Python; sensors evaluated often and started with the daemon."""

from pathlib import Path

import dagster as dg

from phases_dagster import LiveHealth, SwitchPolicy, pipeline_definitions
from resources import RESOURCES
from tests.phases_dagster.test_pipeline_chain import LENIENT, _pipelines

SETTINGS = LENIENT.model_copy(
    update={{
        "switch": SwitchPolicy(minimum_interval_seconds={SENSOR_INTERVAL_S}, running_by_default=True),
        "health": LiveHealth(minimum_interval_seconds={SENSOR_INTERVAL_S}, running_by_default=True),
    }}
)
_, down = _pipelines()  # its source: the upstream's results (the same pipeline as the YAML's)
defs = dg.Definitions.merge(
    dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
    pipeline_definitions(down, SETTINGS),
    dg.Definitions(resources=RESOURCES, executor=dg.in_process_executor),
)
'''


def _location(folder: Path) -> Path:
    """The workspace file of a code location of this test's own: a dg project (``chain_location``) whose defs folder
    declares the upstream."""
    package = folder / "chain_location"
    (package / "defs" / "minutes").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "chain_location"\nversion = "0"\n\n[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "chain_location"\n'
    )
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "defs" / "minutes" / "defs.yaml").write_text(UPSTREAM_YAML)
    (package / "definitions.py").write_text(LOCATION_CODE)
    workspace = folder / "workspace.yaml"
    workspace.write_text(
        "load_from:\n"
        "  - python_file:\n"
        f"      relative_path: {package / 'definitions.py'}\n"
        "      attribute: defs\n"
        f"      working_directory: {folder}\n"
        f"      location_name: {LOCATION}\n"
    )
    return workspace


def _windows(spark, path: str) -> dict:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    return emitted_windows(spark.read.format("delta").load(path).collect())


def test_the_chain_in_the_ui_is_one_lineage_and_every_button_on_it_is_safe(spark, tmp_path):
    data_root = tmp_path / "data"
    up, down = _pipelines()
    ups, downs = Names(up), Names(down)
    assert Pipeline.model_validate(yaml.safe_load(UPSTREAM_YAML)["attributes"]["pipeline"]) == up
    storage = StorageResource(root=str(data_root))
    versions = {**VERSIONS, **LATER}
    write_source(spark, storage.placement(up).source_path(up.source), versions)
    size = UP_SIZE_S * S
    up_expected, _ = reference.run_windows(versions, DELAY_S * S, size, size)
    rows = [(key, start, out["total"]) for (key, start, _), out in up_expected.items()]
    down_expected, _ = reference.run_windows({1: rows}, 0, DOWN_SIZE_S * S, DOWN_SIZE_S * S)
    assert down_expected

    postgres = LocalPostgres(tmp_path / "postgres").start()
    stack = DagsterStack(
        tmp_path / "dagster_home",
        data_root,
        sensor_interval_s=SENSOR_INTERVAL_S,
        env={"JAVA_TOOL_OPTIONS": SHORT_LIVED_JVM_OPTIONS},
        storage_yaml=postgres.dagster_yaml(),
        workspace=_location(tmp_path / "code"),
    )
    try:
        stack.start()
        # One lineage: the downstream's backlog reads the upstream's sink; the downstream has no source asset.
        assert stack.parents(downs.backlog) == {ups.sink}
        down_group = f"{stack.url}/locations/{LOCATION}/asset-groups/{downs.group}"
        up_group = f"{stack.url}/locations/{LOCATION}/asset-groups/{ups.group}"
        with browser_page() as page:  # the downstream's group: the upstream's sink is the node its tables hang off
            page.goto(down_group)
            wait_for_texts(page, (ups.sink, downs.backlog, downs.state, downs.sink, downs.quarantine, downs.live_asset))
            _shot(page, "chain_lineage")
            # The code location's Docs tab: the component, its description and its attributes.
            page.goto(f"{stack.url}/locations/{LOCATION}/docs")
            page.get_by_text("phases_dagster", exact=True).first.click()
            page.get_by_text("phases_dagster.TwoPhasePipelineComponent", exact=True).first.click()
            wait_for_texts(page, ("a sorted Spark batch backlog", "How Dagster runs it", "Example defs.yaml"))
            _shot(page, "component_docs")

        # The downstream's "Materialize all" first: its backlog waits for the upstream's handoff, writes nothing.
        # Dagster asks first: the upstream's sink was never materialized. Confirmed, the run does nothing and says why.
        early = _press_in_the_browser(
            stack, down_group, "Materialize all", "chain_down_early", downs.live_asset, confirm=ups.sink
        )
        stack.wait_run(early, {"SUCCESS"}, timeout_s=300)
        assert any("'minutes', whose results it reads, has not handed off" in m for m in stack.messages(early))
        assert stack.latest_materialization(downs.backlog) is None

        # The upstream's "Materialize all": its backlog hands off and its live phase starts in that run; the
        # downstream's switch sensor then runs the downstream's backlog, then starts its live job.
        started = _press_in_the_browser(stack, up_group, "Materialize all", "chain_up", ups.live_asset)
        stack.wait_for_message(started, "live phase running", timeout_s=300)
        assert stack.latest_materialization(ups.backlog)["run_id"] == started  # pyright: ignore[reportOptionalSubscript]
        _wait("the downstream's backlog", lambda: stack.latest_materialization(downs.backlog), timeout_s=300)
        down_live = _wait("the downstream's live run", lambda: next(iter(stack.runs(downs.live_job)), None), 300)
        stack.wait_for_message(down_live["runId"], "live phase running", timeout_s=300)
        assert _windows(spark, f"{data_root}/minutes") == up_expected
        assert _windows(spark, f"{data_root}/hours") == down_expected

        # The downstream's "Materialize all" once it is live: nothing runs again, no table turns red.
        before = stack.latest_materialization(downs.backlog)["run_id"]  # pyright: ignore[reportOptionalSubscript]
        again = _press_in_the_browser(stack, down_group, "Materialize all", "chain_down_live", downs.live_asset)
        stack.wait_run(again, {"SUCCESS"}, timeout_s=300)
        assert any("not run: the pipeline has switched to live" in m for m in stack.messages(again))
        assert stack.latest_materialization(downs.backlog)["run_id"] == before  # pyright: ignore[reportOptionalSubscript]
        for table in (downs.backlog, downs.state, downs.sink, downs.quarantine):
            assert stack.asset_status(table)["latest_run_status"] != "FAILURE", table
    finally:
        stack.stop()
        postgres.stop()
