"""A redeploy in its own process (``python -m tests.phases.redeploy.redeploy_child PIPELINE_JSON KILL_AT``) that kills
itself with SIGKILL at a chosen point, like a crashed machine:

- ``backlog``: in the new generation's backlog (or catch-up increment), before its handoff manifest is written;
- ``backlog done``: right after the new generation's handoff, before its live phase starts;
- ``live``: as the new generation's live phase starts, once its switch's progress record is written;
- ``serving stopped``: once the serving live phase has stopped and its lease is the redeploy's, before the swap;
- ``swap``: once the old results are kept, before the swap's commit on the consumer-facing table;
- ``swapped``: after the swap's commit, before the redeploy log says so (with a topic sink: before its publish);
- ``topic publish`` (a topic sink): in the swap's transaction, its records produced, before its commit;
- ``topic published`` (a topic sink): once the swap's transaction committed, before the redeploy log says so.

Exits 3 when the redeploy finished without reaching the kill point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import phases._internal.backlog.runner as backlog_runner
import phases._internal.live.micro_batch as micro_batch
from phases._internal.definition import Pipeline
from phases._internal.redeploy import runner as redeploy_runner
from phases._internal.redeploy import swap
from phases._internal.runtime.session import SparkSettings, build_session
from phases._internal.topics import transactions
from tests.helpers import SHORT_LIVED_JVM_CONF

KILL_POINTS = ("backlog", "backlog done", "live", "serving stopped", "swap", "swapped")
TOPIC_KILL_POINTS = ("topic publish", "topic published")


def run_until_killed(pipeline: Pipeline, kill_at: str) -> None:
    """Runs this module for ``pipeline`` in a process of its own; fails unless SIGKILL at ``kill_at`` ended it."""
    child = subprocess.run(
        [sys.executable, "-m", "tests.phases.redeploy.redeploy_child", pipeline.model_dump_json(), kill_at],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert child.returncode == -9, (kill_at, child.stderr[-3000:])


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    pipeline = Pipeline.model_validate_json(sys.argv[1])
    kill_at = sys.argv[2]
    if kill_at not in KILL_POINTS + TOPIC_KILL_POINTS:
        raise SystemExit(f"unknown kill point {kill_at!r}; valid: {list(KILL_POINTS + TOPIC_KILL_POINTS)}")
    spark = build_session(
        SparkSettings(shuffle_partitions=2, app_name="redeploy-child", extra_conf=SHORT_LIVED_JVM_CONF)
    )
    generation_root = f"{pipeline.locations.root.rstrip('/')}/generations/"

    if kill_at == "backlog":
        real_write = backlog_runner.manifest.write

        def write(spark_, path, handoff):
            if path.startswith(generation_root):
                _die()
            real_write(spark_, path, handoff)

        backlog_runner.manifest.write = write
    if kill_at == "live":
        real_prepare = micro_batch.IncrementalLive.prepare

        def prepare(self):
            real_prepare(self)
            if self.placement.generation:
                _die()

        micro_batch.IncrementalLive.prepare = prepare
    if kill_at in ("swap", "swapped"):
        real_copy = swap.copy_sink

        def copy_sink(spark_, source, target, *, swap=None, **kwargs):
            if swap is not None and kill_at == "swap":
                _die()
            version = real_copy(spark_, source, target, swap=swap, **kwargs)
            if swap is not None:
                _die()
            return version

        swap.copy_sink = copy_sink

    if kill_at in TOPIC_KILL_POINTS:  # the only topic write a redeploy makes is its swap's
        real_write = transactions.TopicWriter.write

        def topic_write(self, records, marker, **kwargs):
            def then_die():
                yield from records
                self._producer.flush(30)  # every record at the broker, the transaction still open
                _die()

            count = real_write(self, then_die() if kill_at == "topic publish" else records, marker, **kwargs)
            _die()
            return count

        transactions.TopicWriter.write = topic_write

    def on_step(step: str, detail: dict) -> None:
        if (kill_at, step) in (("backlog done", "backlog"), ("serving stopped", "serving live stopped")):
            _die()

    redeploy_runner.Redeploy(spark, pipeline, take_over=True, on_step=on_step, stop_timeout_s=120).run()
    sys.exit(3)


if __name__ == "__main__":
    main()
