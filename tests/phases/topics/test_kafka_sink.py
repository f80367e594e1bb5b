"""A pipeline whose results go to a Kafka topic (phases.KafkaSink) against the real broker: the handoff's results
then each live micro-batch's changes, each once, for any cut-off and any split of the live versions into runs; a
micro-batch replayed after a crash before its progress record is not published again; the ways a topic sink cannot
run yet are refused."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases import KafkaSink, Redeploy, inspect, place, read_topic
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.coordination.progress_log import ProgressLog
from phases._internal.definition import SessionAggregate, Window, WindowedAggregate
from phases._internal.errors import DefinitionError, SinkError
from phases._internal.live.runner import LiveRunner
from phases._internal.topics.reading import fold_upsert, read_committed
from phases._internal.topics.records import HEADER_BATCH, HEADER_HANDOFF
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import (
    EVENT_VERSIONS,
    append_version,
    assert_results_equal,
    materialize,
    sink_rows,
    write_source,
)
from tests.phases.operators.test_windows import AGGS, emitted_windows

DELAY_S = 15
SECOND = 1_000_000


def _sink(kafka, topic: str, mode: str = "upsert", path: str = "results", **fields) -> KafkaSink:
    return KafkaSink(topic=topic, bootstrap_servers=kafka.bootstrap_servers, mode=mode, path=path, **fields)


def _topic(kafka, partitions: int = 3) -> str:
    name = f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, partitions)
    return name


def _rows_by_key(values: dict[bytes, bytes]) -> dict[str, dict]:
    out = {}
    for key, value in values.items():
        row = json.loads(value)
        assert json.loads(key) == {"key": row["key"]}, (key, value)
        out[row.pop("key")] = row
    return out


def _live_runs(spark, pipeline, source: str, versions: dict, cutoff: int, splits: list[int]) -> None:
    """The live phase over the versions after ``cutoff``, started anew for each run of ``splits`` versions (each
    start resumes from the checkpoint; a run's versions may be split over micro-batches)."""
    pending = [v for v in sorted(versions) if v > cutoff]
    sizes = iter(splits)
    while pending:
        take = max(1, next(sizes, len(pending)))
        for v in pending[:take]:
            append_version(spark, source, versions[v])
        pending = pending[take:]
        live = LiveRunner.from_manifest(spark, pipeline, max_files_per_trigger=1)
        live.start(available_now=True)


def _pipeline(kafka, kind: str, source: str, root: Path, topic: str):
    """``keyed`` / ``keyed-changelog``: the keyed aggregation into an upsert / changelog topic; ``tumbling``: 20 s
    windows, ``session``: sessions with a 12 s gap, each result appended once."""
    if kind.startswith("keyed"):
        mode = "changelog" if kind == "keyed-changelog" else "upsert"
        return make_pipeline(
            source, str(root / "run"), delay_s=DELAY_S, sink=_sink(kafka, topic, mode, str(root / "t"))
        )
    if kind == "session":
        op = SessionAggregate(gap=timedelta(seconds=12), aggregations=AGGS)
    else:
        op = WindowedAggregate(window=Window(size=timedelta(seconds=20)), aggregations=AGGS)
    return make_pipeline(
        source, str(root / "run"), delay_s=DELAY_S, operator=op, sink=_sink(kafka, topic, path=str(root / "t"))
    )


@pytest.mark.slow
@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=EVENT_VERSIONS,
    cut=st.integers(min_value=0, max_value=5),
    splits=st.lists(st.integers(min_value=1, max_value=3), max_size=4),
    kind=st.sampled_from(["keyed", "keyed-changelog", "tumbling", "session"]),
    catch_up=st.integers(min_value=0, max_value=2),
)
def test_a_topic_sink_read_committed_equals_the_reference_and_the_engines_table(
    spark, kafka, tmp_path, raw, cut, splits, kind, catch_up
):
    """Random records, cut-off, catch-up increments before the switch (the last ``catch_up`` versions before the
    cut-off, one an increment) and runs of the live phase (each run a restart from the checkpoint, its versions one
    file a micro-batch): a read_committed consumer of the topic, folded per key, equals the plain reference and the
    engine's own Delta table; each change (each window) is in the topic once."""
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = materialize(raw)
    cutoff = min(cut, len(versions))
    write_source(spark, source, {v: rows for v, rows in versions.items() if v <= cutoff})
    topic = _topic(kafka)
    p = _pipeline(kafka, kind, source, root, topic)
    first = max(0, cutoff - catch_up)
    handoffs = [BacklogRunner(spark, p).run(end_version=first)]
    for v in range(first + 1, cutoff + 1):
        handoffs.append(BacklogRunner(spark, p).run_increment(end_version=v))
    handoff = handoffs[-1]
    _live_runs(spark, p, source, versions, cutoff, splits)

    read = list(read_committed(kafka.bootstrap_servers, topic))
    assert {r.headers[HEADER_HANDOFF] for r in read} <= {h.manifest_id.encode() for h in handoffs}
    first_publish = [
        r
        for r in read
        if r.headers[HEADER_HANDOFF] == handoffs[0].manifest_id.encode() and r.headers[HEADER_BATCH] == b"-1"
    ]
    assert len(first_publish) == handoffs[0].sink_rows  # the first handoff's results whole, then what changed
    # Nothing published twice: an increment's handoff publishes only what changed (a changelog row carries its
    # source version and batch, a result row its new figures).
    assert len({(r.key, r.value) for r in read}) == len(read), "a record was published twice"
    # The figures an orchestrator shows: the newest marker counts every record the newest handoff's writes published.
    figures = inspect.result_topic(place(None, p, strict=False))
    assert figures.marker.handoff == handoff.manifest_id
    assert figures.marker.records == len([r for r in read if r.headers[HEADER_HANDOFF] == handoff.manifest_id.encode()])
    newest = [int(r.headers[HEADER_BATCH]) for r in read if r.headers[HEADER_HANDOFF] == handoff.manifest_id.encode()]
    assert figures.marker.batch == max([-1, *newest])  # empty ones: none
    typed = [r.asDict() for r in read_topic(spark, p).collect()]  # the documented reader, with the table's types
    if kind in ("tumbling", "session"):
        if kind == "session":
            expected = reference.run_sessions(versions, DELAY_S * SECOND, 12 * SECOND)
        else:
            expected = reference.run_windows(versions, DELAY_S * SECOND, 20 * SECOND, 20 * SECOND)[0]
        published = emitted_windows(typed)
        assert len(typed) == len(read) == spark.read.format("delta").load(p.sink.path).count()  # each window once
        assert published == expected
        assert published == emitted_windows(spark.read.format("delta").load(p.sink.path).collect())
        return
    expected, _ = reference.run(versions, DELAY_S * SECOND)
    if kind == "keyed-changelog":
        # Every change once: one record a key a micro-batch of a handoff (a handoff's is its batch -1), its batch in
        # the value.
        changes = [(r.headers[HEADER_HANDOFF], r.headers[HEADER_BATCH], r.key) for r in read]
        assert len(changes) == len(set(changes)), "a change was published twice"
        assert all(json.loads(r.value)["_batch_id"] == int(r.headers[HEADER_BATCH]) for r in read)
    folded = _rows_by_key(fold_upsert(read))
    assert_results_equal(folded, expected)
    assert_results_equal({d.pop("key"): d for d in typed}, expected)
    if kind == "keyed":  # the engine's own Delta table of the results holds the same rows
        assert_results_equal(folded, sink_rows(spark, p.sink.path))


