"""The redeploy job in-process: the next generation with its checks and its steps as observations, the swap with its
reason, the sink's materialization by the swap, the live phase in the same run; a rollback from the previous code;
a next generation whose checks fail is not swapped in."""

from __future__ import annotations

import time
from datetime import timedelta

import dagster as dg
import pytest

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.deployment import generations
from phases._internal.live.runner import STOP_POLL_S, LiveRunner
from phases_dagster.checks import CHECK_NAMES, NO_FAR_FUTURE
from phases_dagster.live_status import LIVE_RUN_TAG
from phases_dagster.redeploy import REASON_TAG, REDEPLOY_TAG
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import CheckPolicy, Names, Orchestration
from tests.helpers import append_version, assert_results_equal, sink_rows, write_source
from tests.phases.redeploy.test_redeploy import OLD_COLUMNS, _expected_new, _expected_old, _upto, _version
from tests.phases_dagster.conftest import definitions, relative_pipeline
from tests.phases_dagster.test_live_job import _asset_events

LENIENT = Orchestration(checks=CheckPolicy(max_quarantine_fraction=0.5))


def _old():
    from phases._internal.definition import KeyedAggregate
    from tests.conftest import AGGREGATIONS

    aggregations = [a for a in AGGREGATIONS if a.name in OLD_COLUMNS]
    return relative_pipeline(delay_s=15, operator=KeyedAggregate(aggregations=aggregations))


def _run_config(names: Names, reason: str) -> dict:
    config = {"reason": reason, "stop_timeout_seconds": 120}
    live = {"report_interval_seconds": 1.0, "max_runtime_seconds": 2.0}
    # The swap is the first part of the live step: its settings are the live step's too.
    return {"ops": {names.next_generation: {"config": config}, names.live_asset: {"config": {**config, **live}}}}


