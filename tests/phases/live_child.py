"""A live phase in its own process (``python -m tests.phases.live_child PIPELINE_JSON KILL_AT``) that kills
itself with SIGKILL at a chosen point of its first micro-batch with data, like a crashed machine: ``sink``
right after the state MERGE committed and before the sink write."""

from __future__ import annotations

import os
import signal
import sys

import phases.live_increment as engine
from phases.definition import Pipeline
from phases.live import LiveRunner
from phases.session import SparkSettings, build_session


def main() -> None:
    pipeline = Pipeline.model_validate_json(sys.argv[1])
    kill_at = sys.argv[2]
    real = engine.tables.idempotent_dml

    def dml(spark, app_id, version):
        if app_id.endswith(f":{kill_at}"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(spark, app_id, version)

    engine.tables.idempotent_dml = dml
    spark = build_session(SparkSettings(shuffle_partitions=2, app_name="live-child"))
    LiveRunner.from_manifest(spark, pipeline).start(available_now=True)
    sys.exit(3)  # not reached when the kill point is hit


if __name__ == "__main__":
    main()
