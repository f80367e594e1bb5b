"""Invalid definitions fail at construction with the field and the valid values; the fingerprint covers
exactly what shapes the state."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from phases._internal.definition import Aggregation, DeltaSink, KeyedAggregate, Pipeline, ddl_field_names
from phases._internal.errors import DefinitionError
from tests.conftest import make_pipeline


def test_backlog_checkpoint_interval_must_be_zero_or_at_least_the_live_interval():
    with pytest.raises(DefinitionError) as err:
        make_pipeline(
            "/src",
            "/root",
            checkpoint_interval=timedelta(seconds=10),
            checkpoint_interval_during_backlog=timedelta(seconds=3),
        )
    msg = str(err.value)
    assert "checkpoint_interval_during_backlog (3.0s)" in msg and "checkpoint_interval (10.0s)" in msg


@pytest.mark.parametrize("backlog_s", [0, 10, 60])
def test_valid_backlog_checkpoint_intervals_are_accepted(backlog_s):
    p = make_pipeline(
        "/src",
        "/root",
        checkpoint_interval=timedelta(seconds=10),
        checkpoint_interval_during_backlog=timedelta(seconds=backlog_s),
    )
    assert p.checkpoint_interval_during_backlog == timedelta(seconds=backlog_s)


def test_unknown_aggregation_kind_lists_the_valid_kinds():
    with pytest.raises(DefinitionError) as err:
        Aggregation(name="m", kind="median", column="value")
    assert "'count', 'sum', 'min', 'max', 'avg' or 'reduce'" in str(err.value)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        (dict(name="s", kind="sum"), "kind 'sum' needs a 'column'"),
        (dict(name="r", kind="reduce", column="value"), "needs 'reduce'"),
        (dict(name="r", kind="reduce", column="value", reduce="acc * 2"), "uses both `acc` and `x`"),
        (dict(name="c", kind="count", reduce="acc + x"), "only valid with kind 'reduce'"),
        (dict(name="1bad", kind="count"), "not a column identifier"),
        (dict(name="_hidden", kind="count"), "reserved for engine columns"),
    ],
)
def test_aggregation_rules_name_the_field(fields, fragment):
    with pytest.raises(DefinitionError) as err:
        Aggregation(**fields)
    assert fragment in str(err.value)


def test_duplicate_aggregation_names_are_rejected():
    with pytest.raises(DefinitionError, match="repeated: \\['n'\\]"):
        KeyedAggregate(aggregations=[Aggregation(name="n", kind="count"), Aggregation(name="n", kind="count")])


def test_keys_events_and_outputs_may_not_clash():
    with pytest.raises(DefinitionError, match="clash with key columns"):
        make_pipeline("/src", "/root", operator=KeyedAggregate(aggregations=[Aggregation(name="key", kind="count")]))
    with pytest.raises(DefinitionError, match="cannot also be a key column"):
        make_pipeline("/src", "/root", key_columns=["key", "ts"])
    with pytest.raises(DefinitionError, match="watermark_delay must be >= 0"):
        make_pipeline("/src", "/root", watermark_delay=timedelta(seconds=-1))


def test_fingerprint_changes_with_state_shape_only():
    base = make_pipeline("/src", "/root")
    assert base.fingerprint() == make_pipeline("/src", "/root").fingerprint()
    assert base.fingerprint() == make_pipeline("/src", "/elsewhere", sink=DeltaSink(path="/other")).fingerprint()
    assert base.fingerprint() != make_pipeline("/src", "/root", delay_s=16).fingerprint()
    other_ops = KeyedAggregate(aggregations=[Aggregation(name="n", kind="count")])
    assert base.fingerprint() != make_pipeline("/src", "/root", operator=other_ops).fingerprint()


def test_every_definition_error_is_a_phases_error_with_the_field_paths(tmp_path):
    """Invalid definitions raise DefinitionError (a PhasesError), not pydantic's ValidationError, and keep
    pydantic's field paths: in the message and in ``errors``."""
    from phases._internal.errors import PhasesError
    from phases._internal.runtime.session import SparkSettings

    spec = make_pipeline(str(tmp_path / "s"), str(tmp_path / "r")).model_dump()
    spec["operator"]["aggregations"][0]["kind"] = "median"
    spec["watermark_delay"] = "soon"
    with pytest.raises(PhasesError) as err:
        Pipeline.model_validate(spec)
    assert isinstance(err.value, DefinitionError)
    msg = str(err.value)
    assert msg.startswith("invalid Pipeline: 2 errors")
    assert "operator.keyed_aggregate.aggregations.0.kind: Input should be 'count'" in msg
    assert "watermark_delay:" in msg and "'soon'" in msg
    assert {tuple(e["loc"])[:1] for e in err.value.errors} == {("operator",), ("watermark_delay",)}
    with pytest.raises(DefinitionError, match="shuffle_partitions: Input should be greater than 0"):
        SparkSettings(shuffle_partitions=0)
    with pytest.raises(DefinitionError, match="invalid KeyedAggregate: 1 error"):
        KeyedAggregate(aggregations=[])


