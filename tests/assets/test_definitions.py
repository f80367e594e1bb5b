"""The factory's definitions: what workspace.yaml loads, and what a daily-backfill pipeline adds."""

from __future__ import annotations

from datetime import date

import dagster as dg
import pytest

from assets.checks import CHECK_NAMES
from assets.definitions import defs
from assets.factory import default_resources, pipeline_definitions
from assets.pipelines import DEMO
from assets.settings import DailyBackfill, Names, Orchestration, SwitchPolicy
from phases.errors import DefinitionError
from resources.storage import StorageResource
from tests.assets.conftest import relative_pipeline


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
    resolved = StorageResource(root=str(tmp_path)).resolve(relative_pipeline())
    assert resolved.source.path == f"{tmp_path}/src" and resolved.locations.root == f"{tmp_path}/engine"
    absolute = relative_pipeline().model_copy(
        update={"sink": relative_pipeline().sink.model_copy(update={"path": "/x"})}
    )
    assert StorageResource(root=str(tmp_path)).resolve(absolute).sink.path == "/x"


def test_orchestration_settings_are_validated_with_field_names():
    with pytest.raises(DefinitionError, match="hour_of_day"):
        DailyBackfill(start_date=date(2026, 1, 1), hour_of_day=24)
    with pytest.raises(DefinitionError, match="minimum_interval_seconds"):
        SwitchPolicy(minimum_interval_seconds=0)
    with pytest.raises(DefinitionError, match="max_quarantine_fraction"):
        Orchestration(checks={"max_quarantine_fraction": 2})
