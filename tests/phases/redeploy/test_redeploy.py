"""Changing a running pipeline: a changed definition is built beside the serving one and swapped in with one commit on
the sink consumers read; the previous definition is swapped back the same way (phases._internal.redeploy)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases import Redeploy
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.coordination import leases
from phases._internal.definition import KeyedAggregate
from phases._internal.definition.changes import DefinitionChanges
from phases._internal.deployment import generations, kept
from phases._internal.deployment.binding import maintain
from phases._internal.errors import LeaseHeld, ManifestError, PhaseStateError
from phases._internal.live.runner import LiveRunner
from phases._internal.placement import Placement
from phases._internal.redeploy.plan import STEPS
from phases._internal.runtime.session import BACKGROUND_POOL, SCHEDULER_POOL
from tests import reference
from tests.conftest import AGGREGATIONS, examples, make_pipeline
from tests.helpers import (
    EVENT_VERSIONS,
    append_version,
    assert_results_equal,
    materialize,
    remove_newest_commits,
    sink_rows,
    write_source,
)

SECOND = 1_000_000
OLD_DELAY_S, NEW_DELAY_S = 15, 40
OLD_COLUMNS = ("n", "total")


def _old(source: str, root: str, **overrides):
    """The running definition: a count and a sum per key, 15 s of watermark delay."""
    aggregations = [a for a in AGGREGATIONS if a.name in OLD_COLUMNS]
    return make_pipeline(
        source, root, delay_s=OLD_DELAY_S, operator=KeyedAggregate(aggregations=aggregations), **overrides
    )


def _new(source: str, root: str, **overrides):
    """The changed definition: every aggregation, and 40 s of watermark delay (a change of the state's meaning)."""
    return make_pipeline(source, root, delay_s=NEW_DELAY_S, **overrides)


def _expected_old(versions: dict) -> dict[str, dict]:
    results, _ = reference.run(versions, OLD_DELAY_S * SECOND)
    return {k: {c: v[c] for c in OLD_COLUMNS} for k, v in results.items()}


def _expected_new(versions: dict) -> dict[str, dict]:
    return reference.run(versions, NEW_DELAY_S * SECOND)[0]


def _version(i: int, keys: str = "abcd") -> list[tuple]:
    """Version ``i``: one record per key at about i * 20 s, and one 30 s behind (late with 15 s of delay, on time
    with 40 s)."""
    clock = i * 20 * SECOND
    return [(k, clock + j * SECOND, i * 10 + j) for j, k in enumerate(keys)] + [("a", clock - 30 * SECOND, 1000 + i)]


def _upto(versions: dict, last: int) -> dict:
    return {v: rows for v, rows in versions.items() if v <= last}


def _handed_off(spark, tmp_path, versions: dict, upto: int):
    """(root, source, old, new): a source of ``versions`` 1..``upto`` and the old definition's backlog over it."""
    root, source = str(tmp_path / "run"), str(tmp_path / "source")
    write_source(spark, source, _upto(versions, upto))
    old, new = _old(source, root), _new(source, root)
    BacklogRunner(spark, old).run()
    return root, source, old, new


def _matches(actual: dict, expected: dict) -> bool:
    try:
        assert_results_equal(actual, expected)
    except AssertionError:
        return False
    return True


def test_the_diff_names_each_change_and_the_way_it_needs():
    old = _old("/data/source", "/data/run")
    new = _new("/data/source", "/data/run")
    changes = DefinitionChanges.between(old.state_spec(), new.state_spec())
    assert changes.way == "backfill"
    fields = {d.field for d in changes.shape}
    assert "watermark_delay_us" in fields and "operator.aggregations.length" in fields
    text = changes.describe("serving", "new")
    assert "[shape] watermark_delay_us: serving 15000000, new 40000000" in text
    assert "needs a backfill" in text

    forward = old.model_copy(update={"max_future": timedelta(hours=2)})
    changes = DefinitionChanges.between(old.state_spec(), forward.state_spec())
    assert changes.way == "forward"
    assert [d.field for d in changes.forward] == ["max_future_us"]
    assert "needs no backfill" in changes.describe()
    assert DefinitionChanges.between(old.state_spec(), old.state_spec()).way == "none"


def test_a_redeploy_builds_beside_the_running_pipeline_then_swaps_and_rolls_back(spark, tmp_path, monkeypatch):
    """The old live phase runs (its own query, in this process) while the new definition's backlog runs beside it; it
    is stopped on request right before the swap; the new definition serves afterwards, and a redeploy of the old
    definition swaps its kept generation back."""
    versions = {i: _version(i) for i in range(1, 9)}
    root, source, old, new = _handed_off(spark, tmp_path, versions, 3)
    serving = LiveRunner.from_manifest(spark, old)
    serving.start()
    for v in (4, 5):
        append_version(spark, source, versions[v])
    serving.process_available()
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(_upto(versions, 5)))

    # A live start of the old definition's pipeline is refused while one runs (its lease), as ever.
    with pytest.raises(LeaseHeld):
        LiveRunner.from_manifest(spark, old).start(available_now=True)

    reads: list[tuple[str, dict]] = []

    def on_step(step: str, detail: dict) -> None:
        reads.append((step, sink_rows(spark, old.sink.path)))
        if step == "backlog":
            append_version(spark, source, versions[6])  # arrives while the new generation catches up

    redeploy = Redeploy(spark, new, on_step=on_step, stop_timeout_s=120)
    plan = redeploy.plan()
    assert (plan.way, plan.serving, plan.target, plan.reuse) == ("backfill", 0, 1, False)
    assert "watermark_delay_us" in plan.describe()
    result = redeploy.run(reason="a wider watermark and every aggregation")
    assert result.swapped and (result.from_generation, result.generation) == (0, 1)
    assert serving.stopped_for is not None and "redeploy" in serving.stopped_for
    assert serving.query is not None and not serving.query.isActive
    assert leases.holder(spark, Placement(old), "live") is None  # released by the stopped phase and by the redeploy

    # Every read between steps is the old definition's complete result, until the swap; then the new one's.
    steps = [s for s, _ in reads]
    assert steps == ["planned", "backlog", "live caught up", "checked", "serving live stopped", "swapped"]
    for step, rows in reads[:-1]:
        assert _matches(rows, _expected_old(_upto(versions, 6))) or _matches(rows, _expected_old(_upto(versions, 5))), (
            step
        )
    assert_results_equal(reads[-1][1], _expected_new(_upto(versions, 6)))
    gens = generations.read(spark, Placement(old))
    assert gens.serving == 1 and gens.swap_under_way is None
    # The old results are not copied for a rollback inside the time without fresh results: still to keep.
    assert kept.pending(spark, Placement(old), gens) is not None

    # The new definition's live phase resumes on the consumer-facing table from its generation's progress log.
    append_version(spark, source, versions[7])
    live = LiveRunner.from_manifest(spark, new)
    assert live.placement.generation == 1 and live.placement.sink_path == new.sink.path
    # Its start then keeps what generation 0 served; a copy that fails does not fail the live phase: still pending.
    real_copy = kept.copy_sink

    def failing_copy(*args, **kwargs):
        raise RuntimeError("no space left on device")

    monkeypatch.setattr(kept, "copy_sink", failing_copy)
    live.start(available_now=True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(_upto(versions, 7)))
    assert live.kept is None and kept.pending(spark, Placement(old), generations.read(spark, Placement(old)))
    monkeypatch.setattr(kept, "copy_sink", real_copy)
    # The next start keeps it: generation 0's results up to the swap, as generation 0's own sink; its jobs in the
    # scheduler pool that yields the cores to the micro-batches of the query that already runs.
    pools: list[str | None] = []

    def copy_in_its_pool(*args, **kwargs):
        pools.append(spark.sparkContext.getLocalProperty(SCHEDULER_POOL))
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(kept, "copy_sink", copy_in_its_pool)
    live = LiveRunner.from_manifest(spark, new)
    live.start(available_now=True)
    assert pools == [BACKGROUND_POOL] and spark.sparkContext.getLocalProperty(SCHEDULER_POOL) is None
    assert live.kept is not None and live.kept.generation == 0
    assert kept.pending(spark, Placement(old), generations.read(spark, Placement(old))) is None
    assert_results_equal(sink_rows(spark, generations.own_sink(root, 0)), _expected_old(_upto(versions, 6)))
    # The old definition's pipeline now binds to generation 1, whose handoff it does not match.
    with pytest.raises(ManifestError, match="watermark_delay_us"):
        LiveRunner.from_manifest(spark, old)

    # Rollback: a redeploy of the old definition finds generation 0 kept, catches it up and swaps it back.
    append_version(spark, source, versions[8])
    back = Redeploy(spark, old)
    plan = back.plan()
    assert (plan.way, plan.serving, plan.target, plan.reuse) == ("backfill", 1, 0, True)
    result = back.run(reason="roll back")
    assert (result.from_generation, result.generation) == (1, 0)
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(versions))
    LiveRunner.from_manifest(spark, old).start(available_now=True)  # goes on from where it stopped serving
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(versions))
    # Generation 1 kept its results up to its stop, for a roll forward.
    assert_results_equal(sink_rows(spark, generations.own_sink(root, 1)), _expected_new(_upto(versions, 7)))


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=EVENT_VERSIONS,
    cut=st.integers(min_value=0, max_value=5),
    redeploy_at=st.integers(min_value=0, max_value=5),
    arrivals=st.lists(st.sampled_from(STEPS[:4]), max_size=3),
    log_behind=st.integers(min_value=0, max_value=2),
)
def test_after_the_swap_the_sink_equals_the_new_definitions_one_streaming_job(
    spark, tmp_path, raw, cut, redeploy_at, arrivals, log_behind
):
    """For random data, cut-off and redeploy point, with versions arriving between the redeploy's steps: every read
    of the sink between steps is the old definition's result over what its live phase applied, until the swap, and
    the new definition's over what its generation's live phase had applied, after it; once the new live phase runs,
    the sink equals one streaming job of the new definition over all versions, and the plain reference."""
    work = tmp_path / uuid.uuid4().hex
    root, source = str(work / "run"), str(work / "source")
    versions = materialize(raw)
    last = max(versions)
    cutoff = min(cut, last)
    served = max(cutoff, min(redeploy_at, last))
    write_source(spark, source, _upto(versions, cutoff))
    old, new = _old(source, root), _new(source, root)
    BacklogRunner(spark, old).run()
    for v in range(cutoff + 1, served + 1):
        append_version(spark, source, versions[v])
    LiveRunner.from_manifest(spark, old).start(available_now=True)

    head, caught = [served], [served]
    reads: list[tuple[str, dict]] = []

    def on_step(step: str, detail: dict) -> None:
        reads.append((step, sink_rows(spark, old.sink.path)))
        if step == "live caught up":
            caught[0] = head[0]  # what the new generation's live phase has applied on its own sink
        if step in arrivals and head[0] < last:
            head[0] += 1
            append_version(spark, source, versions[head[0]])

    result = Redeploy(spark, new, on_step=on_step).run()
    assert result.swapped
    for step, rows in reads:
        if step != "swapped":
            assert_results_equal(rows, _expected_old(_upto(versions, served)))
        else:  # the new generation's results as its last catch-up round left them
            assert_results_equal(rows, _expected_new(_upto(versions, caught[0])))
    for v in range(head[0] + 1, last + 1):
        append_version(spark, source, versions[v])
    if log_behind:  # the redeploy log loses its newest commits: refused, then repaired by the redeploy the error names
        remove_newest_commits(Placement(old).redeploy_log, log_behind)
        with pytest.raises((PhaseStateError, ManifestError)):
            LiveRunner.from_manifest(spark, new).start(available_now=True)
        with pytest.raises(PhaseStateError, match=r"Redeploy\(spark, pipeline\)\.run\(\)"):
            LiveRunner.from_manifest(spark, old).start(available_now=True)
        Redeploy(spark, new).run(reason="repair")
        assert_results_equal(sink_rows(spark, old.sink.path), _expected_new(_upto(versions, caught[0])))
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    expected = _expected_new(versions)
    assert_results_equal(sink_rows(spark, new.sink.path), expected)
    single = _new(source, str(work / "single"))
    LiveRunner.streaming_only(spark, single, max_files_per_trigger=1).start(available_now=True)
    assert_results_equal(sink_rows(spark, single.sink.path), expected)