def test_kafka_and_hybrid_sources_are_validated_with_messages_that_name_the_rule():
    from datetime import datetime

    from phases._internal.definition import HybridSource, KafkaHandoff, KafkaSource

    schema = "key string, ts timestamp, value bigint"
    ok = KafkaSource(topic="events", bootstrap_servers="b:9092", value_schema=schema)
    assert ok.field_names == ["key", "ts", "value"]
    cases = [
        (lambda: KafkaSource(topic="no spaces", bootstrap_servers="b:1", value_schema=schema), "not a Kafka topic"),
        (lambda: KafkaSource(topic="t", bootstrap_servers="b:1", value_schema="_x int"), "reserved for the engine"),
        (lambda: KafkaSource(topic="t", bootstrap_servers="b:1", value_schema="a int, a int"), "repeats fields"),
        (lambda: KafkaSource(topic="t", bootstrap_servers="b:1", value_schema="a"), "not a field of a DDL schema"),
        (
            lambda: KafkaSource(
                topic="t", bootstrap_servers="b:1", value_schema=schema, options={"startingOffsets": "x"}
            ),
            "set by the framework",
        ),
        (lambda: KafkaHandoff(), "exactly one of"),
        (lambda: KafkaHandoff(offsets={0: -1}), ">= 0"),
        (
            lambda: HybridSource(backlog={"path": "a"}, live=ok, handoff={"timestamp": datetime(2026, 1, 1)}),
            "set archive_partition_column and archive_offset_column",
        ),
        (
            lambda: HybridSource(
                backlog={"path": "a"}, live=ok, handoff={"offsets": {0: 1}}, archive_partition_column="p"
            ),
            "go together",
        ),
    ]
    for build, message in cases:
        with pytest.raises(DefinitionError, match=message):
            build()
    assert ddl_field_names("a struct<x: int, y: int>, b map<string, int>, c decimal(10, 2)") == ["a", "b", "c"]


def test_the_kafka_broker_address_and_client_settings_are_not_part_of_the_fingerprint(tmp_path):
    from phases._internal.definition import KafkaSource

    def pipeline(**source):
        fields = {
            "topic": "events",
            "bootstrap_servers": "b:9092",
            "value_schema": "key string, ts timestamp, value bigint",
        }
        return make_pipeline(KafkaSource(**{**fields, **source}), str(tmp_path))

    same = pipeline().fingerprint()
    assert pipeline(bootstrap_servers="other:9093", client_options={"socket.timeout.ms": "5000"}).fingerprint() == same
    assert pipeline(options={"kafka.security.protocol": "SSL"}).fingerprint() == same
    assert pipeline(backlog_chunk_records=10).fingerprint() != same  # chunks shape lateness, so the state
    assert pipeline(topic="other").fingerprint() != same


