"""The keyed-process workload's variants: the same user function (:class:`benchmarks.functions.IdleTotals`)
as a plain batch pass, as one streaming job over the backlog (the framework's own live path from the first
version, ~20 micro-batches or one) and as the two-phase framework. Outputs are compared as multisets."""

from __future__ import annotations

import shutil
import time
from datetime import timedelta

from benchmarks import operator_variants
from benchmarks.variants import Timing
from phases.backlog import tag_version_range
from phases.definition import DeltaSink, DeltaSource, Locations, Pipeline, ProcessOperator
from phases.delta_source import DeltaTableSource
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
    return operator_variants.stream(spark, pipeline(source, root), files_per_trigger)


def two_phase(spark, source: str, root: str) -> Timing:
    return operator_variants.two_phase(spark, pipeline(source, root))


def same_outputs(spark, expected: str, actual: str) -> bool:
    return operator_variants.same_outputs(spark, expected, actual, ["key", "first_ts", "last_ts", "events", "total"])
