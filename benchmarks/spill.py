"""The backlog of the keyed-process workload's function over the keyed-reduce data, in a Spark whose
executor memory is far below the backlog's size: the sort by key, version and event time must spill to disk,
not fail. Runs in its own process (the JVM's heap is fixed at start) and
prints one JSON line: time, spilled bytes (from the Spark UI's REST API), and whether the result equals the
plain batch job's."""

from __future__ import annotations

import argparse
import json
import shutil
import time
import urllib.request

from benchmarks import process_variants
from phases._internal import spark_internals
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.runtime.session import SparkSettings, build_session


def _stages(spark) -> list[dict]:
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/stages"
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - the local Spark UI
        return json.loads(response.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--source", required=True)
    ap.add_argument("--expected", default=None, help="the plain batch pass's output table, to compare with")
    ap.add_argument("--work", required=True)
    ap.add_argument("--driver-memory", default="512m")
    ap.add_argument("--shuffle-partitions", type=int, default=2, help="few partitions: big sorts per task")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    spark = build_session(
        SparkSettings(
            shuffle_partitions=args.shuffle_partitions,
            driver_memory=args.driver_memory,
            ui_enabled=True,
            app_name="bench-spill",
        )
    )
    try:
        p = process_variants.pipeline(args.source, args.work)
        t = time.perf_counter()
        handoff = BacklogRunner(spark, p).run()
        seconds = time.perf_counter() - t
        equal = process_variants.same_outputs(spark, args.expected, p.sink.path) if args.expected else None
        stages = _stages(spark)
        heap = int(spark_internals.jvm(spark).java.lang.Runtime.getRuntime().maxMemory())
        result = {
            "driver_memory": args.driver_memory,
            "jvm_max_heap_mib": heap // 2**20,
            # Spark's unified memory: (heap - 300 MiB reserved) * spark.memory.fraction (0.6), shared by the tasks
            "execution_memory_mib": int((heap - 300 * 2**20) * 0.6) // 2**20,
            "shuffle_partitions": args.shuffle_partitions,
            "rows": handoff.input_rows,
            "keys": handoff.state_rows,
            "backlog_s": round(seconds, 2),
            "equal": equal,
            "shuffle_write_mib": sum(s.get("shuffleWriteBytes", 0) for s in stages) // 2**20,
            "memory_spilled_mib": sum(s.get("memoryBytesSpilled", 0) for s in stages) // 2**20,
            "disk_spilled_mib": sum(s.get("diskBytesSpilled", 0) for s in stages) // 2**20,
        }
    finally:
        spark.stop()
    print("SPILL_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
