"""Publishing a topic sink's whole result again: :func:`republish_topic`, the way out when the result topic lost
what the engine published into it (deleted and made again, its records or the engine's marker group removed).

The engine's Delta table of the results (``sink.path``) holds every result the topic was given. Its rows go out in
one transaction whose marker names the handoff the live phase runs from and the newest live micro-batch the table
holds, so the live phase goes on after it: a micro-batch published but not yet recorded (a crash) is published again
by its replay, and nothing the table holds twice. A consumer that reads the topic from its start with
``read_committed`` folds the same result as before the loss.
"""

from __future__ import annotations

import uuid

from pyspark.sql import SparkSession

from phases._internal.coordination import leases
from phases._internal.definition import KafkaSink, Pipeline
from phases._internal.deployment import place
from phases._internal.errors import DefinitionError, SinkError
from phases._internal.handoff import manifest
from phases._internal.placement import Placement
from phases._internal.storage import live_writes
from phases._internal.topics.sink import TopicSink

__all__ = ["republish_topic", "republish_placed_topic"]


def republish_topic(spark: SparkSession, pipeline: Pipeline) -> int:
    """Publishes the engine's table of ``pipeline``'s results into its result topic again, in one transaction
    (module text); returns the records published. Holds the live lease: refused (LeaseHeld) while a live phase runs.
    Refused (SinkError) when the topic already holds the live phase's writes (nothing was lost). The serving
    generation's topic; a pipeline placed elsewhere than declared: :func:`republish_placed_topic`."""
    return republish_placed_topic(spark, place(spark, pipeline))


def republish_placed_topic(spark: SparkSession, where: Placement) -> int:
    """:func:`republish_topic` of ``where.definition`` where ``where`` places it."""
    sink = where.definition.sink
    if not isinstance(sink, KafkaSink):
        raise DefinitionError(
            f"pipeline {where.name!r} has no topic sink (sink.kind {sink.kind!r}): there is no topic to publish into"
        )
    with leases.hold(spark, where, "live", f"republish {uuid.uuid4().hex[:12]}"):
        handoff = manifest.latest(spark, where.manifests, where.name)
        topic = TopicSink(where)
        try:
            topic.check()
            committed = topic.committed()
            if committed is not None and committed.handoff == handoff.manifest_id:
                raise SinkError(
                    f"{topic.where}: the topic holds the writes of handoff {handoff.manifest_id} up to micro-batch "
                    f"{committed.batch}: nothing was lost, so nothing was published again (its consumers would read "
                    "every result twice). Start the live phase"
                )
            batch = live_writes.live_writes(spark, where.sink_path, where.name, handoff.manifest_id)
            return topic.republish(spark, where.sink_path, handoff.manifest_id, -1 if batch is None else batch)
        finally:
            topic.close()
