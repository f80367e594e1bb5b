"""A pipeline on a secured broker, as teams run Kafka: SASL/PLAIN users and ACLs. With the right credentials and
grants, backlog then live from a source topic into a result topic equal the reference; a wrong password, a missing
grant, or Spark's options and the engine's client settings disagreeing are each refused with an engine error that
names the field and the way out (nothing read, nothing written), and each way out is run to the end."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSink, KafkaSource
from phases._internal.errors import SinkError, SourceError
from phases._internal.live.runner import LiveRunner
from phases._internal.topics.reading import fold_upsert, read_committed
from phases.local import LocalKafka, client_settings, spark_options
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import assert_results_equal, produce, sink_rows
from tests.phases.sources.test_kafka_source import CHUNK, DELAY_S, SECOND, VALUE_SCHEMA
from tests.phases.topics.test_kafka_sink import _rows_by_key

PASSWORD = "the-team-secret"
WRONG = "not-the-team-secret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A broker that takes SASL/PLAIN connections only and authorizes with ACLs: users 'team' and 'newcomer'."""
    broker = LocalKafka(tmp_path_factory.mktemp("secured-broker"), users={"team": PASSWORD, "newcomer": PASSWORD})
    broker.start()
    yield broker
    broker.stop()


def _topics(broker: LocalKafka) -> tuple[str, str]:
    """A source topic (2 partitions) and a result topic (3), made by the broker's admin."""
    tag = uuid.uuid4().hex[:8]
    source, results = f"team.events-{tag}", f"team.results-{tag}"
    broker.create_topic(source, 2)
    broker.create_topic(results, 3)
    return source, results


def _pipeline(broker, source_topic, results_topic, root, *, spark_user=("team", PASSWORD), client=None, sink=None):
    user = ("team", PASSWORD)
    source = KafkaSource(
        topic=source_topic,
        bootstrap_servers=broker.bootstrap_servers,
        value_schema=VALUE_SCHEMA,
        backlog_chunk_records=CHUNK,
        options=spark_options(*spark_user),
        client_options=client_settings(*(client or user)),
        connect_timeout=timedelta(seconds=120),  # a refusal must not wait for it
    )
    result = KafkaSink(
        topic=results_topic,
        bootstrap_servers=broker.bootstrap_servers,
        path=f"{root}/results",
        client_options=client_settings(*(sink or user)),
        connect_timeout=timedelta(seconds=120),
    )
    return make_pipeline(source, str(root), delay_s=DELAY_S, sink=result)


def _rows(start_s: int, n: int) -> list[tuple[int, reference.Row]]:
    return [(i % 2, (f"k{i % 3}", (start_s + i) * SECOND, i)) for i in range(n)]