def test_a_forward_only_change_is_recorded_and_the_live_phase_goes_on_from_its_state(spark, tmp_path):
    root, source = str(tmp_path / "run"), str(tmp_path / "source")
    versions = {i: _version(i) for i in range(1, 5)}
    write_source(spark, source, _upto(versions, 2))
    old = _old(source, root)
    BacklogRunner(spark, old).run()
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    changed = old.model_copy(update={"max_future": timedelta(days=3)})
    with pytest.raises(ManifestError, match="need no new backlog"):
        LiveRunner.from_manifest(spark, changed)
    result = Redeploy(spark, changed).run(reason="a looser future bound")
    assert (result.way, result.swapped) == ("forward", False)
    for v in (3, 4):
        append_version(spark, source, versions[v])
    LiveRunner.from_manifest(spark, changed).start(available_now=True)
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(versions))
    assert Redeploy(spark, changed).plan().way == "none"


def test_a_second_redeploy_is_refused_naming_the_one_that_runs(spark, tmp_path):
    root, source = str(tmp_path / "run"), str(tmp_path / "source")
    write_source(spark, source, {1: _version(1)})
    old, new = _old(source, root), _new(source, root)
    BacklogRunner(spark, old).run()
    first = Redeploy(spark, new)
    with leases.hold(spark, Placement(new), "redeploy", first.holder), pytest.raises(LeaseHeld, match=first.holder):
        Redeploy(spark, new).run()


