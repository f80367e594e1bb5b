"""The keyed-process workload's variants: the same user function (:class:`benchmarks.functions.IdleTotals`)
as a plain batch pass, as one streaming job over the backlog (``transformWithState`` through the framework's
streaming path, ~20 micro-batches or one) and as the two-phase framework. Outputs are compared as multisets."""

from __future__ import annotations

import shutil
import time
from datetime import timedelta

from benchmarks.variants import Timing
from phases.backlog import BacklogRunner, tag_version_range
from phases.definition import DeltaSink, DeltaSource, Locations, Pipeline, ProcessOperator
from phases.delta_source import DeltaTableSource
from phases.live import LiveRunner
from phases.process_operator import ProcessLogic

FUNCTION = "benchmarks.functions:IdleTotals"


def pipeline(source: str, root: str) -> Pipeline:
    return Pipeline(
        name="bench_process",
        source=DeltaSource(path=source),
        key_columns=["key"],
        event_time="ts",
        watermark_delay=timedelta(minutes=1),
        operator=ProcessOperator(function=FUNCTION),
        sink=DeltaSink(path=f"{root}/sink"),
        locations=Locations(root=root),
    )


def plain_batch(spark, source: str, out: str) -> Timing:
    """The function over sorted partitions with every timer fired up to the final watermark; no state kept."""
    shutil.rmtree(out, ignore_errors=True)
    p = pipeline(source, out)
    t = time.perf_counter()
    src = DeltaTableSource(spark, p.source)
    tagged = tag_version_range(spark, p, src, (0, src.head_version()), None)
    logic = ProcessLogic(spark, p, tagged.prepared.schema)
    final = None if tagged.running_max_us is None else tagged.running_max_us - p.delay_us
    logic.outputs(logic.backlog_pass(tagged.prepared, final)).write.format("delta").save(f"{out}/sink")
    return Timing("plain batch", time.perf_counter() - t, {})


def stream(spark, source: str, root: str, files_per_trigger: int | None) -> Timing:
    shutil.rmtree(root, ignore_errors=True)
    p = pipeline(source, root)
    t = time.perf_counter()
    # The tagger reads the source in ~20 micro-batches; the operator then reads the tagged records in as many.
    batches = 20 if files_per_trigger else None
    live = LiveRunner.streaming_only(spark, p, max_files_per_trigger=files_per_trigger, operator_batches=batches)
    live.start(available_now=True)
    batches = len(live.aggregate.recentProgress)
    return Timing(
        "stream" if files_per_trigger else "stream, one batch", time.perf_counter() - t, {"micro_batches": batches}
    )


def two_phase(spark, source: str, root: str) -> Timing:
    shutil.rmtree(root, ignore_errors=True)
    p = pipeline(source, root)
    t = time.perf_counter()
    runner = BacklogRunner(spark, p)
    handoff = runner.run()
    backlog_s = time.perf_counter() - t
    live = LiveRunner.from_manifest(spark, p)
    start = live.start()
    total = time.perf_counter() - t
    live.stop()
    detail = {
        "backlog_s": round(backlog_s, 2),
        "switch_s": round(start.start_seconds, 2),
        "keys": handoff.state_rows,
        **{k: round(v, 2) for k, v in runner.timings.items()},
    }
    return Timing("two-phase", total, detail)


def same_outputs(spark, expected: str, actual: str) -> bool:
    cols = ["key", "first_ts", "last_ts", "events", "total"]
    a = spark.read.format("delta").load(expected).select(*cols)
    b = spark.read.format("delta").load(actual).select(*cols)
    return a.count() == b.count() and a.exceptAll(b).limit(1).count() == 0 and b.exceptAll(a).limit(1).count() == 0