def test_an_invalid_reduce_expression_is_refused_when_the_pipeline_is_defined(spark):
    """``acc +* x`` used to pass the definition; the backlog then raised pyspark's ParseException, outside the
    engine's errors. With a session active, Spark's SQL parser checks it as the model is built (no job runs)."""
    from phases._internal.definition import Aggregation
    from phases._internal.errors import DefinitionError

    with pytest.raises(DefinitionError, match=r"aggregation 'x': reduce 'acc \+\* x' is not a Spark SQL expression"):
        Aggregation(name="x", kind="reduce", column="value", reduce="acc +* x")
    Aggregation(name="x", kind="reduce", column="value", reduce="greatest(acc, x)")


def test_every_way_to_change_a_definition_validates_it(tmp_path):
    """``model_copy(update=...)``, the way the guide changes settings, skipped pydantic's validation: a windowed
    pipeline given a changelog sink that way ran both phases and wrote three all-null columns."""
    from phases._internal.definition import Window, WindowedAggregate

    windowed = make_pipeline(
        str(tmp_path / "src"),
        str(tmp_path / "run"),
        operator=WindowedAggregate(
            window=Window(size=timedelta(seconds=10)), aggregations=[Aggregation(name="n", kind="count")]
        ),
    )
    with pytest.raises(DefinitionError, match="sink.mode 'changelog' is for operators that replace"):
        windowed.model_copy(update={"sink": DeltaSink(path=str(tmp_path / "sink"), mode="changelog")})
    with pytest.raises(DefinitionError, match="watermark_delay"):
        windowed.model_copy(update={"watermark_delay": "soon"})
    with pytest.raises(DefinitionError, match="no_such_field"):
        windowed.model_copy(update={"no_such_field": 1})
    # A valid change gives a validated definition; the original is unchanged, and a plain copy stays a copy.
    renamed = windowed.model_copy(update={"name": "renamed"})
    assert (renamed.name, windowed.name) == ("renamed", windowed.name) and renamed.operator == windowed.operator
    assert windowed.model_copy() == windowed and windowed.model_copy(deep=True) == windowed
    sink = DeltaSink(path=str(tmp_path / "sink"))
    assert sink.model_copy(update={"mode": "changelog"}).mode == "changelog"
    with pytest.raises(DefinitionError, match="mode"):
        sink.model_copy(update={"mode": "sometimes"})


@pytest.mark.parametrize(
    ("reduce", "fragment"),
    [
        ("acc + x + nope", "`nope` cannot be resolved"),
        ("acc + x + 'a'", "CAST_INVALID_INPUT"),
        ("max(acc) + x", "aggregate function"),
        ("max(acc + x)", "aggregate function"),
        ("acc + value + x", "`value` cannot be resolved"),
    ],
)
def test_a_reduce_that_parses_but_cannot_fold_is_refused_before_the_backlog_reads_anything(
    spark, tmp_path, reduce, fragment
):
    """These parse, so the definition took them; then the backlog raised Spark's own AnalysisException or
    NumberFormatException, or ('max(acc) + x') ran and the live phase blamed a schema change that never happened.
    Both phases build their logic through one analysis, which refuses them with the engine's DefinitionError."""
    from phases._internal.backlog.runner import BacklogRunner
    from phases._internal.live.runner import LiveRunner
    from phases._internal.storage import tables
    from tests.helpers import write_source

    source = str(tmp_path / "src")
    write_source(spark, source, {1: [("a", 1_000_000, 1), ("b", 2_000_000, 2)]})
    aggregations = [Aggregation(name="r", kind="reduce", column="value", reduce=reduce)]
    p = make_pipeline(source, str(tmp_path / "run"), operator=KeyedAggregate(aggregations=aggregations))
    rule = f"aggregation 'r': reduce {reduce!r} cannot fold column 'value'"
    with pytest.raises(DefinitionError, match=re.escape(rule) + ".*" + re.escape(fragment)):
        BacklogRunner(spark, p).run()
    assert not tables.exists(spark, p.sink.path)  # refused before anything was written
    with pytest.raises(DefinitionError, match=re.escape(rule)):
        LiveRunner.streaming_only(spark, p)