def test_a_generation_whose_checks_fail_is_never_swapped_in(spark, tmp_path):
    versions = {i: _version(i) for i in range(1, 4)}
    root, source, old, new = _handed_off(spark, tmp_path, versions, 3)
    LiveRunner.from_manifest(spark, old).start(available_now=True)

    def refuse(spark, generation, handoff):
        return [f"{generation.engine_root}: refused by the test"]

    with pytest.raises(PhaseStateError, match="refused by the test"):
        Redeploy(spark, new, checks=[refuse]).run()
    assert generations.read(spark, Placement(old)).serving == 0
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(versions))
    # A rerun with passing checks continues the generation that is there: no second backlog.
    result = Redeploy(spark, new).run()
    assert result.generation == 1 and "backlog_s" not in result.timings
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(versions))


def test_a_swap_cut_short_refuses_live_starts_until_a_rerun_finishes_it(spark, tmp_path, monkeypatch):
    versions = {i: _version(i) for i in range(1, 4)}
    root, source, old, new = _handed_off(spark, tmp_path, versions, 3)
    LiveRunner.from_manifest(spark, old).start(available_now=True)

    from phases._internal.redeploy import swap

    real = swap.copy_sink

    def crash_on_swap(spark, source, target, *, swap=None, **kwargs):
        if swap is not None:
            raise RuntimeError("crash before the swap's commit")
        return real(spark, source, target, swap=swap, **kwargs)

    monkeypatch.setattr(swap, "copy_sink", crash_on_swap)
    with pytest.raises(RuntimeError, match="crash before"):
        Redeploy(spark, new).run()
    monkeypatch.setattr(swap, "copy_sink", real)
    # The old results still serve; no live phase of either definition starts until the swap is finished.
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(versions))
    for p in (old, new):
        with pytest.raises(PhaseStateError, match="swap .* is under way"):
            LiveRunner.from_manifest(spark, p)
    result = Redeploy(spark, new).run()
    assert (result.from_generation, result.generation, result.swapped) == (0, 1, True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(versions))
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(versions))