def _assert_exact(spark, broker, p, rows: list[reference.Row]) -> None:
    """The engine's result table and the result topic (read_committed, folded) both equal the reference over
    ``rows`` (one version: the records fall into arrival chunks, but a keyed aggregate's results over all of them
    do not depend on the split once the watermark passed them)."""
    expected, _ = reference.run({1: rows}, DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    read = list(read_committed(broker.bootstrap_servers, p.sink.topic, client_config=broker.admin_settings))
    assert len({(r.key, r.value) for r in read}) == len(read), "a record was published twice"
    assert_results_equal(_rows_by_key(fold_upsert(read)), expected)


def test_backlog_and_live_on_a_broker_with_users_and_acls_equal_the_reference(spark, secured, tmp_path):
    """User 'team' may use its two topics and the engine's groups and transactional ids ('phases.' prefixed) only:
    the backlog reads the source topic, publishes into the result topic, and the live phase goes on exactly."""
    source, results = _topics(secured)
    secured.allow("team", topics=(source, results), prefixes=("phases.",))
    p = _pipeline(secured, source, results, tmp_path / "run")
    first, then = _rows(100, 8), _rows(200, 10)
    produce(secured.bootstrap_servers, source, first, secured.admin_settings)
    BacklogRunner(spark, p).run()
    produce(secured.bootstrap_servers, source, then, secured.admin_settings)
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    _assert_exact(spark, secured, p, [row for _, row in first + then])


def test_a_wrong_password_is_refused_at_once_naming_the_settings_that_hold_it(spark, secured, tmp_path):
    """A wrong password in the engine's client settings (source.client_options, sink.client_options) or in Spark's
    (source.options) is refused as credentials the brokers refused, not as brokers that did not answer (the connect
    timeout is 120 s: the refusal does not wait for it), naming the field; run again with the right one, the
    pipeline goes on exactly."""
    source, results = _topics(secured)
    secured.allow("team", topics=(source, results), prefixes=("phases.",))
    root = tmp_path / "run"
    rows = _rows(100, 8)
    produce(secured.bootstrap_servers, source, rows, secured.admin_settings)

    with pytest.raises(SourceError) as refused:
        BacklogRunner(spark, _pipeline(secured, source, results, root, client=("team", WRONG))).run()
    assert "refused the credentials" in str(refused.value) and "source.client_options" in str(refused.value)
    assert WRONG not in str(refused.value)
    with pytest.raises(SinkError) as refused_sink:
        BacklogRunner(spark, _pipeline(secured, source, results, root, sink=("team", WRONG))).run()
    assert "refused the credentials" in str(refused_sink.value) and "sink.client_options" in str(refused_sink.value)
    with pytest.raises(SourceError) as refused_spark:
        BacklogRunner(spark, _pipeline(secured, source, results, root, spark_user=("team", WRONG))).run()
    text = str(refused_spark.value)
    assert "refused" in text and "source.options" in text and "kafka.sasl.jaas.config" in text, text
    assert WRONG not in text

    p = _pipeline(secured, source, results, root)
    BacklogRunner(spark, p).run()  # the way out: the right password
    later = _rows(200, 10)
    produce(secured.bootstrap_servers, source, later, secured.admin_settings)
    with pytest.raises(SourceError) as refused_live:  # the live phase's Spark options (not in the fingerprint)
        LiveRunner.from_manifest(spark, _pipeline(secured, source, results, root, spark_user=("team", WRONG))).start(
            available_now=True
        )
    assert "source.options" in str(refused_live.value), refused_live.value
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    _assert_exact(spark, secured, p, [row for _, row in rows + later])


def test_a_user_without_a_grant_is_refused_naming_the_topic_and_what_to_grant(spark, secured, tmp_path):
    """User 'newcomer' is granted one thing at a time; each missing grant is refused naming the topic or the id it
    is for (not as a topic that does not exist), and once everything is granted the pipeline runs exactly."""
    source, results = _topics(secured)
    newcomer = ("newcomer", PASSWORD)
    p = _pipeline(secured, source, results, tmp_path / "run", spark_user=newcomer, client=newcomer, sink=newcomer)
    rows = _rows(100, 8)
    produce(secured.bootstrap_servers, source, rows, secured.admin_settings)

    with pytest.raises(SourceError) as refused:
        BacklogRunner(spark, p).run()
    text = str(refused.value)
    assert "not authorized" in text and source in text and "does not exist" not in text, text
    secured.allow("newcomer", topics=(source,))
    with pytest.raises(SinkError) as refused_sink:
        BacklogRunner(spark, p).run()
    text = str(refused_sink.value)
    assert "not authorized" in text and results in text and "does not exist" not in text, text
    secured.allow("newcomer", topics=(results,))
    with pytest.raises(SinkError) as refused_id:
        BacklogRunner(spark, p).run()
    text = str(refused_id.value)
    assert "not authorized" in text and "transactional id" in text and "phases.events.g0" in text, text
    secured.allow("newcomer", prefixes=("phases.",))
    BacklogRunner(spark, p).run()
    _assert_exact(spark, secured, p, [row for _, row in rows])
