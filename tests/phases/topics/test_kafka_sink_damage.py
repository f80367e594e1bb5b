"""A topic sink under what an operator does around it: two live runners started at once, the result topic deleted
and made again between two live runs, the broker stopped for 15 s while the live phase runs. Every way either goes
on exactly (a read_committed consumer, folded, equals the reference; nothing published twice) or is refused with
an engine error naming the topic or the lease and a way out, which is run here to the end."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import KafkaSink
from phases._internal.errors import LeaseHeld, PhasesError, SinkError
from phases._internal.live.runner import LiveRunner
from phases._internal.topics.reading import fold_upsert, read_committed
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, write_source
from tests.phases.topics.test_kafka_sink import DELAY_S, SECOND, _rows_by_key, _sink

VERSIONS = {v: [(k, v * 20 * SECOND + i * SECOND, v * 10 + i) for i, k in enumerate("abcd")] for v in range(1, 8)}


def _upto(last: int) -> dict:
    return {v: rows for v, rows in VERSIONS.items() if v <= last}


def _handed_off(spark, broker, tmp_path, upto: int = 2, **sink_fields):
    """(source, pipeline, topic): an upsert topic sink's pipeline handed off over versions 1..``upto``."""
    source, topic = str(tmp_path / "source"), f"results-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 3)
    write_source(spark, source, _upto(upto))
    sink = _sink(broker, topic, path=str(tmp_path / "results"), **sink_fields)
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S, sink=sink)
    BacklogRunner(spark, p).run()
    return source, p, topic


def _assert_topic_is(broker, topic: str, last: int) -> list:
    read = list(read_committed(broker.bootstrap_servers, topic))
    assert len({(r.key, r.value) for r in read}) == len(read), "a record was published twice"
    assert_results_equal(_rows_by_key(fold_upsert(read)), reference.run(_upto(last), DELAY_S * SECOND)[0])
    return read


def test_two_live_runners_of_a_topic_sink_started_at_once_one_runs_the_other_is_refused(spark, kafka, tmp_path):
    """Both start in the same moment: the live lease lets one run; the other is refused (LeaseHeld, naming the
    holder) before it opens a producer, so it fences nothing. The topic holds each change once; a later start of
    the refused one goes on from where the first stopped."""
    source, p, topic = _handed_off(spark, kafka, tmp_path)
    append_version(spark, source, VERSIONS[3])
    runners = [LiveRunner.from_manifest(spark, p) for _ in range(2)]
    gate, outcomes = threading.Barrier(2), {}

    def start(i: int) -> None:
        gate.wait()
        try:
            runners[i].start(available_now=True)
            outcomes[i] = "ran"
        except PhasesError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert sorted(o if o == "ran" else type(o).__name__ for o in outcomes.values()) == ["LeaseHeld", "ran"], outcomes
    refused = next(o for o in outcomes.values() if isinstance(o, LeaseHeld))
    assert "live" in str(refused) and "stop" in str(refused).lower()
    _assert_topic_is(kafka, topic, 3)

    append_version(spark, source, VERSIONS[4])
    loser = next(i for i, o in outcomes.items() if o != "ran")
    LiveRunner.from_manifest(spark, p).start(available_now=True)  # the way out: start it again once the other ends
    assert loser in outcomes
    _assert_topic_is(kafka, topic, 4)


def test_a_result_topic_deleted_and_made_again_between_two_live_runs_is_refused_and_republished(spark, kafka, tmp_path):
    """The topic deleted and created again (empty) between two live runs: its consumers lost every result, and the
    next micro-batch would publish only what changed. The start is refused naming the topic and the way out;
    that way out, run to the end, leaves the whole result in the new topic once, then the live changes."""
    from confluent_kafka.admin import AdminClient

    source, p, topic = _handed_off(spark, kafka, tmp_path)
    append_version(spark, source, VERSIONS[3])
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    _assert_topic_is(kafka, topic, 3)

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.5)
    while True:  # the broker may still be removing it
        try:
            kafka.create_topic(topic, 3)
            break
        except Exception:  # noqa: BLE001
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    append_version(spark, source, VERSIONS[4])
    with pytest.raises(SinkError, match=topic) as refused:
        LiveRunner.from_manifest(spark, p).start(available_now=True)
    said = str(refused.value)
    assert "republish" in said, said
    assert list(read_committed(kafka.bootstrap_servers, topic)) == []  # nothing went out

    from phases import republish_topic

    republish_topic(spark, p)  # the way out the refusal names
    _assert_topic_is(kafka, topic, 3)
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    _assert_topic_is(kafka, topic, 4)