def _materialization(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    [meta] = [m for kind, m in _asset_events(result, asset) if kind == "materialization"]
    return meta


@pytest.mark.slow
def test_the_redeploy_job_swaps_a_changed_definition_in_and_rolls_back_from_the_previous_code(spark, tmp_path):
    root = str(tmp_path)
    versions = {i: _version(i) for i in range(1, 7)}
    write_source(spark, f"{root}/src", _upto(versions, 3))
    old, new = _old(), relative_pipeline(delay_s=40)
    storage = StorageResource(root=root)
    names = Names(new)
    sink = storage.placement(new).sink_path
    serving = None
    try:
        with dg.instance_for_test() as instance:
            backlog = definitions(spark, root, old, LENIENT).resolve_job_def(names.backlog_job)
            assert backlog.execute_in_process(instance=instance).success
            serving = LiveRunner.at(spark, storage.placement(old))
            serving.start()  # the running pipeline, in this process: the swap asks it to stop
            append_version(spark, f"{root}/src", versions[4])
            serving.process_available()
            job = definitions(spark, root, new, LENIENT).resolve_job_def(names.redeploy_job)
            result = job.execute_in_process(instance=instance, run_config=_run_config(names, "every aggregation"))
            assert result.success
            assert serving.stopped_for is not None and not serving.query.isActive
            tags = instance.get_run_by_id(result.run_id).tags
            assert tags[REDEPLOY_TAG] == "backfill" and tags[REASON_TAG] == "every aggregation"

            built = _materialization(result, names.next_generation)
            assert (built["way"], built["serving_generation"], built["generation"]) == ("backfill", 0, 1)
            assert "watermark_delay_us" in built["diff"] and built["reason"] == "every aggregation"
            steps = [m["step"] for kind, m in _asset_events(result, names.next_generation) if kind == "observation"]
            assert steps == ["planned", "backlog", "live caught up", "checked"]
            evaluations = {  # the next generation's (the live step evaluates sink_fresh with each sink commit)
                e.check_name: e
                for e in result.get_asset_check_evaluations()
                if e.asset_key == dg.AssetKey(names.next_generation)
            }
            assert set(evaluations) == {*CHECK_NAMES, NO_FAR_FUTURE}
            assert all(e.passed for e in evaluations.values()), evaluations

            swapped = _materialization(result, names.swap)
            assert (swapped["from_generation"], swapped["generation"], swapped["swapped"]) == (0, 1, True)
            assert swapped["seconds_from_stop_to_swap"] >= 0
            by_swap = [m for kind, m in _asset_events(result, names.sink) if m.get("written_by") == "swap"]
            assert by_swap and by_swap[0]["generation"] == 1
            live = _materialization(result, names.live_asset)
            assert live["state"] == "stopped" and live["reason"].startswith("max_runtime_seconds")
            assert_results_equal(sink_rows(spark, sink), _expected_new(_upto(versions, 4)))
            # The switch sensor knows the backlog's handoff is the previous generation's, and leaves it.
            switch = definitions(spark, root, new, LENIENT).resolve_sensor_def(names.switch)
            context = dg.build_sensor_context(instance=instance, resources={"storage": storage})
            tick = switch.evaluate_tick(context)
            assert not tick.run_requests and "serves since a redeploy" in tick.skip_message, tick.skip_message
            # A live phase started from the live asset's page ("Materialize") runs its live_phase_running check in the
            # same run once its step ends: stopped by this swap, the previous code's check says so, a warning; it
            # does not fail the run (it raised, and the clean stop showed as a failed run).
            check = dg.AssetCheckKey(dg.AssetKey(names.live_asset), names.live_running)
            check_only = dg.define_asset_job("live_check_only", selection=dg.AssetSelection.checks(check))
            ran = (
                dg.Definitions.merge(definitions(spark, root, old, LENIENT), dg.Definitions(jobs=[check_only]))
                .resolve_job_def("live_check_only")
                .execute_in_process(instance=instance, tags={LIVE_RUN_TAG: old.name}, raise_on_error=False)
            )
            assert ran.success, [e.message for e in ran.all_events if e.is_failure]
            [verdict] = ran.get_asset_check_evaluations()
            assert not verdict.passed and verdict.severity == dg.AssetCheckSeverity.WARN, verdict
            assert verdict.description.startswith("stopped"), verdict.description

            # Rollback: the previous code's redeploy job swaps the kept generation 0 back, with no backlog.
            append_version(spark, f"{root}/src", versions[5])
            back = definitions(spark, root, old, LENIENT).resolve_job_def(names.redeploy_job)
            result = back.execute_in_process(instance=instance, run_config=_run_config(names, "roll back"))
            assert result.success
            assert instance.get_run_by_id(result.run_id).tags[REDEPLOY_TAG] == "rollback"
            built = _materialization(result, names.next_generation)
            assert (built["way"], built["generation"]) == ("rollback", 0) and "backlog_s" not in built
            assert _materialization(result, names.swap)["way"] == "rollback"
            assert_results_equal(sink_rows(spark, sink), _expected_old(_upto(versions, 5)))
            assert generations.read(spark, storage.placement(old)).serving == 0
    finally:
        if serving is not None:
            serving.stop()


def test_a_next_generation_whose_checks_fail_is_not_swapped_in(spark, tmp_path):
    root = str(tmp_path)
    versions = {i: _version(i) for i in range(1, 4)}
    write_source(spark, f"{root}/src", versions)
    old = _old()
    new = relative_pipeline(delay_s=1)  # more of the records late than the bound allows
    storage = StorageResource(root=root)
    BacklogRunner.at(spark, storage.placement(old)).run()
    LiveRunner.at(spark, storage.placement(old)).start(available_now=True)
    names = Names(new)
    strict = Orchestration(checks=CheckPolicy(max_quarantine_fraction=0.01))
    with dg.instance_for_test() as instance:
        job = definitions(spark, root, new, strict).resolve_job_def(names.redeploy_job)
        result = job.execute_in_process(
            instance=instance, run_config=_run_config(names, "tighter"), raise_on_error=False
        )
        failed = {e.check_name for e in result.get_asset_check_evaluations() if not e.passed}
        assert failed == {"quarantine_within_bound"}
        assert not [m for kind, m in _asset_events(result, names.swap) if kind == "materialization"]
    assert generations.read(spark, storage.placement(old)).serving == 0
    assert_results_equal(sink_rows(spark, storage.placement(old).sink_path), _expected_old(versions))
    assert timedelta(seconds=1) == new.watermark_delay


@pytest.mark.parametrize("change", ["none", "forward"])
def test_a_redeploy_with_no_new_state_restarts_the_live_phase_in_its_run(spark, tmp_path, change):
    """No change to the state spec, or a forward one (max_future): no generation is built, the serving live phase is
    stopped and the job's live step runs the deployed definition from the same state."""
    root = str(tmp_path)
    versions = {i: _version(i) for i in range(1, 5)}
    write_source(spark, f"{root}/src", _upto(versions, 3))
    old = _old()
    new = old if change == "none" else old.model_copy(update={"max_future": timedelta(days=2)})
    storage = StorageResource(root=root)
    BacklogRunner.at(spark, storage.placement(old)).run()
    serving = LiveRunner.at(spark, storage.placement(old))
    serving.start()
    names = Names(new)
    try:
        append_version(spark, f"{root}/src", versions[4])
        with dg.instance_for_test() as instance:
            job = definitions(spark, root, new, LENIENT).resolve_job_def(names.redeploy_job)
            result = job.execute_in_process(instance=instance, run_config=_run_config(names, f"a {change} change"))
            assert result.success
            assert instance.get_run_by_id(result.run_id).tags[REDEPLOY_TAG] == change
            built = _materialization(result, names.next_generation)
            assert (built["way"], built["generation"]) == (change, "none built")
            evaluations = [  # nothing built, nothing checked: warnings, not green
                e for e in result.get_asset_check_evaluations() if e.asset_key == dg.AssetKey(names.next_generation)
            ]
            assert evaluations and all(
                not e.passed and e.severity == dg.AssetCheckSeverity.WARN for e in evaluations
            ), evaluations
            assert _materialization(result, names.swap)["swapped"] is False
            assert serving.stopped_for is not None
            assert _materialization(result, names.live_asset)["state"] == "stopped"
        assert generations.read(spark, storage.placement(old)).serving == 0
        assert_results_equal(sink_rows(spark, storage.placement(old).sink_path), _expected_old(versions))
    finally:
        serving.stop()


@pytest.mark.parametrize("group", ["pipeline", "redeploy"])
def test_materialize_all_of_either_group_leaves_a_healthy_live_phase_running(spark, tmp_path, group):
    """ "Materialize all" on the pipeline's group selected the next generation and the swap too: the swap ran a
    redeploy with nothing to change, which stopped the healthy live phase for good. The redeploy assets now have a
    group of their own and do nothing outside the redeploy job: no materialization, no check run, no stop; what the
    pipeline group's button runs leaves the live phase alone too (its backlog step does nothing after the switch)."""
    root = str(tmp_path)
    versions = {i: _version(i) for i in range(1, 5)}
    write_source(spark, f"{root}/src", _upto(versions, 3))
    old = _old()
    storage = StorageResource(root=root)
    names = Names(old)
    defs = definitions(spark, root, old, LENIENT)
    graph = defs.resolve_asset_graph()
    groups: dict[str, set[str]] = {}
    for key in graph.get_all_asset_keys():
        if graph.get(key).is_materializable:
            groups.setdefault(graph.get(key).group_name, set()).add(key.to_user_string())
    assert groups[names.redeploy_group] == {names.next_generation, names.swap}
    assert not groups[old.name] & {names.next_generation, names.swap}
    assert graph.get(dg.AssetKey(names.live_asset)).parent_keys == {
        dg.AssetKey(names.backlog),
        dg.AssetKey(names.state),
    }
    BacklogRunner.at(spark, storage.placement(old)).run()
    serving = LiveRunner.at(spark, storage.placement(old))
    serving.start()
    try:
        append_version(spark, f"{root}/src", versions[4])
        selected = groups[old.name if group == "pipeline" else names.redeploy_group]
        job = defs.resolve_implicit_global_asset_job_def().get_subset(
            asset_selection={dg.AssetKey(k) for k in selected}
            - ({dg.AssetKey(names.live_asset)} if group == "pipeline" else set())  # the live step would run on
        )
        with dg.instance_for_test() as instance:
            result = job.execute_in_process(instance=instance, raise_on_error=False)
            assert result.success, [e.message for e in result.all_events if e.is_failure]
            materialized = {e.asset_key.to_user_string() for e in result.all_events if e.is_step_materialization}
            assert not materialized & {names.next_generation, names.swap}, materialized
            assert not [
                e for e in result.get_asset_check_evaluations() if e.asset_key.path[-1] == names.next_generation
            ]
            if group == "redeploy":
                said = [e.user_message for e in instance.all_logs(result.run_id) if "not run:" in e.user_message]
                assert any(names.redeploy_job in m for m in said), said
        time.sleep(2 * STOP_POLL_S)
        assert serving.stopped_for is None and serving.query.isActive
        serving.process_available()
        assert_results_equal(sink_rows(spark, storage.placement(old).sink_path), _expected_old(versions))
        assert generations.read(spark, storage.placement(old)).rows == ()
    finally:
        serving.stop()