@pytest.mark.slow
def test_a_redeploy_killed_at_each_step_in_turn_leaves_the_old_definition_serving_and_a_last_rerun_finishes_it(
    spark, tmp_path
):
    """SIGKILL of the redeploy's process at each step in turn (tests.phases.redeploy.redeploy_child), every run the
    rerun of the one killed before it, and a version arriving after every kill; then a last rerun. Until the swap's
    commit the old definition serves, its live phase running in this process; after the last rerun the new one serves,
    with the same result as a redeploy that never crashed. The new generation's backlog reaches its handoff once: the
    reruns after the kill right after it catch the generation up with increments instead of a second backlog."""
    from tests.phases.redeploy.redeploy_child import KILL_POINTS, run_until_killed

    versions = {i: _version(i) for i in range(1, 5 + len(KILL_POINTS))}
    root, source, old, new = _handed_off(spark, tmp_path, versions, 3)
    serving = LiveRunner.from_manifest(spark, old)
    serving.start()
    head = 4
    append_version(spark, source, versions[head])
    serving.process_available()
    stopped_at = None  # the last version the old live phase applied before the redeploy stopped it
    try:
        for kill_at in KILL_POINTS:
            run_until_killed(new, kill_at)
            ran_at, head = head, head + 1
            append_version(spark, source, versions[head])
            gens = generations.read(spark, Placement(old))
            if kill_at == "swapped":  # the swap's commit is made: the new results serve, no live phase starts yet
                assert gens.swap_under_way is not None
                # ... as the new generation's last catch-up round left them on its own sink (a run killed earlier
                # may have made that round): complete up to some version
                swapped = sink_rows(spark, old.sink.path)
                assert_results_equal(swapped, sink_rows(spark, generations.own_sink(root, 1)))
                assert any(_matches(swapped, _expected_new(_upto(versions, v))) for v in range(4, ran_at + 1))
                with pytest.raises(PhaseStateError, match="under way"):
                    LiveRunner.from_manifest(spark, old)
            elif kill_at in ("serving stopped", "swap"):  # stopped on request: the old results as of its stop
                assert not serving.query.isActive, kill_at
                stopped_at = stopped_at or ran_at
                assert gens.serving == 0, kill_at
                assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(_upto(versions, stopped_at)))
            else:  # the old live phase never noticed: it applies the version that arrived
                assert gens.serving == 0 and gens.swap_under_way is None, kill_at
                serving.process_available()
                assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(_upto(versions, head)))
        result = Redeploy(spark, new, take_over=True, stop_timeout_s=120).run()
        assert (result.from_generation, result.generation, result.swapped) == (0, 1, True)
        LiveRunner.from_manifest(spark, new, take_over=True).start(available_now=True)
        assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(versions))
        assert generations.read(spark, Placement(old)).serving == 1
        built = Placement(new).at(1, serving=False).manifests
        kinds = [r.kind for r in spark.read.format("delta").load(built).collect()]
        assert kinds.count("full") == 1 and "increment" in kinds, kinds
    finally:
        serving.stop()


