"""The factory's definitions: what workspace.yaml loads, and what a daily-backfill pipeline adds."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import dagster as dg
import pytest

from assets.definitions import defs
from assets.pipelines import DEMO
from phases import Pipeline
from phases._internal.errors import DefinitionError
from phases_dagster.checks import CHECK_NAMES
from phases_dagster.factory import default_resources, pipeline_definitions
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import DailyBackfill, Names, Orchestration, SwitchPolicy
from tests.phases_dagster.conftest import relative_pipeline


def test_workspace_definitions_hold_the_demo_pipeline():
    names = Names(DEMO)
    graph = defs.resolve_asset_graph()
    assert {dg.AssetKey(names.backlog), dg.AssetKey(names.live_asset)} <= graph.get_all_asset_keys()
    checks = {k.name for k in graph.asset_check_keys}
    assert set(CHECK_NAMES) <= checks
    assert defs.resolve_job_def(names.live_job).executor_def is dg.in_process_executor
    assert defs.resolve_job_def(names.backlog_job).executor_def is dg.in_process_executor
    assert defs.resolve_sensor_def(names.switch).default_status is dg.DefaultSensorStatus.RUNNING


def test_a_daily_backfill_adds_partitioned_slices_and_a_schedule():
    p = relative_pipeline()
    names = Names(p)
    d = dg.Definitions.merge(
        pipeline_definitions(p, Orchestration(backfill=DailyBackfill(start_date=date(2026, 1, 1)))),
        dg.Definitions(resources=default_resources()),
    )
    slices = d.resolve_assets_def(names.slices)
    assert slices.partitions_def.get_first_partition_key() == "2026-01-01"
    assert d.resolve_schedule_def(names.schedule).job_name == names.slices_job
    assert dg.AssetKey(names.slices) in d.resolve_asset_graph().get(dg.AssetKey(names.backlog)).parent_keys


def test_storage_resolves_relative_paths_and_keeps_absolute_ones(tmp_path):
    declared = relative_pipeline()
    where = StorageResource(root=str(tmp_path)).placement(declared)
    assert where.source_path(declared.source) == f"{tmp_path}/src" and where.engine_root == f"{tmp_path}/engine"
    assert where.definition is declared and declared.source.path == "src"  # the definition is not changed
    absolute = relative_pipeline().model_copy(
        update={"sink": relative_pipeline().sink.model_copy(update={"path": "/x"})}
    )
    assert StorageResource(root=str(tmp_path)).placement(absolute).sink_path == "/x"


def test_orchestration_settings_are_validated_with_field_names():
    with pytest.raises(DefinitionError, match="hour_of_day"):
        DailyBackfill(start_date=date(2026, 1, 1), hour_of_day=24)
    with pytest.raises(DefinitionError, match="minimum_interval_seconds"):
        SwitchPolicy(minimum_interval_seconds=0)
    with pytest.raises(DefinitionError, match="max_quarantine_fraction"):
        Orchestration(checks={"max_quarantine_fraction": 2})


def test_the_asset_graph_is_the_tables_source_to_handoff_to_state_sink_and_quarantine():
    names = Names(DEMO)
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey
    assert graph.get(key(names.source)).is_observable  # an input written by others, observed
    assert graph.get(key(names.backlog)).parent_keys == {key(names.source)}
    for table in (names.state, names.sink, names.quarantine):
        assert graph.get(key(table)).parent_keys == {key(names.backlog)}
    # The live phase starts from the handoff's state; a redeploy's swap is the first part of its step in the redeploy
    # job (one multi-asset), so resuming from the live asset asks about no asset only a redeploy materializes.
    assert graph.get(key(names.live_asset)).parent_keys == {key(names.backlog), key(names.state)}
    assert graph.get(key(names.swap)).parent_keys == {key(names.next_generation)}
    assert graph.get(key(names.next_generation)).parent_keys == {key(names.source)}
    assert defs.resolve_job_def(names.redeploy_job).asset_layer.selected_asset_keys == {
        key(names.next_generation),
        key(names.swap),
        key(names.live_asset),
    }
    # The live job materializes the live asset; the health sensor targets it (the asset's automations).
    assert defs.resolve_job_def(names.live_job).asset_layer.selected_asset_keys == {key(names.live_asset)}
    assert defs.resolve_sensor_def(names.health).job_name == names.live_job
    assert dg.AssetCheckKey(key(names.sink), names.fresh) in graph.asset_check_keys
    backlog_checks = defs.resolve_job_def(names.backlog_job).asset_layer.asset_graph.asset_check_keys
    assert dg.AssetCheckKey(key(names.sink), names.fresh) not in backlog_checks  # the sensor's, not the backlog's


def test_catalog_metadata_comes_from_the_pipeline_definition():
    names = Names(DEMO)
    spec = defs.resolve_assets_def(names.sink).specs_by_key[dg.AssetKey(names.sink)]
    assert spec.owners == ["team:data-platform"] and spec.tags["domain"] == "demo"
    assert spec.code_version == DEMO.fingerprint() and spec.metadata["dagster/table_name"] == "demo_events.sink"
    assert DEMO.description in spec.description and spec.kinds == {"delta"}
    assert defs.resolve_assets_def(names.live_asset).specs_by_key[dg.AssetKey(names.live_asset)].kinds == {
        "spark",
        "delta",
    }


def test_default_definitions_show_a_keyed_and_a_daily_partitioned_pipeline():
    from assets.pipelines import DEMO_DAILY

    daily = Names(DEMO_DAILY)
    assert defs.resolve_assets_def(daily.slices).partitions_def is not None
    assert defs.resolve_schedule_def(daily.schedule).job_name == daily.slices_job


def test_owners_and_tags_are_validated_with_their_rule():
    with pytest.raises(DefinitionError, match="owner 'bob'.*team:<name>"):
        relative_pipeline(owners=["bob"])
    with pytest.raises(DefinitionError, match="tag key 'a b'"):
        relative_pipeline(tags={"a b": "x"})
    with pytest.raises(DefinitionError, match="tag 'tier': value"):
        relative_pipeline(tags={"tier": "x" * 64})
    assert relative_pipeline(owners=["a@b.io", "team:data"], tags={"dagster/x": ""}).fingerprint() == (
        relative_pipeline().fingerprint()
    )  # catalog fields never change the fingerprint


def test_the_demo_location_serves_the_yaml_declared_pipeline_beside_the_python_ones_with_its_sensors_stopped():
    """assets/defs/demo_yaml/defs.yaml (a TwoPhasePipelineComponent) is loaded by the same code location as the
    Python-declared pipelines: its tables, its jobs, and its Spark-launching sensors stopped until turned on."""
    names = Names(Pipeline.model_validate(_demo_yaml()))
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey(names.source) in graph.get(dg.AssetKey(names.backlog)).parent_keys
    for sensor in (names.switch, names.health):
        assert defs.resolve_sensor_def(sensor).default_status is dg.DefaultSensorStatus.STOPPED
    assert defs.resolve_job_def(names.redeploy_job) is not None


def _demo_yaml() -> dict:
    import yaml

    path = Path(__file__).resolve().parents[2] / "assets" / "defs" / "demo_yaml" / "defs.yaml"
    return yaml.safe_load(path.read_text())["attributes"]["pipeline"]