@pytest.mark.slow
def test_the_broker_stopped_for_15_s_while_live_the_topic_gets_every_change_once(spark, tmp_path):
    """The result topic's broker (its own, on loopback) stopped for 15 s while the live query runs and versions
    arrive. The micro-batch that publishes meanwhile waits for the broker (up to sink.transaction_timeout, 45 s here:
    longer than the outage) before its transaction, then writes with fresh clients; it used to stop the query at once,
    naming no broker (a SinkError: "the end offsets around batch 2's write could not be read ... No leaders found"),
    and then to block for the whole timeout in librdkafka's send_offsets_to_transaction (a client that lived through
    the restart lost its group coordinator) and stop the query. A broker that comes back later than the timeout, or
    restarts while a transaction is open, stops the query with an engine error naming the brokers and the way out, a
    start again. Either way, once the broker is back, the topic holds every change once and folds to the reference."""
    from phases._internal.runtime.local_kafka import LocalKafka

    broker = LocalKafka(tmp_path / "broker").start()
    try:
        source, p, topic = _handed_off(spark, broker, tmp_path, transaction_timeout=timedelta(seconds=45))
        runner = LiveRunner.from_manifest(spark, p)
        runner.start()
        try:
            append_version(spark, source, VERSIONS[3])
            runner.process_available()
            broker.stop()
            append_version(spark, source, VERSIONS[4])
            time.sleep(15)
            broker.start()
            append_version(spark, source, VERSIONS[5])
            failed = None
            try:
                runner.process_available()
                runner.raise_if_failed()
            except PhasesError as exc:
                failed = exc
        finally:
            runner.stop()
        if failed is not None:
            said = str(failed)
            assert broker.bootstrap_servers in said and "start the live phase again" in said, said
            assert "Py4J" not in said and "KafkaException" not in said, said
            LiveRunner.from_manifest(spark, p).start(available_now=True)  # the way out it names
        _assert_topic_is(broker, topic, 5)

        from phases._internal.topics.records import Record
        from phases._internal.topics.transactions import Marker, TopicWriter

        # Down between two writes and back within the bound: the next write waits, then commits (it used to block
        # in send_offsets_to_transaction until the bound and fail).
        writer = TopicWriter(broker.bootstrap_servers, topic, "other", timeout_s=30, connect_timeout_s=5)
        writer.write([Record(b"k", b"v")], Marker(0, "h"))
        broker.stop()
        threading.Timer(3.0, broker.start).start()
        assert writer.write([Record(b"k", b"w")], Marker(1, "h")) == 1
        assert writer.committed() == Marker(1, "h")
        writer.close()

        # Down for longer than the bound: an engine error naming the brokers and the way out, nothing committed.
        writer = TopicWriter(broker.bootstrap_servers, topic, "other", timeout_s=5, connect_timeout_s=5)
        writer.committed()
        broker.stop()
        with pytest.raises(SinkError) as refused:
            writer.write([Record(b"k", b"x")], Marker(2, "h"))
        said = str(refused.value)
        assert broker.bootstrap_servers in said and "answer" in said and "KafkaException" not in said, said
        writer.close()
    finally:
        broker.stop()


def test_a_topic_sinks_backlog_with_no_broker_answering_is_refused_in_its_connect_timeout_naming_the_field(
    spark, tmp_path, capfd, caplog
):
    """No broker at sink.bootstrap_servers: the backlog stops within sink.connect_timeout with a SinkError naming the
    field and the way out, before anything is written; librdkafka's retries (one every few tens of milliseconds) are
    logged once, not a line each. (It used to fail after 60 s with a raw KafkaException naming neither, and print a
    line per attempt.) The way out, a broker at the named address, then runs the backlog to the end."""
    from phases._internal.runtime.kafka_client_log import LOGGER_NAME
    from phases._internal.runtime.local_kafka import LocalKafka, free_port

    source, topic, port = str(tmp_path / "source"), "results", free_port()
    write_source(spark, source, _upto(2))
    sink = KafkaSink(
        topic=topic,
        bootstrap_servers=f"127.0.0.1:{port}",
        path=str(tmp_path / "results"),
        connect_timeout=timedelta(seconds=4),
    )
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S, sink=sink)
    capfd.readouterr()
    started = time.monotonic()
    with caplog.at_level("ERROR", logger=LOGGER_NAME), pytest.raises(SinkError) as refused:
        BacklogRunner(spark, p).run()
    took = time.monotonic() - started
    message = str(refused.value)
    assert f"127.0.0.1:{port} (sink.bootstrap_servers)" in message and "sink.connect_timeout" in message, message
    assert "Nothing was written" in message and "run again" in message, message
    assert took < 4 + 30, f"refused after {took:.0f} s"
    printed = capfd.readouterr()
    attempts = [line for line in (printed.out + printed.err).splitlines() if "Connect to" in line]
    logged = [r for r in caplog.records if r.name == LOGGER_NAME and "Connect to" in r.getMessage()]
    assert len(attempts) <= 1 and len(logged) == 1, (attempts[:5], len(attempts), [r.getMessage() for r in logged])
    written = sorted(str(d.parent.relative_to(tmp_path)) for d in tmp_path.glob("**/_delta_log"))
    assert written == ["source"], f"tables written before the refusal: {written}"

    with LocalKafka(tmp_path / "broker", port=port) as broker:  # the way out: the brokers answer at that address
        broker.create_topic(topic, 3)
        BacklogRunner(spark, p).run()
        _assert_topic_is(broker, topic, 2)