def test_a_kafka_source_whose_retention_dropped_its_start_is_refused_before_anything_runs(spark, kafka, tmp_path):
    from confluent_kafka import TopicPartition

    from phases._internal.errors import SourceError
    from tests.helpers import produce
    from tests.phases.sources.test_kafka_source import kafka_pipeline

    topic = f"redeploy-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    root = str(tmp_path / "run")
    old = kafka_pipeline(kafka, topic, root)
    records = [(i % 2, (f"k{i % 3}", (100 + i) * SECOND, i)) for i in range(8)]
    produce(kafka.bootstrap_servers, topic, records)
    BacklogRunner(spark, old).run()
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    admin = kafka.admin()
    admin.delete_records([TopicPartition(topic, 1, 3)])[TopicPartition(topic, 1, 3)].result(30)  # as retention would

    new = old.model_copy(update={"watermark_delay": timedelta(seconds=NEW_DELAY_S)})
    before = sink_rows(spark, old.sink.path)
    with pytest.raises(SourceError, match=r"partition 1 from offset 0.*offsets 0\.\.2 were deleted by retention"):
        Redeploy(spark, new).run()
    assert generations.read(spark, Placement(old)).rows == ()  # nothing was recorded, nothing ran
    assert not (tmp_path / "run" / "generations").exists()
    assert sink_rows(spark, old.sink.path) == before


def test_a_changelog_sink_is_swapped_whole_and_read_current_gives_old_or_new_rows(spark, tmp_path):
    from phases._internal.definition import DeltaSink
    from tests.helpers import current_rows

    root, source = str(tmp_path / "run"), str(tmp_path / "source")
    versions = {i: _version(i) for i in range(1, 6)}
    write_source(spark, source, _upto(versions, 3))
    sink = DeltaSink(path=f"{root}/sink", mode="changelog", compact_every=timedelta(0))
    old, new = _old(source, root, sink=sink), _new(source, root, sink=sink)
    BacklogRunner(spark, old).run()
    append_version(spark, source, versions[4])
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    from phases import compact_changelog

    compact_changelog(spark, old)  # the current table holds the old definition's rows
    reads: list[tuple[str, dict]] = []
    Redeploy(spark, new, on_step=lambda step, _: reads.append((step, current_rows(spark, old)))).run()
    for step, rows in reads:
        want = _expected_new(_upto(versions, 4)) if step == "swapped" else _expected_old(_upto(versions, 4))
        assert_results_equal(rows, want)
    append_version(spark, source, versions[5])
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    assert_results_equal(current_rows(spark, new), _expected_new(versions))
    compact_changelog(spark, new)
    assert_results_equal(current_rows(spark, new), _expected_new(versions))
    assert_results_equal(sink_rows(spark, new.sink.current), _expected_new(versions))


