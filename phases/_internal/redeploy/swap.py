"""The swap's commits: a whole sink copied into another table in one Delta commit.

A swap makes the consumer-facing table (``sink.path``) hold another generation's results (decision record
``docs/decisions/0004``): one overwrite of the table with the rows of that generation's own sink, so that a reader of
the path or of a catalog name over it sees the old generation's results or the new one's, never a mix, a gap or an
empty table. The same copy (:func:`phases._internal.deployment.kept.copy_sink`) keeps the results the consumer-facing
table held before the swap, as the old generation's own sink, after the new live phase's start
(:mod:`phases._internal.deployment.kept`): a rollback swaps them back.

The copy carries the write mark of the source's newest micro-batch write (:mod:`phases._internal.storage.live_writes`)
in its
``userMetadata``: the generation's live phase, started afterwards on the copy, finds the write its progress log names
there and goes on from it; a replay of that micro-batch is skipped. Beside it, the swap's own mark names the redeploy,
the generations and the handoff, so that a rerun after a crash, or a redeploy that finds the redeploy log behind the
table, can tell from the table's history whether the swap's commit was made
(:func:`phases._internal.deployment.generations.newest_swap`; never from the newest commit alone: the new live phase
writes after it).
"""

from __future__ import annotations

import json

from pyspark.sql import SparkSession

from phases._internal.definition import KafkaSink, ValueFormat
from phases._internal.deployment import generations
from phases._internal.deployment.kept import copy_sink, write_mark_of
from phases._internal.errors import PhaseStateError
from phases._internal.placement import LogRow, Placement

SWAP_MARK = generations.SWAP_MARK

__all__ = ["copy_sink", "publish_to_topic", "topic_schema_problems", "write_mark_of"]


def topic_schema_problems(spark: SparkSession, new: Placement) -> list[str]:
    """An Avro or Protobuf topic sink: why the registry would refuse the schemas of generation ``new``'s results (its
    subjects' compatibility rules), checked before the swap; nothing is registered. Empty when it would take them."""
    sink = new.definition.sink
    if not isinstance(sink, KafkaSink) or sink.value_format == ValueFormat.JSON:
        return []
    from phases._internal.errors import SinkError
    from phases._internal.topics.record_formats import registered_records

    columns = spark.read.format("delta").load(new.sink_path).schema
    try:
        registered = registered_records(sink, new.name)
        assert registered is not None, "not JSON"
        registered.check_compatible(columns, list(new.definition.key_columns))
    except SinkError as exc:
        return [str(exc)]
    return []


def publish_to_topic(spark: SparkSession, placement: Placement, step: LogRow, version: int) -> int | None:
    """A topic sink: the swap of ``step`` published into the pipeline's one result topic
    (:mod:`phases._internal.topics.swap_publish`): the consumer-facing table at the swap's commit ``version`` against
    the table just before it (nothing wrote it between the serving live phase's stop and the commit). Returns the
    records produced (None: a Delta sink, or the topic holds that write already)."""
    if not isinstance(placement.definition.sink, KafkaSink):
        return None
    from phases._internal.topics.swap_publish import publish_swap

    assert step.from_generation is not None and step.manifest_id is not None, "a swapping row names both"
    gens = generations.read(spark, placement)
    spec = gens.specs.get(step.from_generation)
    keys = list(placement.definition.key_columns)
    before_keys = json.loads(spec).get("key_columns", keys) if spec is not None else keys
    consumer = placement.consumer_sink
    before = spark.read.format("delta").option("versionAsOf", version - 1).load(consumer)
    after = spark.read.format("delta").option("versionAsOf", version).load(consumer)
    missing = [k for k in before_keys if k not in before.columns]
    if missing:
        raise PhaseStateError(
            f"pipeline {placement.name!r}: the results generation {step.from_generation} served ({consumer} at "
            f"version {version - 1}) have no key columns {missing}, so the swap cannot tombstone their keys in the "
            "result topic. Nothing was published; the swap's Delta commit is made. Run "
            "phases.republish_topic(spark, pipeline) with the definition that now serves, then start its live phase"
        )
    return publish_swap(
        placement.at(step.generation, serving=True, redeploys=gens),
        before,
        after,
        before_keys,
        handoff_id=step.manifest_id,
        from_generation=step.from_generation,
        redeploy_id=step.redeploy_id,
    )