def test_a_reduce_that_folds_passes_the_analysis(spark):
    from pyspark.sql import types as T

    from phases._internal.operators.aggregation import reduce_problem

    for reduce in ("acc + x", "acc ^ x", "greatest(acc, x)", "acc | x"):
        assert reduce_problem(reduce, T.LongType()) is None, reduce
    assert reduce_problem("concat(acc, x)", T.StringType()) is None


def test_a_topic_sink_is_validated_and_its_topic_is_part_of_the_fingerprint_not_its_brokers():
    from phases._internal.definition import KafkaSink

    def sink(**fields) -> KafkaSink:
        return KafkaSink(**{"topic": "totals", "bootstrap_servers": "b1:9092", "path": "results", **fields})

    base = make_pipeline("/src", "/root", sink=sink())
    assert base.sink.kind == "kafka"
    assert base.fingerprint() == make_pipeline("/src", "/root", sink=sink(bootstrap_servers="b2:9092")).fingerprint()
    assert base.fingerprint() != make_pipeline("/src", "/root", sink=sink(topic="totals2")).fingerprint()
    assert base.fingerprint() != make_pipeline("/src", "/root", sink=DeltaSink(path="results")).fingerprint()
    # A definition read back (JSON, as the Dagster layer and the child processes pass it) keeps its topic sink.
    assert Pipeline.model_validate_json(base.model_dump_json()) == base
    # Where it runs: its table under the storage root, its brokers the environment's.
    from phases._internal.placement import Placement

    moved = Placement(base, root="/data", brokers="broker:9092")
    # Every generation that serves writes the declared topic: consumers never move at a redeploy.
    assert (moved.sink_path, moved.sink_brokers, moved.topic(), moved.at(2, serving=True).topic()) == (
        "/data/results",
        "broker:9092",
        "totals",
        "totals",
    )
    assert base.sink.path == "results" and base.sink.bootstrap_servers == "b1:9092"  # the definition is as declared
    for fields, fragment in [
        ({"topic": "a topic"}, "not a Kafka topic name"),
        ({"topic": ".."}, "not a Kafka topic name"),
        ({"client_options": {"isolation.level": "read_uncommitted"}}, "set by the topic sink itself"),
        ({"transaction_timeout": timedelta(0)}, "transaction_timeout must be positive"),
        ({"mode": "journal"}, "mode"),
    ]:
        with pytest.raises(DefinitionError, match=fragment):
            sink(**fields)


def test_registry_formats_need_a_registry_and_json_takes_none_of_their_settings():
    from phases import DefinitionError, KafkaSink, KafkaSource, SchemaRegistry

    registry = SchemaRegistry(url="http://127.0.0.1:8081")
    for fmt in ("avro", "protobuf"):
        with pytest.raises(DefinitionError, match=rf"source.value_format '{fmt}' needs source.registry"):
            KafkaSource(topic="t", bootstrap_servers="b:9092", value_format=fmt)
        with pytest.raises(DefinitionError, match=rf"sink.value_format '{fmt}' needs sink.registry"):
            KafkaSink(topic="t", bootstrap_servers="b:9092", path="p", value_format=fmt)
    source = KafkaSource(
        topic="t", bootstrap_servers="b:9092", value_format="protobuf", key_format="protobuf", registry=registry
    )
    assert source.subject == "t-value" and source.key_subject_name == "t-key"
    with pytest.raises(DefinitionError, match=r"\['registry'\] are for Avro or Protobuf records"):
        KafkaSource(topic="t", bootstrap_servers="b:9092", value_schema="k string", registry=registry)
    with pytest.raises(DefinitionError, match=r"'json', 'avro' or 'protobuf'|json.*avro.*protobuf"):
        KafkaSource(topic="t", bootstrap_servers="b:9092", value_format="thrift", registry=registry)
