"""Two pipelines chained in Dagster: the downstream reads the upstream's results (PipelineSource). One lineage (the
downstream's backlog depends on the upstream's sink asset, and the downstream has no source asset of its own); the
downstream's switch sensor waits for the upstream's handoff, then requests the downstream's backlog once, then its
live phase; each stage's sink equals its reference."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg

from phases import DeltaSink, PipelineSource, Window, WindowedAggregate
from phases_dagster.factory import pipeline_definitions
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import CheckPolicy, Names, Orchestration
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, write_source
from tests.phases.chains.test_pipeline_source import DOWN_AGGS, DOWN_SIZE_S, UP_SIZE_S
from tests.phases.operators.test_windows import AGGS, emitted_windows

S = 1_000_000
DELAY_S = 5
LENIENT = Orchestration(checks=CheckPolicy(max_quarantine_fraction=0.5))
VERSIONS = {1: [("a", 3 * S, 1), ("b", 12 * S, 2)], 2: [("a", 24 * S, 3), ("b", 31 * S, 4)]}
LATER = {3: [("a", 47 * S, 5), ("c", 58 * S, 6)], 4: [("b", 71 * S, 7), ("a", 95 * S, 8)]}


def _pipelines():
    up_window = WindowedAggregate(window=Window(size=timedelta(seconds=UP_SIZE_S)), aggregations=AGGS)
    up = make_pipeline(
        "src", "engine/minutes", delay_s=DELAY_S, name="minutes", operator=up_window, sink=DeltaSink(path="minutes")
    )
    down_window = WindowedAggregate(window=Window(size=timedelta(seconds=DOWN_SIZE_S)), aggregations=DOWN_AGGS)
    down = make_pipeline(
        PipelineSource(upstream=up),
        "engine/hours",
        delay_s=0,
        name="hours",
        event_time="window_start",
        operator=down_window,
        sink=DeltaSink(path="hours"),
    )
    return up, down


def _tick(defs: dg.Definitions, instance, root: str, name: str):
    ctx = dg.build_sensor_context(instance=instance, resources={"storage": StorageResource(root=root)})
    return defs.resolve_sensor_def(name).evaluate_tick(ctx)


def _run(defs: dg.Definitions, instance, job: str, run_config: dict | None = None) -> None:
    result = defs.resolve_job_def(job).execute_in_process(instance=instance, run_config=run_config or {})
    assert result.success


def _live(defs: dg.Definitions, instance, names: Names, manifest_id: str) -> None:
    config = {"manifest_id": manifest_id, "report_interval_seconds": 0.5, "max_runtime_seconds": 1.0}
    _run(defs, instance, names.live_job, {"ops": {names.live_asset: {"config": config}}})


def test_a_chain_is_one_lineage_and_the_downstream_follows_the_upstreams_handoff_to_live(spark, instance, tmp_path):
    assert spark is not None  # the session fixture: the resource reuses it
    root = str(tmp_path)
    write_source(spark, f"{root}/src", VERSIONS)
    up, down = _pipelines()
    ups, downs = Names(up), Names(down)
    resources = {
        "spark": SparkResource(shuffle_partitions=2, stop_after_run=False),
        "storage": StorageResource(root=root),
    }
    defs = dg.Definitions.merge(
        pipeline_definitions(up, LENIENT),
        pipeline_definitions(down, LENIENT),
        dg.Definitions(resources=resources, executor=dg.in_process_executor),
    )

    # One lineage: the downstream's tables hang off the upstream's sink; the downstream has no source of its own.
    graph = defs.resolve_asset_graph()
    assert downs.source == ups.sink
    assert dg.AssetKey(ups.sink) in graph.get(dg.AssetKey(downs.backlog)).parent_keys
    assert dg.AssetKey(f"{down.name}_source") not in graph.get_all_asset_keys()

    waiting = _tick(defs, instance, root, downs.switch)
    assert not waiting.run_requests and "waiting for pipeline 'minutes'" in waiting.skip_message
    # The downstream's backlog launched by hand meanwhile (its group's Materialize all): it does nothing and says why.
    early = defs.resolve_job_def(downs.backlog_job).execute_in_process(instance=instance)
    assert early.success and not early.get_asset_materialization_events()
    assert "not handed off" in instance.get_run_by_id(early.run_id).tags["phases/not_run"]  # pyright: ignore[reportOptionalMemberAccess]
    _run(defs, instance, ups.backlog_job)
    # The upstream handed off: the downstream's switch requests its backlog, once for that handoff.
    after = _tick(defs, instance, root, downs.switch)
    (request,) = after.run_requests
    up_live = _tick(defs, instance, root, ups.switch).run_requests[0]
    up_manifest = up_live.tags["phases/manifest_id"]
    assert request.job_name == downs.backlog_job and request.run_key == f"after:{up_manifest}"
    _run(defs, instance, downs.backlog_job)
    (down_live,) = _tick(defs, instance, root, downs.switch).run_requests
    assert down_live.job_name == downs.live_job

    _live(defs, instance, ups, up_manifest)
    _live(defs, instance, downs, down_live.tags["phases/manifest_id"])
    for rows in LATER.values():
        append_version(spark, f"{root}/src", rows)
    _live(defs, instance, ups, up_manifest)  # a restart of each: the upstream applies the new versions,
    _live(defs, instance, downs, down_live.tags["phases/manifest_id"])  # then the downstream its new results

    size = UP_SIZE_S * S
    up_expected, _ = reference.run_windows({**VERSIONS, **LATER}, DELAY_S * S, size, size)
    assert emitted_windows(spark.read.format("delta").load(f"{root}/minutes").collect()) == up_expected
    rows = [(key, start, out["total"]) for (key, start, _), out in up_expected.items()]
    down_expected, _ = reference.run_windows({1: rows}, 0, DOWN_SIZE_S * S, DOWN_SIZE_S * S)
    assert down_expected
    assert emitted_windows(spark.read.format("delta").load(f"{root}/hours").collect()) == down_expected

    # Freshness follows the chain: data waits upstream while its live phase is stopped, so the upstream's sink_fresh
    # fails; the downstream has applied all the upstream wrote, yet its sink_fresh fails with it, naming it.
    append_version(spark, f"{root}/src", [("a", 120 * S, 9)])
    up_fresh = _fresh(_tick(defs, instance, root, ups.health), ups)
    assert up_fresh is not None and not up_fresh.passed
    instance.report_runless_asset_event(up_fresh)  # as the daemon stores a sensor's asset events
    down_fresh = _fresh(_tick(defs, instance, root, downs.health), downs)
    assert down_fresh is not None and not down_fresh.passed
    assert "sink_fresh of pipeline 'minutes' failed" in (down_fresh.description or "")
    assert down_fresh.severity == dg.AssetCheckSeverity.ERROR and down_fresh.metadata["upstream_fresh"].value is False


def _fresh(tick, names: Names) -> dg.AssetCheckEvaluation | None:
    """The sink_fresh evaluation a health tick reported, if any."""
    found = [
        e
        for e in tick.asset_events
        if isinstance(e, dg.AssetCheckEvaluation)
        and e.asset_key == dg.AssetKey(names.sink)
        and e.check_name == names.fresh
    ]
    return found[-1] if found else None