def test_a_generation_retired_longer_than_the_retention_is_removed_and_a_rollback_then_rebuilds(spark, tmp_path):
    import time as clock

    from phases import maintain

    versions = {i: _version(i) for i in range(1, 4)}
    root, source, old, new = _handed_off(spark, tmp_path, versions, 3)
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    Redeploy(spark, new).run()
    now_us = clock.time_ns() // 1000
    assert generations.remove_retired(spark, Placement(old), now_us=now_us) == []  # retired just now: kept (7 days)
    assert "retired_generations" not in maintain(spark, new)
    assert (tmp_path / "run" / "state").exists()
    eight_days = 8 * 24 * 3600 * SECOND
    assert generations.remove_retired(spark, Placement(old), now_us=now_us + eight_days) == [0]
    for folder in ("state", "manifests", "checkpoints", "live", "generations/0"):
        assert not (tmp_path / "run" / folder).exists(), folder
    assert (tmp_path / "run" / "generations" / "1").exists()
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(versions))
    gens = generations.read(spark, Placement(old))
    assert 0 in gens.gone and gens.serving == 1
    plan = Redeploy(spark, old).plan()  # the old definition's generation is gone: a rollback is a new backfill
    assert (plan.way, plan.target, plan.reuse, plan.rollback) == ("backfill", 2, False, False)


def test_a_rollback_right_after_a_redeploy_that_followed_a_backlog_swaps_the_old_generation_back(spark, tmp_path):
    """The old generation's live phase never wrote after its handoff: the rollback's catch-up increment writes the old
    generation's own sink (its kept results), and its live start builds on that increment's write. It was refused as
    "neither the handoff's write nor the swap" for the way out the stale-runner error names."""
    versions = {i: _version(i) for i in range(1, 7)}
    root, source, old, new = _handed_off(spark, tmp_path, versions, 3)
    append_version(spark, source, versions[4])
    assert Redeploy(spark, new).run(reason="forward").swapped
    append_version(spark, source, versions[5])
    # No live phase of the new definition started, so nothing kept the old results yet: the rollback keeps them first.
    steps: list[str] = []
    result = Redeploy(spark, old, on_step=lambda step, _: steps.append(step)).run(reason="roll back")
    assert result.swapped and (result.from_generation, result.generation) == (1, 0)
    assert steps[:2] == ["kept", "planned"], steps
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(_upto(versions, 5)))
    # Generation 1's results, replaced by the rollback's swap: the maintenance keeps them before it vacuums.
    assert maintain(spark, old)["kept_for_rollback"]["generation"] == 1
    append_version(spark, source, versions[6])
    serving = LiveRunner.from_manifest(spark, old)
    serving.start()
    assert serving.kept is None  # nothing left to keep
    serving.process_available()
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(versions))

    # After the rollback, a forward-only change started without a redeploy names the redeploy that records it, and
    # not a rollback; the redeploy records it (no generation) and the serving live phase says why it stopped.
    forward = old.model_copy(update={"max_future": timedelta(days=3)})
    with pytest.raises(ManifestError, match="need no new backlog") as refused:
        LiveRunner.from_manifest(spark, forward)
    assert "roll back" not in str(refused.value) and "new generation" not in str(refused.value)
    gens_before = generations.read(spark, Placement(old)).numbers
    result = Redeploy(spark, forward).run(reason="a looser future bound")
    assert (result.way, result.swapped) == ("forward", False)
    assert generations.read(spark, Placement(old)).numbers == gens_before
    assert serving.stopped_for is not None and "from now on" in serving.stopped_for, serving.stopped_for
    assert "swapped" not in serving.stopped_for
    LiveRunner.from_manifest(spark, forward).start(available_now=True)
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(versions))