def test_a_micro_batch_replayed_after_a_crash_before_its_progress_record_is_not_published_again(
    spark, kafka, tmp_path, monkeypatch
):
    source = str(tmp_path / "source")
    rows = {1: [("a", 1 * SECOND, 1), ("b", 2 * SECOND, 2)], 2: [("a", 30 * SECOND, 3), ("c", 31 * SECOND, 4)]}
    write_source(spark, source, {1: rows[1]})
    topic = _topic(kafka)
    p = make_pipeline(
        source, str(tmp_path / "run"), delay_s=DELAY_S, sink=_sink(kafka, topic, path=str(tmp_path / "t"))
    )
    BacklogRunner(spark, p).run()
    append_version(spark, source, rows[2])

    real_write = ProgressLog.write

    def crash_after_the_writes(self, batch_id, record):
        if batch_id >= 0:
            raise RuntimeError("the process dies before micro-batch 0's progress record")
        return real_write(self, batch_id, record)

    monkeypatch.setattr(ProgressLog, "write", crash_after_the_writes)
    with pytest.raises(Exception, match="progress record"):
        LiveRunner.from_manifest(spark, p).start(available_now=True)
    published = [(r.headers[HEADER_BATCH], r.key) for r in read_committed(kafka.bootstrap_servers, topic)]
    assert published.count((b"0", b'{"key":"a"}')) == 1  # micro-batch 0 went out before the crash
    monkeypatch.setattr(ProgressLog, "write", real_write)

    LiveRunner.from_manifest(spark, p).start(available_now=True)  # replays micro-batch 0
    read = list(read_committed(kafka.bootstrap_servers, topic))
    changes = [(r.headers[HEADER_BATCH], r.key) for r in read]
    assert len(changes) == len(set(changes)) and (b"0", b'{"key":"a"}') in changes
    expected, _ = reference.run(rows, DELAY_S * SECOND)
    assert_results_equal(_rows_by_key(fold_upsert(read)), expected)  # the compacted view exact
    assert_results_equal(_rows_by_key(fold_upsert(read)), sink_rows(spark, p.sink.path))


