"""A process-function pipeline through the Dagster layer: the backlog job hands off (checks pass), the
sensor asks for a catch-up increment (the process operator's live step over the new versions: its state does not
merge), then switches, and the live job closes the sessions the backlog left open."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg

from phases._internal.definition import ProcessOperator
from phases._internal.handoff import manifest
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import CheckPolicy, Names, Orchestration, SwitchPolicy
from tests import reference
from tests.helpers import append_version, ts, write_source
from tests.phases.operators.process_functions import Sessions
from tests.phases.operators.test_process_function import _outputs, _sink
from tests.phases_dagster.conftest import definitions, relative_pipeline

S = 1_000_000
DELAY_S = 15
VERSIONS = {1: [("a", 0, 1), ("a", S, 2), ("b", 0, 5)], 2: [("b", 2 * S, 3), ("c", 40 * S, 1)]}


def test_process_pipeline_backlog_checks_switch_and_live_close_open_sessions(spark, tmp_path):
    root = str(tmp_path)
    write_source(spark, f"{root}/src", VERSIONS)
    p = relative_pipeline(
        delay_s=DELAY_S, operator=ProcessOperator(function="tests.phases.operators.process_functions:Sessions")
    )
    settings = Orchestration(
        checks=CheckPolicy(max_quarantine_fraction=0.5), switch=SwitchPolicy(lag_threshold=timedelta(0))
    )
    names, defs = Names(p), definitions(spark, root, p, settings)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(names.backlog_job).execute_in_process(instance=instance)
        assert result.success and all(e.passed for e in result.get_asset_check_evaluations())
        handoff = manifest.latest(spark, f"{root}/engine/manifests", p.name)
        # W = 40 - 15 = 25 s: a's (11 s) and b's (12 s) sessions closed in the backlog; c's is open.
        assert _sink(spark, f"{root}/engine/sink") == [("a", 0, 11 * S, 2, 3, 2), ("b", 0, 12 * S, 2, 8, 2)]
        assert handoff.state_rows == 3 and handoff.aggregated_rows == 5

        append_version(spark, f"{root}/src", [("d", 70 * S, 4)])  # W -> 55 s: c's session (50 s) closes
        sensor = defs.resolve_sensor_def(names.switch)
        context = dg.build_sensor_context(instance=instance, resources={"storage": StorageResource(root=root)})
        [catch_up] = sensor.evaluate_tick(context).run_requests  # not caught up (lag 0): an increment first
        assert catch_up.run_key == f"catch-up:{handoff.manifest_id}"
        assert catch_up.tags["phases/switch_reason"].startswith(
            "catch-up increment by the process operator's live step from the handoff's state, of source versions 3..3"
        )
        backlog = defs.resolve_job_def(names.backlog_job)
        assert backlog.execute_in_process(instance=instance, run_config=catch_up.run_config).success
        increment = manifest.latest(spark, f"{root}/engine/manifests", p.name)
        assert (increment.kind, increment.base_manifest_id, increment.source_version) == (
            "increment",
            handoff.manifest_id,
            3,
        )
        # The increment's watermark (55 s) closed c's session already.
        assert ("c", 40 * S, 50 * S, 1, 1, 1) in _sink(spark, f"{root}/engine/sink")
        [live_request] = sensor.evaluate_tick(context).run_requests
        assert live_request.run_key == f"live:{increment.manifest_id}"

        append_version(spark, f"{root}/src", [("e", 100 * S, 6)])  # W -> 85 s: d's session (80 s) closes live
        config = {"manifest_id": increment.manifest_id, "report_interval_seconds": 1.0, "max_runtime_seconds": 4.0}
        live = defs.resolve_job_def(names.live_job)
        assert live.execute_in_process(
            instance=instance, run_config={"ops": {names.live_asset: {"config": config}}}
        ).success
        versions = {**VERSIONS, 3: [("d", 70 * S, 4)], 4: [("e", 100 * S, 6)]}
        expected = reference.run_process(versions, DELAY_S * S, Sessions(), ts)
        got = _sink(spark, f"{root}/engine/sink")
        assert ("d", 70 * S, 80 * S, 1, 4, 1) in got
        assert got == _outputs(expected)


def test_two_input_pipelines_hand_off_through_dagster_with_passing_checks(spark, tmp_path):
    from phases._internal.definition import DeltaSource
    from tests.phases.operators.test_two_input import _co_group, _join

    root = str(tmp_path)
    write_source(spark, f"{root}/src", VERSIONS)
    write_source(spark, f"{root}/other", {1: [("a", 4 * S, 7), ("c", 41 * S, 8)], 2: [("b", 60 * S, 9)]})
    for make in (_join, _co_group):
        operator = make("other")
        assert isinstance(operator.right, DeltaSource)
        p = relative_pipeline(delay_s=DELAY_S, operator=operator, name=f"two_input_{operator.kind}")
        p = p.model_copy(update={"locations": p.locations.model_copy(update={"root": f"engine_{operator.kind}"})})
        names, defs = (
            Names(p),
            definitions(spark, root, p, Orchestration(checks=CheckPolicy(max_quarantine_fraction=0.5))),
        )
        with dg.instance_for_test() as instance:
            result = defs.resolve_job_def(names.backlog_job).execute_in_process(instance=instance)
            assert result.success and all(e.passed for e in result.get_asset_check_evaluations()), operator.kind
            handoff = manifest.latest(spark, f"{root}/engine_{operator.kind}/manifests", p.name)
            assert handoff.right_source_version == 2 and handoff.aggregated_rows == 8
