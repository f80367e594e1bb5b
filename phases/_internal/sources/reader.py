"""Opens a pipeline's source declaration as the reader both phases use: a Delta table's change feed
(:mod:`phases._internal.sources.delta`), a Kafka topic cut into arrival chunks (:mod:`phases._internal.sources.kafka`),
a Delta archive handing over to a topic (:mod:`phases._internal.sources.hybrid`), or another pipeline's results
(:mod:`phases._internal.sources.pipeline_results`). A reader's ``arrival`` says how the
live phase numbers arrivals: ``"versions"`` (Delta commit versions) or ``"chunks"`` (one per micro-batch)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from phases._internal.definition import DeltaSource, HybridSource, KafkaSource, PipelineSource
from phases._internal.placement import Placement
from phases._internal.sources.delta import DeltaTableSource
from phases._internal.sources.hybrid import HybridArchiveSource
from phases._internal.sources.kafka import KafkaTopicSource
from phases._internal.sources.pipeline_results import PipelineResultsSource

SourceReader = DeltaTableSource | KafkaTopicSource | HybridArchiveSource


def open_source(
    spark: SparkSession,
    spec: DeltaSource | KafkaSource | HybridSource,
    where: Placement,
    *,
    position: str | None = None,
) -> SourceReader:
    """The reader for ``spec`` (an input of the placed definition) where ``where`` places it; ``position``: the
    handoff's recorded source position (Kafka: its chunk plan)."""
    if isinstance(spec, KafkaSource):
        return KafkaTopicSource(spark, spec, where.source_brokers(spec), position=position)
    if isinstance(spec, HybridSource):
        return HybridArchiveSource(
            spark, spec, where.source_path(spec.backlog), where.source_brokers(spec.live), position=position
        )
    if isinstance(spec, PipelineSource):
        return PipelineResultsSource(spark, spec, where.source_path(spec), where.upstream(spec))
    return DeltaTableSource(spark, spec, where.source_path(spec))


def open_inputs(
    spark: SparkSession, where: Placement, *, positions: dict[str, str | None] | None = None
) -> dict[str, SourceReader]:
    """A reader for each of the pipeline's inputs, by label (the source first); ``positions``: the handoff's
    recorded position of each input, by label (a Kafka input's chunk plan)."""
    positions = positions or {}
    return {
        i.label: open_source(spark, i.spec, where, position=positions.get(i.label)) for i in where.definition.inputs
    }


def continue_inputs(
    spark: SparkSession,
    where: Placement,
    *,
    positions: dict[str, str | None],
    firsts: dict[str, int],
    plans: dict[str, str] | None = None,
) -> dict[str, SourceReader]:
    """The readers of a catch-up increment, by label: a Delta input as always; a topic (or the topic an archive
    handed over to) continued from its base handoff's chunk plan (``positions``), its chunks numbered from
    ``firsts``, or following the plan an earlier attempt recorded (``plans``)."""
    plans = plans or {}
    readers: dict[str, SourceReader] = {}
    for i in where.definition.inputs:
        if isinstance(i.spec, KafkaSource | HybridSource):
            topic = i.spec.live if isinstance(i.spec, HybridSource) else i.spec
            readers[i.label] = KafkaTopicSource(
                spark,
                topic,
                where.source_brokers(topic),
                continue_from=positions[i.label],
                first=firsts[i.label],
                plan=plans.get(i.label),
            )
        else:
            readers[i.label] = open_source(spark, i.spec, where)
    return readers