def test_an_increment_stopped_before_its_publish_goes_out_at_the_live_start_with_only_what_changed(
    spark, kafka, tmp_path, monkeypatch
):
    """A catch-up increment's manifest is written and its process stops before it publishes: the live start
    publishes the increment's changes (a key it did not change is not sent again), then the live micro-batches; in
    the changelog topic each change once, folded the reference."""
    from phases._internal.topics.sink import TopicSink

    source = str(tmp_path / "source")
    versions = {
        1: [("a", 1 * SECOND, 1), ("b", 2 * SECOND, 2)],
        2: [("a", 30 * SECOND, 3), ("c", 31 * SECOND, 4)],
        3: [("c", 60 * SECOND, 5), ("d", 61 * SECOND, 6)],
    }
    write_source(spark, source, {1: versions[1]})
    topic = _topic(kafka)
    sink = _sink(kafka, topic, "changelog", path=str(tmp_path / "results"))
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S, sink=sink)
    backlog = BacklogRunner(spark, p).run()
    append_version(spark, source, versions[2])

    def stop(*args, **kwargs):
        raise RuntimeError("the process stops between the increment's manifest and its publish")

    real_publish = TopicSink.publish_handoff
    monkeypatch.setattr(TopicSink, "publish_handoff", stop)
    with pytest.raises(RuntimeError, match="between the increment's manifest"):
        BacklogRunner(spark, p).run_increment()
    monkeypatch.setattr(TopicSink, "publish_handoff", real_publish)
    increment = inspect.latest_handoff(spark, place(spark, p))
    assert increment.kind == "increment" and increment.base_manifest_id == backlog.manifest_id
    assert (
        inspect.result_topic(place(None, p, strict=False)).marker.handoff == backlog.manifest_id
    )  # the increment is not out yet

    append_version(spark, source, versions[3])
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    read = list(read_committed(kafka.bootstrap_servers, topic))
    ids = {backlog.manifest_id.encode(): "backlog", increment.manifest_id.encode(): "increment"}
    sent = [(ids[r.headers[HEADER_HANDOFF]], int(r.headers[HEADER_BATCH]), json.loads(r.key)["key"]) for r in read]
    assert sorted(s for s in sent if s[1] == -1) == [
        ("backlog", -1, "a"),
        ("backlog", -1, "b"),
        ("increment", -1, "a"),  # changed by version 2
        ("increment", -1, "c"),  # new in version 2; b unchanged: not sent again
    ]
    assert sorted(s[2] for s in sent if s[1] >= 0) == ["c", "d"]  # the live micro-batches: version 3
    expected, _ = reference.run(versions, DELAY_S * SECOND)
    assert_results_equal(_rows_by_key(fold_upsert(read)), expected)


