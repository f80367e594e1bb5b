"""The pipelines this code location serves. Paths are relative to the storage resource's root."""

import os
from datetime import timedelta

from phases import (
    Aggregation,
    DeltaSink,
    DeltaSource,
    KafkaSource,
    KeyedAggregate,
    Locations,
    Pipeline,
    SchemaRegistry,
)

DEMO = Pipeline(
    name="demo_events",
    source=DeltaSource(path="demo_events/source"),
    key_columns=["key"],
    event_time="ts",
    watermark_delay=timedelta(seconds=120),
    operator=KeyedAggregate(
        aggregations=[
            Aggregation(name="events", kind="count"),
            Aggregation(name="total", kind="sum", column="value"),
            Aggregation(name="smallest", kind="min", column="value"),
            Aggregation(name="largest", kind="max", column="value"),
            Aggregation(name="mean", kind="avg", column="value"),
            Aggregation(name="checksum", kind="reduce", column="value", reduce="acc ^ x"),
        ]
    ),
    sink=DeltaSink(path="demo_events/sink"),
    locations=Locations(root="demo_events/engine"),
    checkpoint_interval=timedelta(seconds=2),
    description="Per-key count, sum, min, max, mean and an XOR checksum of the demo's events.",
    owners=["team:data-platform"],
    tags={"domain": "demo", "tier": "bronze"},
)

# The demo pipeline changed: a wider watermark (5 minutes: fewer late records) and one more aggregation. It shapes
# another state, so it is deployed beside the running one and swapped in (`make demo ARGS="--redeploy"`, or a code
# location serving it and its redeploy job); deploying DEMO again rolls back.
DEMO_REVISED = DEMO.model_copy(
    update={
        "watermark_delay": timedelta(minutes=5),
        "operator": KeyedAggregate(
            aggregations=[*DEMO.operator.aggregations, Aggregation(name="valued", kind="count", column="value")]
        ),
        "description": "Per-key count, sum, min, max, mean, an XOR checksum and the count of non-null values of the "
        "demo's events (the demo pipeline's second revision).",
    }
)

# The same pipeline over a Kafka topic (JSON values). The broker address is the deployment's: the storage resource
# points the source at PHASES_KAFKA_BOOTSTRAP_SERVERS (`make demo ARGS="--source kafka"` starts a local broker).
DEMO_KAFKA = DEMO.model_copy(
    update={
        "name": "demo_kafka",
        "source": KafkaSource(
            topic="demo_events",
            bootstrap_servers="127.0.0.1:9092",
            value_schema="key string, ts timestamp, value bigint",
            backlog_chunk_records=50_000,
        ),
        "sink": DeltaSink(path="demo_kafka/sink"),
        "locations": Locations(root="demo_kafka/engine"),
    }
)


def _registry_twin(value_format: str) -> Pipeline:
    """The Kafka demo over a topic of ``value_format`` values (the Confluent wire format), their schema in a schema
    registry at PHASES_SCHEMA_REGISTRY_URL (`make demo ARGS="--source kafka-avro"` or `"--source kafka-protobuf"`
    starts a local broker and registry)."""
    name = f"demo_kafka_{value_format}"
    return DEMO_KAFKA.model_copy(
        update={
            "name": name,
            "source": KafkaSource(
                topic=f"demo_events_{value_format}",
                bootstrap_servers="127.0.0.1:9092",
                value_format=value_format,
                registry=SchemaRegistry(
                    url=os.environ.get("PHASES_SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7")
                ),
                backlog_chunk_records=50_000,
            ),
            "sink": DeltaSink(path=f"{name}/sink"),
            "locations": Locations(root=f"{name}/engine"),
        }
    )


# The same pipeline over a topic of Avro values, and over one of Protobuf values, with a schema registry.
DEMO_KAFKA_AVRO = _registry_twin("avro")
DEMO_KAFKA_PROTOBUF = _registry_twin("protobuf")

# The same aggregation over a source whose backlog is built in daily slices (the daily-partitioned backlog asset, its
# schedule and partition backfills). Its source starts empty: `make demo` writes the keyed demo's source only.
DEMO_DAILY = DEMO.model_copy(
    update={
        "name": "demo_daily",
        "source": DeltaSource(path="demo_daily/source"),
        "sink": DeltaSink(path="demo_daily/sink"),
        "locations": Locations(root="demo_daily/engine"),
        "description": "The demo's aggregation, its backlog built from daily slices (one partition per UTC day).",
    }
)
