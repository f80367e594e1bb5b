"""Faults with a Kafka source on a real broker: a crash at each point of a live micro-batch, the broker going
away and coming back, a partition added while live, offsets deleted by retention before they were read."""

from __future__ import annotations

import time
import uuid

import pytest

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.coordination.progress_log import ProgressLog
from phases._internal.errors import PhaseStateError, SourceError
from phases._internal.live.runner import LiveRunner
from phases._internal.runtime.local_kafka import LocalKafka
from phases._internal.state.keyed_store import KeyedStateStore
from tests import reference
from tests.helpers import assert_results_equal, produce, sink_rows
from tests.phases.sources.test_kafka_source import DELAY_S, SECOND, chunk_versions, kafka_pipeline, kafka_quarantine

S = SECOND


def _rows(partitions: int, start_s: int, n: int, late_every: int = 0) -> list[tuple[int, reference.Row]]:
    """``n`` records spread over ``partitions``, event times from ``start_s`` on (every ``late_every``-th one far
    behind: late once the watermark passed it)."""
    out = []
    for i in range(n):
        t = (start_s + i) * S if not late_every or i % late_every else (start_s - 1000) * S
        out.append((i % partitions, (f"k{i % 5}", t, i)))
    return out


def _produce(kafka, topic, records, produced):
    for pos, (_, row) in zip(produce(kafka.bootstrap_servers, topic, records), records, strict=True):
        produced[pos] = row