@pytest.mark.slow
def test_kill_9_at_every_boundary_of_a_topic_write_then_a_restart_publishes_every_change_once(spark, kafka, tmp_path):
    """SIGKILL of the run's process group (Python and JVM) at each boundary in turn (tests.phases.topics.topic_child):
    in the backlog between its manifest and its publish, then in the live phase before a micro-batch's transaction
    begins, while it holds records, after its commit and before the progress record, and after the progress record;
    a version arrives after every kill, each run is the restart of the one killed before it. After a last restart:
    every change of the changelog in the topic once (0 lost, 0 duplicated), batch by batch the rows of the engine's
    Delta changelog, and folded, the reference."""
    import subprocess
    import sys

    from tests.phases.topics.topic_child import KILL_POINTS

    source = str(tmp_path / "source")
    versions = {v: [(k, v * 20 * SECOND + i * SECOND, v * 10 + i) for i, k in enumerate("abc")] for v in range(1, 8)}
    write_source(spark, source, {v: versions[v] for v in (1, 2)})
    topic = _topic(kafka)
    sink = _sink(kafka, topic, "changelog", path=str(tmp_path / "results"))
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S, sink=sink)
    head = 2
    for kill_at in KILL_POINTS:
        child = subprocess.run(
            [sys.executable, "-m", "tests.phases.topics.topic_child", p.model_dump_json(), kill_at],
            capture_output=True,
            text=True,
            timeout=600,
            start_new_session=True,  # its own process group: the kill takes the JVM with it
        )
        assert child.returncode == -9, (kill_at, child.returncode, child.stderr[-3000:])
        head += 1
        append_version(spark, source, versions[head])
    LiveRunner.from_manifest(spark, p, take_over=True).start(available_now=True)

    read = list(read_committed(kafka.bootstrap_servers, topic))
    changes = [(int(r.headers[HEADER_BATCH]), json.loads(r.key)["key"]) for r in read]
    assert len(changes) == len(set(changes)), "a change was published twice"
    table = spark.read.format("delta").load(p.sink.path).select("_batch_id", "key").collect()
    assert sorted(changes) == sorted((r["_batch_id"], r["key"]) for r in table), "the topic and the table differ"
    expected, _ = reference.run({v: versions[v] for v in range(1, head + 1)}, DELAY_S * SECOND)
    assert_results_equal(_rows_by_key(fold_upsert(read)), expected)


