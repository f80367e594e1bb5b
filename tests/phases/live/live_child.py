"""A live phase in its own process (``python -m tests.phases.live.live_child PIPELINE_JSON KILL_AT``) that kills
itself with SIGKILL at a chosen point of its first micro-batch that writes to the sink, like a crashed machine (a
keyed aggregation's upsert, or the append of the windows a micro-batch closed):

- ``sink``: once the state store has committed the batch's version, before the sink write;
- ``progress``: once the sink write has committed, before the batch's progress record;
- ``recorded``: once the batch's progress record is written, before Spark's commit log records the batch."""

from __future__ import annotations

import os
import signal
import sys

import phases._internal.live.micro_batch as engine
from phases._internal.coordination.progress_log import ProgressLog
from phases._internal.definition import Pipeline
from phases._internal.live.runner import LiveRunner
from phases._internal.runtime.session import SparkSettings, build_session
from tests.helpers import SHORT_LIVED_JVM_CONF

KILL_POINTS = ("sink", "progress", "recorded")


def main() -> None:
    pipeline = Pipeline.model_validate_json(sys.argv[1])
    kill_at = sys.argv[2]
    if kill_at not in KILL_POINTS:
        raise SystemExit(f"unknown kill point {kill_at!r}; valid: {list(KILL_POINTS)}")
    spark = build_session(SparkSettings(shuffle_partitions=2, app_name="live-child", extra_conf=SHORT_LIVED_JVM_CONF))
    runner = LiveRunner.from_manifest(spark, pipeline)
    real_upsert, real_append = engine.tables.upsert_marked, engine.tables.append_marked

    def around_sink_write(path: str, write) -> None:
        if path == pipeline.sink.path and kill_at == "sink":
            os.kill(os.getpid(), signal.SIGKILL)
        write()
        if path == pipeline.sink.path and kill_at == "progress":
            os.kill(os.getpid(), signal.SIGKILL)

    def upsert(spark_, path, rows, keys, app_id, batch, **options):
        around_sink_write(path, lambda: real_upsert(spark_, path, rows, keys, app_id, batch, **options))

    def append(rows, path, app_id, batch, **options):
        around_sink_write(path, lambda: real_append(rows, path, app_id, batch, **options))

    real_record = ProgressLog.write

    def record(self, batch_id: int, progress: dict) -> None:
        real_record(self, batch_id, progress)
        if batch_id >= 0 and kill_at == "recorded":
            os.kill(os.getpid(), signal.SIGKILL)

    engine.tables.upsert_marked = upsert
    engine.tables.append_marked = append
    ProgressLog.write = record
    runner.start(available_now=True)
    sys.exit(3)  # not reached when the kill point is hit


if __name__ == "__main__":
    main()
