"""A live phase in its own process (``python -m tests.phases.live_child PIPELINE_JSON KILL_AT``) that kills
itself with SIGKILL at a chosen point of its first micro-batch with data, like a crashed machine: ``sink``
once the state MERGE has committed and before the sink write (a keyed aggregation writes both at the same
time: its sink write waits for the state's commit, then the process dies)."""

from __future__ import annotations

import os
import signal
import sys
import time

import phases.live.micro_batch as engine
from phases.definition import Pipeline
from phases.live.runner import LiveRunner
from phases.runtime.session import SparkSettings, build_session


def main() -> None:
    pipeline = Pipeline.model_validate_json(sys.argv[1])
    kill_at = sys.argv[2]
    if kill_at != "sink":
        raise SystemExit(f"unknown kill point {kill_at!r}; valid: 'sink'")
    spark = build_session(SparkSettings(shuffle_partitions=2, app_name="live-child"))
    runner = LiveRunner.from_manifest(spark, pipeline)
    real = engine.tables.replace_rows

    def replace(spark_, path, rows, keys):
        if path == pipeline.sink.path:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:  # the state write runs in the other thread
                if any(c.user_metadata for c in engine.tables.recent_commits(spark_, runner.state_path)):
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.2)
            raise SystemExit("the state write never committed")
        return real(spark_, path, rows, keys)

    engine.tables.replace_rows = replace
    runner.start(available_now=True)
    sys.exit(3)  # not reached when the kill point is hit


if __name__ == "__main__":
    main()