def test_a_consumer_of_the_named_topic_folds_the_serving_definition_through_a_redeploy_and_a_rollback(
    spark, kafka, tmp_path
):
    """A consumer never moves: the topic the sink names is the only one. At the swap it gets the new definition's
    whole result in one transaction (every key's new row, a tombstone for each key the new definition no longer has),
    and at the rollback's swap the old one's again (the key comes back); until a swap, a generation being built or
    caught up publishes nothing. Folded right after each swap and after each live run, the topic is the serving
    definition's reference; no other topic is made and nothing is published twice."""
    from confluent_kafka.admin import AdminClient

    from phases import Filter
    from tests.phases.redeploy.test_redeploy import _expected_new, _expected_old, _new, _old, _version

    source, root = str(tmp_path / "source"), str(tmp_path / "run")
    versions = {i: _version(i) for i in range(1, 6)}
    write_source(spark, source, {v: versions[v] for v in (1, 2)})
    topic = f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 3, **{"cleanup.policy": "compact"})
    sink = _sink(kafka, topic, path=f"{root}/results")
    old = _old(source, root, sink=sink)
    new = _new(source, root, sink=sink, steps=[Filter(condition="key != 'd'")])  # key d is gone in the new one

    def expected_new(upto: int) -> dict:
        return {k: v for k, v in _expected_new({v: versions[v] for v in range(1, upto + 1)}).items() if k != "d"}

    def folded() -> dict:
        return _rows_by_key(fold_upsert(read_committed(kafka.bootstrap_servers, topic)))

    BacklogRunner(spark, old).run()
    append_version(spark, source, versions[3])
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    assert_results_equal(folded(), _expected_old({v: versions[v] for v in (1, 2, 3)}))

    result = Redeploy(spark, new).run(reason="a new definition")
    assert result.swapped and result.generation == 1
    assert_results_equal(folded(), expected_new(3))  # at the swap, before the new live phase ran
    assert inspect.result_topic(place(None, new, strict=False)).topic == topic
    assert Redeploy(spark, new).plan().way == "none"
    append_version(spark, source, versions[4])
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    assert_results_equal(folded(), expected_new(4))
    assert_results_equal({r["key"]: r.asDict() for r in read_topic(spark, new).collect()}, expected_new(4))

    back = Redeploy(spark, old).run(reason="roll back")
    assert back.swapped and back.generation == 0
    assert_results_equal(folded(), _expected_old({v: versions[v] for v in range(1, 5)}))  # key d back
    append_version(spark, source, versions[5])
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    assert_results_equal(folded(), _expected_old(versions))
    read = list(read_committed(kafka.bootstrap_servers, topic))
    sent = [(r.key, r.value, r.headers[HEADER_HANDOFF], r.headers[HEADER_BATCH]) for r in read]
    assert len(set(sent)) == len(sent), "a record was published twice"
    topics = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(timeout=10).topics
    assert not [t for t in topics if t.startswith(f"{topic}-")], "a topic of a generation was made"


def test_a_redeploy_killed_around_its_topic_swap_leaves_one_definition_in_the_topic_and_a_rerun_publishes_it_once(
    spark, kafka, tmp_path
):
    """SIGKILL of the redeploy's process after the swap's Delta commit (before its topic write), inside the topic's
    transaction (its records at the broker, not committed), and after its commit: at each, a read_committed consumer
    folding the topic has exactly one definition (the old one until the swap's transaction commits, the new one from
    it); the rerun publishes the swap once and the new live phase goes on in the same topic."""
    from phases import Filter
    from tests.phases.redeploy.redeploy_child import run_until_killed
    from tests.phases.redeploy.test_redeploy import _expected_new, _expected_old, _new, _old, _version

    source, root = str(tmp_path / "source"), str(tmp_path / "run")
    versions = {i: _version(i) for i in range(1, 5)}
    write_source(spark, source, {v: versions[v] for v in (1, 2, 3)})
    topic = f"results-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 3, **{"cleanup.policy": "compact"})
    sink = _sink(kafka, topic, path=f"{root}/results")
    old = _old(source, root, sink=sink)
    new = _new(source, root, sink=sink, steps=[Filter(condition="key != 'd'")])
    upto3 = {v: versions[v] for v in (1, 2, 3)}
    expected_new = {k: v for k, v in _expected_new(upto3).items() if k != "d"}

    def folded() -> dict:
        return _rows_by_key(fold_upsert(read_committed(kafka.bootstrap_servers, topic)))

    BacklogRunner(spark, old).run()
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    for kill_at in ("swapped", "topic publish", "topic published"):
        run_until_killed(new, kill_at)
        now = folded()  # an open transaction left by the kill is not read
        if kill_at == "topic published":
            assert_results_equal(now, expected_new)
        else:
            assert_results_equal(now, _expected_old(upto3))
    assert Redeploy(spark, new, take_over=True).run().swapped
    assert_results_equal(folded(), expected_new)
    swap_writes = [r for r in read_committed(kafka.bootstrap_servers, topic) if r.headers[HEADER_BATCH] == b"-1"]
    # The backlog's handoff (keys a-d) and the swap's, once: a, b, c and a tombstone for d.
    assert sorted(Counter(r.headers[HEADER_HANDOFF] for r in swap_writes).values()) == [4, 4], swap_writes
    assert sum(r.value is None for r in swap_writes) == 1
    append_version(spark, source, versions[4])
    LiveRunner.from_manifest(spark, new, take_over=True).start(available_now=True)
    assert_results_equal(folded(), {k: v for k, v in _expected_new(versions).items() if k != "d"})


