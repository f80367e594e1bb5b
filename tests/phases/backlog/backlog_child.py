"""A backlog in its own process (``python -m tests.phases.backlog.backlog_child PIPELINE_JSON``) that kills itself with
SIGKILL while it writes the live phase's state store (version 1, the handoff's state), like a crashed machine:
after the store's partitions committed, before the store is marked whole and before the manifest."""

from __future__ import annotations

import os
import signal
import sys

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Pipeline
from phases._internal.runtime.session import SparkSettings, build_session
from phases._internal.state import keyed_store
from tests.helpers import SHORT_LIVED_JVM_CONF


def main() -> None:
    pipeline = Pipeline.model_validate_json(sys.argv[1])
    spark = build_session(
        SparkSettings(shuffle_partitions=2, app_name="backlog-child", extra_conf=SHORT_LIVED_JVM_CONF)
    )
    real = keyed_store.StoreBase.write

    def write_then_die(self, state):
        real(self, state)
        os.kill(os.getpid(), signal.SIGKILL)

    keyed_store.StoreBase.write = write_then_die
    BacklogRunner(spark, pipeline).run()
    sys.exit(3)  # not reached


if __name__ == "__main__":
    main()
