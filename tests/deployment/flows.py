"""The backlog → switch → live flow of a keyed pipeline and of a process-function pipeline, through the Dagster
layer, on whatever Spark and storage root it is given. Each pipeline's sink is compared with the plain reference
(:mod:`tests.reference`).

The object-store tier runs the flows in the suite's own session; the cluster tier runs them in a process of its
own (the suite's JVM is a ``local[2]`` driver, and a cluster application needs its own):

    python -m tests.deployment.flows '{"master": "spark://...", "root": "file:/...", "python": ..., ...}'

Settings (JSON): ``master``, ``root`` (the storage root), ``python`` and ``py_files`` (what the executors run),
``s3a``, ``conf`` (extra Spark configuration). Prints one JSON line (``{"seconds": {...}, "executors": N}``) and
exits 0, or fails with the assertion's traceback.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import dagster as dg

from phases._internal import uris
from phases._internal.definition import ProcessOperator
from phases._internal.handoff import manifest
from phases_dagster.factory import pipeline_definitions
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import CheckPolicy, Names, Orchestration, SwitchPolicy
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, sink_rows, ts, write_source

S = 1_000_000
DELAY_S = 5
KEYED_VERSIONS = {
    1: [("a", 10 * S, 1), ("b", 12 * S, 2), ("a", 11 * S, 3), (None, 12 * S, 4)],  # a null key: quarantined
    2: [("c", 40 * S, 5), ("a", 2 * S, 6), ("b", 39 * S, None)],  # ("a", 2 s) is late: W = 12 - 5 = 7 s
    3: [("a", 60 * S, 7), ("d", 45 * S, 8), ("c", 30 * S, 9)],  # ("c", 30 s) is late: W = 40 - 5 = 35 s
}
KEYED_LIVE = [("a", 70 * S, 10), ("e", 66 * S, 11), ("b", 3 * S, 12)]  # ("b", 3 s) is late: W = 55 s
PROCESS_DELAY_S = 15
PROCESS_VERSIONS = {1: [("a", 0, 1), ("a", S, 2), ("b", 0, 5)], 2: [("b", 2 * S, 3), ("c", 40 * S, 1)]}
PROCESS_LIVE = [("d", 70 * S, 4)]  # W -> 55 s: c's session (ends 50 s) closes in the live phase
NAMES = {"keyed": "keyed", "process": "sessions"}  # flow -> pipeline name
# The switch is wanted at once, whatever the watermark's lag (event times of 2026-01-01 are far behind now).
SETTINGS = Orchestration(
    checks=CheckPolicy(max_quarantine_fraction=0.5), switch=SwitchPolicy(lag_threshold=timedelta(days=36500))
)


def _definitions(spark: SparkResource, root: str, pipeline) -> dg.Definitions:
    resources = {"spark": spark, "storage": StorageResource(root=root)}
    return dg.Definitions.merge(
        pipeline_definitions(pipeline, SETTINGS), dg.Definitions(resources=resources, executor=dg.in_process_executor)
    )


def _flow(spark_resource: SparkResource, root: str, pipeline, versions: dict, live_rows: list) -> str:
    """Backlog job (its checks pass), one more source version, the sensor's switch, a live run that applies it."""
    spark = spark_resource.session()
    source = uris.join(root, "src")
    write_source(spark, source, versions)
    names, defs = Names(pipeline), _definitions(spark_resource, root, pipeline)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(names.backlog_job).execute_in_process(instance=instance)
        assert result.success and all(e.passed for e in result.get_asset_check_evaluations())
        handoff = manifest.latest(spark, uris.join(root, "engine", "manifests"), pipeline.name)
        assert handoff.state_path.startswith(uris.join(root, "engine", "state")), handoff.state_path
        append_version(spark, source, live_rows)
        sensor = defs.resolve_sensor_def(names.switch)
        context = dg.build_sensor_context(instance=instance, resources={"storage": StorageResource(root=root)})
        [request] = sensor.evaluate_tick(context).run_requests
        assert request.run_key == f"live:{handoff.manifest_id}", request.run_key
        live = defs.resolve_job_def(names.live_job)
        config = {"manifest_id": handoff.manifest_id, "report_interval_seconds": 1.0, "max_runtime_seconds": 3.0}
        assert live.execute_in_process(
            instance=instance, run_config={"ops": {names.live_asset: {"config": config}}}
        ).success
    return uris.join(root, "engine", "sink")


def keyed(spark_resource: SparkResource, root: str) -> None:
    pipeline = make_pipeline("src", "engine", delay_s=DELAY_S, name=NAMES["keyed"])
    sink = _flow(spark_resource, root, pipeline, KEYED_VERSIONS, KEYED_LIVE)
    expected, _ = reference.run({**KEYED_VERSIONS, 4: KEYED_LIVE}, DELAY_S * S)
    assert_results_equal(sink_rows(spark_resource.session(), sink), expected)


def process(spark_resource: SparkResource, root: str) -> None:
    from tests.phases.operators.process_functions import Sessions
    from tests.phases.operators.test_process_function import _outputs, _sink

    pipeline = make_pipeline(
        "src",
        "engine",
        delay_s=PROCESS_DELAY_S,
        name=NAMES["process"],
        operator=ProcessOperator(function="tests.phases.operators.process_functions:Sessions"),
    )
    sink = _flow(spark_resource, root, pipeline, PROCESS_VERSIONS, PROCESS_LIVE)
    expected = reference.run_process({**PROCESS_VERSIONS, 3: PROCESS_LIVE}, PROCESS_DELAY_S * S, Sessions(), ts)
    got = _sink(spark_resource.session(), sink)
    assert ("c", 40 * S, 50 * S, 1, 1, 1) in got, got  # closed by the live phase
    assert got == _outputs(expected)


def main() -> None:
    settings = json.loads(sys.argv[1])
    spark_resource = SparkResource(
        master=settings["master"],
        shuffle_partitions=2,
        python=settings.get("python"),
        py_files=settings.get("py_files", []),
        s3a=settings.get("s3a", False),
        conf=settings.get("conf", {}),
        stop_after_run=False,
    )
    spark = spark_resource.session()
    seconds = {}
    for name, flow in (("keyed", keyed), ("process", process)):
        t = time.perf_counter()
        flow(spark_resource, uris.join(settings["root"], name))
        seconds[name] = round(time.perf_counter() - t, 1)
    # The work ran on the cluster's executors, not in the driver (local mode has one "driver" executor only).
    executors = int(spark.sparkContext._jsc.sc().getExecutorIds().size())
    print(json.dumps({"seconds": seconds, "executors": executors}))
    spark.stop()


if __name__ == "__main__":
    main()