def test_a_window_topic_gets_a_boundary_then_the_new_definitions_windows_at_a_swap_and_the_old_ones_at_a_rollback(
    spark, kafka, tmp_path
):
    """Append results are not keyed: at the swap every partition gets a boundary record, then the new definition's
    whole result; a consumer that keeps what follows each partition's last boundary (``read_topic``) has exactly the
    serving definition's windows, as its table has them, after the swap, its live run and the rollback."""
    from phases._internal.topics.reading import HEADER_BOUNDARY, after_last_boundary
    from tests.phases.redeploy.test_redeploy import _version

    source, root = str(tmp_path / "source"), tmp_path
    versions = {i: _version(i) for i in range(1, 8)}
    write_source(spark, source, {v: versions[v] for v in (1, 2, 3)})
    topic = _topic(kafka)
    old = _pipeline(kafka, "tumbling", source, root, topic)
    new = old.model_copy(
        update={"operator": WindowedAggregate(window=Window(size=timedelta(seconds=30)), aggregations=AGGS)}
    )

    def check(p, generation: int) -> list:
        read = list(read_committed(kafka.bootstrap_servers, topic))
        table = spark.read.format("delta").load(p.sink.path).collect()
        assert emitted_windows(read_topic(spark, p).collect()) == emitted_windows(table)
        last = {r.partition: r.headers[HEADER_BOUNDARY] for r in read if HEADER_BOUNDARY in r.headers}
        assert last == {p: str(generation).encode() for p in range(3)}, last  # each partition's newest boundary
        return after_last_boundary(read)

    BacklogRunner(spark, old).run()
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    assert not [r for r in read_committed(kafka.bootstrap_servers, topic) if HEADER_BOUNDARY in r.headers]
    assert Redeploy(spark, new).run(reason="30 s windows").swapped
    kept = check(new, 1)
    assert kept and len({r.headers[HEADER_HANDOFF] for r in kept}) == 1  # the new generation's handoff only
    for v in (4, 5):
        append_version(spark, source, versions[v])
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    check(new, 1)
    back = Redeploy(spark, old).run(reason="roll back")
    assert (back.swapped, back.generation) == (True, 0), back
    check(old, back.generation)
    for v in (6, 7):
        append_version(spark, source, versions[v])
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    check(old, back.generation)


def test_a_missing_topic_is_refused_before_the_backlog_and_ways_without_exactly_once_are_refused(
    spark, kafka, tmp_path
):
    from datetime import date

    from phases import SliceRunner

    source = str(tmp_path / "source")
    write_source(spark, source, {1: [("a", SECOND, 1)]})
    p = make_pipeline(source, str(tmp_path / "run"), sink=_sink(kafka, "no-such-topic", path=str(tmp_path / "r")))
    with pytest.raises(SinkError, match="'no-such-topic'.*does not exist.*Create it first"):
        BacklogRunner(spark, p).run()
    with pytest.raises(DefinitionError, match="a daily slice is not available with a topic sink"):
        SliceRunner(spark, p, date(2026, 1, 1)).run_slice(date(2026, 1, 1))
    with pytest.raises(DefinitionError, match="client_options \\['transactional.id'\\] are set by the topic sink"):
        _sink(kafka, "t", client_options={"transactional.id": "mine"})


