"""Opens a pipeline's source declaration as the reader both phases use: a Delta table's change feed
(:mod:`phases.delta_source`) or a Kafka topic cut into arrival chunks (:mod:`phases.kafka_source`)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from phases.definition import DeltaSource, KafkaSource
from phases.delta_source import DeltaTableSource
from phases.kafka_source import KafkaTopicSource

SourceReader = DeltaTableSource | KafkaTopicSource


def open_source(spark: SparkSession, spec: DeltaSource | KafkaSource, *, position: str | None = None) -> SourceReader:
    """The reader for ``spec``; ``position``: the handoff's recorded source position (Kafka: its chunk plan)."""
    if isinstance(spec, KafkaSource):
        return KafkaTopicSource(spark, spec, position=position)
    return DeltaTableSource(spark, spec)
