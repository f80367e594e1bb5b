"""A run of a pipeline with a topic sink in its own process group (``python -m tests.phases.topics.topic_child
PIPELINE_JSON KILL_AT``) that kills the whole group (Python and its JVM) with SIGKILL at a chosen point, like a lost
machine:

- ``backlog``: the backlog, once its handoff manifest is written, before it publishes the handoff's results;
- ``before the transaction``: the live phase's first micro-batch that publishes, before its transaction begins;
- ``holding records``: the same, once its records and marker are sent and before the transaction commits;
- ``after the commit``: the same, once the transaction committed, before the Delta write and the progress record;
- ``after the progress record``: once that micro-batch's progress record is written.

Exits 3 when the run finished without reaching the kill point."""

from __future__ import annotations

import os
import signal
import sys

import confluent_kafka

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.coordination.progress_log import ProgressLog
from phases._internal.definition import Pipeline
from phases._internal.live.runner import LiveRunner
from phases._internal.runtime.session import SparkSettings, build_session
from phases._internal.topics import sink as topic_sinks
from phases._internal.topics import transactions
from tests.helpers import SHORT_LIVED_JVM_CONF

KILL_POINTS = ("backlog", "before the transaction", "holding records", "after the commit", "after the progress record")


def _die() -> None:
    os.killpg(0, signal.SIGKILL)  # the process group: this Python process and the JVM it started


def main() -> None:
    pipeline = Pipeline.model_validate_json(sys.argv[1])
    kill_at = sys.argv[2]
    if kill_at not in KILL_POINTS:
        raise SystemExit(f"unknown kill point {kill_at!r}; valid: {list(KILL_POINTS)}")
    spark = build_session(SparkSettings(shuffle_partitions=2, app_name="topic-child", extra_conf=SHORT_LIVED_JVM_CONF))
    if kill_at == "backlog":
        topic_sinks.TopicSink.publish_handoff = lambda *args, **kwargs: _die()
        BacklogRunner(spark, pipeline, take_over=True).run()
        sys.exit(3)

    live_batch = {"writing": False}
    real_write = transactions.TopicWriter.write

    def write(self, records, marker, **kwargs):
        live_batch["writing"] = marker.batch >= 0
        if live_batch["writing"] and kill_at == "before the transaction":
            _die()
        return real_write(self, records, marker, **kwargs)

    class Producer(confluent_kafka.Producer):
        def commit_transaction(self, *args):
            if live_batch["writing"] and kill_at == "holding records":
                _die()
            result = super().commit_transaction(*args)
            if live_batch["writing"] and kill_at == "after the commit":
                _die()
            return result

    real_record = ProgressLog.write

    def record(self, batch_id, progress):
        real_record(self, batch_id, progress)
        if batch_id >= 0 and kill_at == "after the progress record":
            _die()

    transactions.TopicWriter.write = write
    confluent_kafka.Producer = Producer
    ProgressLog.write = record
    LiveRunner.from_manifest(spark, pipeline, take_over=True).start(available_now=True)
    sys.exit(3)


if __name__ == "__main__":
    main()