def test_a_replayed_micro_batch_is_in_sparks_kafka_sink_twice_and_in_the_topic_sink_once(spark, kafka, tmp_path):
    """Side by side, the state a crash between a micro-batch's sink write and its records leaves (made exactly: the
    records removed after a clean run): Spark's own Kafka sink (a plain query, update mode) runs the batch again and
    its records are in the topic twice; the topic sink's replay finds its marker and publishes nothing."""
    import os

    from pyspark.sql import functions as F

    source = str(tmp_path / "source")
    versions = {1: [("a", 1 * SECOND, 1), ("b", 2 * SECOND, 2)], 2: [("a", 30 * SECOND, 3), ("c", 31 * SECOND, 4)]}
    write_source(spark, source, {1: versions[1]})

    # Spark's Kafka sink: counts per key, the key as the Kafka key, once a micro-batch a version.
    plain_topic, checkpoint = _topic(kafka), str(tmp_path / "plain_checkpoint")

    def run_plain() -> None:
        counts = spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(source).groupBy("key").count()
        out = counts.select(F.to_json(F.struct("key")).alias("key"), F.to_json(F.struct("key", "count")).alias("value"))
        query = (
            out.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("topic", plain_topic)
            .option("checkpointLocation", checkpoint)
            .outputMode("update")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    # The topic sink on the same versions.
    topic = _topic(kafka)
    p = make_pipeline(
        source, str(tmp_path / "run"), delay_s=DELAY_S, sink=_sink(kafka, topic, "changelog", str(tmp_path / "t"))
    )
    handoff = BacklogRunner(spark, p).run()
    run_plain()
    append_version(spark, source, versions[2])
    run_plain()
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    before = (
        len(list(read_committed(kafka.bootstrap_servers, plain_topic))),
        len(list(read_committed(kafka.bootstrap_servers, topic))),
    )

    # What a crash after the sink write and before the records leaves: the last micro-batch's records removed.
    def remove(folder, name: str) -> None:  # a file and Hadoop's hidden checksum file beside it
        for path in (Path(folder) / name, Path(folder) / f".{name}.crc"):
            path.unlink(missing_ok=True)

    plain_last = max(int(f) for f in os.listdir(f"{checkpoint}/commits") if f.isdigit())
    remove(f"{checkpoint}/commits", str(plain_last))
    remove(tmp_path / "run" / "live" / handoff.manifest_id / "progress_log", "0.json")
    remove(tmp_path / "run" / "checkpoints" / handoff.manifest_id / "increment" / "commits", "0")
    run_plain()
    LiveRunner.from_manifest(spark, p).start(available_now=True)

    plain = list(read_committed(kafka.bootstrap_servers, plain_topic))
    ours = list(read_committed(kafka.bootstrap_servers, topic))
    # The replayed micro-batch (version 2: keys a and c updated) went out twice through Spark's Kafka sink.
    assert len(plain) == before[0] + 2, (before, len(plain))
    assert Counter(json.loads(r.key)["key"] for r in plain) == {"a": 3, "b": 1, "c": 2}  # once a batch: a 2, b 1, c 1
    assert len(ours) == before[1], "the topic sink published the replayed micro-batch again"
    changes = [(r.headers[HEADER_BATCH], r.key) for r in ours]
    assert len(changes) == len(set(changes))
    expected, _ = reference.run(versions, DELAY_S * SECOND)
    assert_results_equal(_rows_by_key(fold_upsert(ours)), expected)