def _assert_exact(spark, runner: LiveRunner, p, produced) -> None:
    """The sink and the quarantine equal the reference over the arrival chunks the run recorded."""
    expected, expected_q = reference.run(chunk_versions(runner.arrival_chunks(), produced), DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert kafka_quarantine(spark, p.locations.root) == sorted(expected_q, key=repr)


def test_a_micro_batch_that_crashes_at_each_point_in_turn_is_applied_exactly_once(spark, kafka, tmp_path, monkeypatch):
    """The same live micro-batch dies again and again, each time one write further: before its quarantine
    append, at its state write, at its sink write, before its progress record. Each restart replays it from
    Spark's offset log (the same offsets, the same chunk number) over what earlier attempts committed: nothing is
    lost, nothing counted or quarantined twice."""
    import phases._internal.live.micro_batch as engine

    topic = f"crash-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    p = kafka_pipeline(kafka, topic, str(tmp_path / "run"))
    produced: dict = {}
    _produce(kafka, topic, _rows(2, 100, 8), produced)
    BacklogRunner(spark, p).run()
    _produce(kafka, topic, _rows(2, 200, 12, late_every=4), produced)
    real_append, real_upsert, real_write = engine.tables.append_once, engine.tables.upsert_marked, ProgressLog.write
    real_update = KeyedStateStore.update

    for point in ("quarantine", "state", "sink", "progress"):

        def crash(*_a, point=point, **_k):
            raise RuntimeError(f"simulated crash at the {point} write")

        def append(*a, point=point, **k):
            return crash() if point == "quarantine" else real_append(*a, **k)

        def update(self, *a, point=point, **k):  # the state store's update, before it commits
            return crash() if point == "state" else real_update(self, *a, **k)

        def upsert(*a, point=point, **k):  # the sink write, after the store committed the next version
            return crash() if point == "sink" else real_upsert(*a, **k)

        def write(self, batch, record, point=point):
            return crash() if point == "progress" and batch >= 0 else real_write(self, batch, record)

        monkeypatch.setattr(engine.tables, "append_once", append)
        monkeypatch.setattr(KeyedStateStore, "update", update)
        monkeypatch.setattr(engine.tables, "upsert_marked", upsert)
        monkeypatch.setattr(ProgressLog, "write", write)
        with pytest.raises(Exception, match=f"simulated crash at the {point} write"):
            LiveRunner.from_manifest(spark, p).start(available_now=True)
        monkeypatch.undo()

    runner = LiveRunner.from_manifest(spark, p)
    runner.start(available_now=True)
    chunks = runner.arrival_chunks()
    # Two backlog chunks (2 offsets a partition each), then one live chunk: the replayed micro-batch, whole.
    assert sorted(chunks) == [0, 1, 2] and chunks[2] == {0: (4, 10), 1: (4, 10)}, chunks
    _assert_exact(spark, runner, p, produced)


def test_offsets_deleted_by_retention_before_the_live_phase_read_them_stop_it_with_the_range(spark, kafka, tmp_path):
    from confluent_kafka import TopicPartition

    topic = f"retention-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    p = kafka_pipeline(kafka, topic, str(tmp_path / "run"))
    _produce(kafka, topic, _rows(1, 100, 4), {})
    BacklogRunner(spark, p).run()  # ends at offset 4
    _produce(kafka, topic, _rows(1, 200, 4), {})
    admin = kafka.admin()
    admin.delete_records([TopicPartition(topic, 0, 6)])[TopicPartition(topic, 0, 6)].result(30)  # as retention would

    with pytest.raises(SourceError, match=r"partition 0 from offset 4.*offsets 4\.\.5 were deleted by retention"):
        LiveRunner.from_manifest(spark, p).start(available_now=True)


def test_a_partition_added_while_live_is_read_from_its_start(spark, kafka, tmp_path):
    from confluent_kafka.admin import NewPartitions

    topic = f"grow-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    p = kafka_pipeline(kafka, topic, str(tmp_path / "run"))
    produced: dict = {}
    _produce(kafka, topic, _rows(2, 100, 6), produced)
    BacklogRunner(spark, p).run()
    runner = LiveRunner.from_manifest(spark, p)
    runner.start()  # the running query (processing-time trigger)
    try:
        _produce(kafka, topic, _rows(2, 150, 4), produced)
        runner.process_available()
        admin = kafka.admin()
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
        _produce(kafka, topic, [(2, ("new", 170 * S, 1)), (2, ("new", 171 * S, 2)), (0, ("k1", 172 * S, 3))], produced)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the query sees the new partition at a later trigger
            runner.process_available()
            if "new" in sink_rows(spark, p.sink.path):
                break
            time.sleep(1)
    finally:
        runner.stop()
    chunks = runner.arrival_chunks()
    assert any(2 in ranges and ranges[2][0] == 0 for ranges in chunks.values()), chunks
    _assert_exact(spark, runner, p, produced)


@pytest.mark.slow
def test_the_broker_going_down_stops_the_live_run_visibly_and_a_restart_resumes_exactly(spark, tmp_path):
    broker = LocalKafka(tmp_path / "broker").start()
    try:
        topic = "events"
        broker.create_topic(topic, 2)
        fast_failure = {  # the live query gives up on a lost broker in seconds, not Kafka's default minutes
            "kafka.default.api.timeout.ms": "4000",
            "kafka.request.timeout.ms": "3000",
            "kafkaConsumer.pollTimeoutMs": "5000",
            "fetchOffset.numRetries": "1",
        }
        p = kafka_pipeline(broker, topic, str(tmp_path / "run"), options=fast_failure)
        produced: dict = {}
        _produce(broker, topic, _rows(2, 100, 6), produced)
        BacklogRunner(spark, p).run()
        runner = LiveRunner.from_manifest(spark, p)
        runner.start()
        _produce(broker, topic, _rows(2, 200, 6, late_every=3), produced)
        runner.process_available()

        broker.stop()
        deadline = time.monotonic() + 180
        while runner.query.isActive and time.monotonic() < deadline:
            time.sleep(1)
        with pytest.raises(PhaseStateError, match="stopped"):
            runner.raise_if_failed()
        runner.stop()

        broker.start()
        _produce(broker, topic, _rows(2, 300, 6), produced)
        resumed = LiveRunner.from_manifest(spark, p)
        resumed.start(available_now=True)
        _assert_exact(spark, resumed, p, produced)
    finally:
        broker.stop()


def test_a_kafka_source_with_no_broker_answering_is_refused_in_its_connect_timeout_naming_the_field(
    spark, tmp_path, caplog
):
    """No broker at source.bootstrap_servers: the backlog stops within source.connect_timeout with a SourceError
    naming the field and the way out, and librdkafka's retries are logged once; with a broker at that address the
    same backlog runs, exactly."""
    from datetime import timedelta

    from phases._internal.runtime.kafka_client_log import LOGGER_NAME
    from phases._internal.runtime.local_kafka import free_port

    port, topic = free_port(), f"events-{uuid.uuid4().hex[:8]}"

    class At:  # where kafka_pipeline points the source
        bootstrap_servers = f"127.0.0.1:{port}"

    p = kafka_pipeline(At, topic, str(tmp_path / "run"))
    p = p.model_copy(update={"source": p.source.model_copy(update={"connect_timeout": timedelta(seconds=4)})})
    started = time.monotonic()
    with caplog.at_level("ERROR", logger=LOGGER_NAME), pytest.raises(SourceError) as refused:
        BacklogRunner(spark, p).run()
    message, took = str(refused.value), time.monotonic() - started
    assert f"127.0.0.1:{port} (source.bootstrap_servers)" in message and "source.connect_timeout" in message, message
    assert "Nothing was read" in message and "run again" in message, message
    assert took < 4 + 30, f"refused after {took:.0f} s"
    logged = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME and "Connect to" in r.getMessage()]
    assert len(logged) == 1, logged

    with LocalKafka(tmp_path / "broker", port=port) as broker:  # the way out: the brokers answer at that address
        broker.create_topic(topic, 2)
        produced: dict = {}
        _produce(broker, topic, _rows(2, 1000, 40), produced)
        BacklogRunner(spark, p).run()
        runner = LiveRunner.from_manifest(spark, p)
        _assert_exact(spark, runner, p, produced)
