"""Damage around a redeploy and a handoff, as a hostile but fair operator makes it: a redeploy log behind the sink
consumers read, a runner built before a swap and started after it, a sink missing or behind its handoff before the
first live micro-batch. Every start is refused with the way out, or exact; every way out an error names is run here
to the end, and every read of the sink is compared with the reference of the definition that serves."""

from __future__ import annotations

import shutil

import pytest
from delta.tables import DeltaTable

from phases import Redeploy
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.deployment import generations
from phases._internal.errors import LiveResumeError, ManifestError, PhasesError, PhaseStateError
from phases._internal.live.runner import LiveRunner
from phases._internal.placement import Placement
from tests.helpers import append_version, assert_results_equal, remove_newest_commits, sink_rows, write_source
from tests.phases.redeploy.test_redeploy import _expected_new, _expected_old, _handed_off, _new, _old, _upto, _version

VERSIONS = {i: _version(i) for i in range(1, 7)}


def _swapped(spark, tmp_path):
    """(root, source, old, new): the old definition handed off over versions 1..3 and live, then redeployed to the
    new one (generation 1 serves the sink), whose live phase applied version 4 on the sink."""
    root, source, old, new = _handed_off(spark, tmp_path, VERSIONS, 3)
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    Redeploy(spark, new).run(reason="the test's redeploy")
    append_version(spark, source, VERSIONS[4])
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(_upto(VERSIONS, 4)))
    return root, source, old, new


def _live_start(spark, pipeline) -> None:
    LiveRunner.from_manifest(spark, pipeline).start(available_now=True)


def _each_refused_naming_the_repair(
    spark, definitions, start, serving, expected: dict, errors=(PhaseStateError, LiveResumeError, ManifestError)
) -> None:
    """``start`` of each definition is refused naming the redeploy that repairs the log, and the sink consumers read
    keeps the serving definition's ``expected`` results."""
    for definition in definitions:
        with pytest.raises(errors) as refused:
            start(spark, definition)
        assert "Redeploy(spark, pipeline).run()" in str(refused.value), str(refused.value)
        assert_results_equal(sink_rows(spark, serving.sink.path), expected)


@pytest.mark.parametrize("behind", [1, 2])
def test_a_redeploy_log_behind_the_sink_is_repaired_by_the_redeploy_its_refusal_names(spark, tmp_path, behind):
    """The newest commits of the redeploy log removed after the new live phase wrote (one: the ``swapped`` row; two:
    the ``swapping`` row too). Every start that would write the sink is refused; the redeploy the refusal names
    repairs the log from the sink's history and copies nothing: the sink keeps the new definition's results, the
    old generation keeps its own for a rollback, and the new live phase and a rollback go on exactly."""
    root, source, old, new = _swapped(spark, tmp_path)
    kept_old = sink_rows(spark, generations.own_sink(root, 0))
    assert_results_equal(kept_old, _expected_old(_upto(VERSIONS, 3)))
    remove_newest_commits(Placement(old).redeploy_log, behind)

    append_version(spark, source, VERSIONS[5])
    _each_refused_naming_the_repair(spark, (old, new), _live_start, new, _expected_new(_upto(VERSIONS, 4)))

    result = Redeploy(spark, new).run(reason="run again, as the refusal said")
    assert result.generation == 1
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(_upto(VERSIONS, 4)))
    assert_results_equal(sink_rows(spark, generations.own_sink(root, 0)), kept_old)
    gens = generations.read(spark, Placement(old))
    assert (gens.serving, gens.swap_under_way) == (1, None)

    LiveRunner.from_manifest(spark, new).start(available_now=True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(_upto(VERSIONS, 5)))
    append_version(spark, source, VERSIONS[6])
    Redeploy(spark, old).run(reason="roll back")
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(VERSIONS))


def test_runners_built_before_a_swap_and_started_after_it_are_refused_naming_the_serving_generation(spark, tmp_path):
    """A live runner and a backlog runner of the old definition, built while it served and started after the swap,
    would write the old definition's rows into the sink the new one serves (223 of 500 rows took old values). Each
    start checks which generation serves at start time."""
    root, source, old, new = _handed_off(spark, tmp_path, VERSIONS, 3)
    live = LiveRunner.from_manifest(spark, old)
    backlog = BacklogRunner(spark, old)
    Redeploy(spark, new).run()
    append_version(spark, source, VERSIONS[4])
    with pytest.raises(PhaseStateError, match=r"generation 1 serves.*roll back") as refused:
        live.start(available_now=True)
    assert "Redeploy(spark, pipeline).run()" in str(refused.value)
    with pytest.raises(PhaseStateError, match="generation 1 serves"):
        backlog.run(reset=True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(_upto(VERSIONS, 3)))
    # The old definition, bound afresh, names the redeploy and the rollback too.
    with pytest.raises(ManifestError, match=r"generation 1 serves.*roll back"):
        LiveRunner.from_manifest(spark, old)
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(_upto(VERSIONS, 4)))


def _restore_sink_to_the_first_backlog(spark, pipeline, first_version: int) -> None:
    DeltaTable.forPath(spark, pipeline.sink.path).restoreToVersion(first_version)


@pytest.mark.parametrize("damage", ["removed", "restored to an earlier backlog", "newest commit removed"])
def test_a_sink_missing_or_behind_its_handoff_before_the_first_live_micro_batch_is_refused(spark, tmp_path, damage):
    """The sink removed after the backlog, or rolled back to an earlier backlog's commit, then data and a live start:
    the start used to recreate an empty sink and write only the keys it touched. It is refused with the way out,
    which is run to the end."""
    root, source = str(tmp_path / "run"), str(tmp_path / "source")
    write_source(spark, source, _upto(VERSIONS, 2))
    old = _old(source, root)
    first = BacklogRunner(spark, old).run()
    append_version(spark, source, VERSIONS[3])
    BacklogRunner(spark, old).run(reset=True)  # a second backlog over versions 1..3
    if damage == "removed":
        shutil.rmtree(old.sink.path)
    elif damage == "restored to an earlier backlog":
        _restore_sink_to_the_first_backlog(spark, old, first.sink_version)
    else:
        remove_newest_commits(old.sink.path, 1)
    append_version(spark, source, VERSIONS[4])
    with pytest.raises(LiveResumeError, match="handoff") as refused:
        LiveRunner.from_manifest(spark, old).start(available_now=True)
    said = str(refused.value)
    assert old.sink.path in said and "reset=True" in said
    BacklogRunner(spark, old).run(reset=True)  # the way out
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(_upto(VERSIONS, 4)))


def test_a_gapped_redeploy_log_is_an_engine_error_naming_it_and_the_way_out(spark, tmp_path):
    root, source, old, new = _handed_off(spark, tmp_path, VERSIONS, 3)
    Redeploy(spark, new).run()
    log = Placement(old).redeploy_log
    import os

    middle = sorted(n for n in os.listdir(f"{log}/_delta_log") if n.endswith(".json"))[1]
    os.remove(f"{log}/_delta_log/{middle}")
    with pytest.raises(PhasesError, match=r"redeploy log .*redeploys.* restore") as refused:
        Redeploy(spark, old).run()
    assert "Py4J" not in str(refused.value)


def test_a_stale_checksum_in_the_compacted_table_does_not_stop_the_compaction(spark, tmp_path):
    """The compacted table's newest commit removed by hand with its hidden checksum file left behind: the next
    compaction wrote that version again and Hadoop refused it (a raw ChecksumException). The engine removes such
    files before it writes any of its tables, naming each."""
    from datetime import timedelta

    from phases import compact_changelog
    from phases._internal.definition import DeltaSink
    from tests.helpers import current_rows

    root, source = str(tmp_path / "run"), str(tmp_path / "source")
    write_source(spark, source, _upto(VERSIONS, 2))
    sink = DeltaSink(path=f"{root}/sink", mode="changelog", compact_every=timedelta(0))
    p = _old(source, root, sink=sink)
    BacklogRunner(spark, p).run()
    append_version(spark, source, VERSIONS[3])
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    compact_changelog(spark, p)
    log = f"{p.sink.current}/_delta_log"
    import os

    newest = max(n for n in os.listdir(log) if n.endswith(".json") and n[:1].isdigit())
    os.remove(f"{log}/{newest}")  # its .crc stays
    append_version(spark, source, VERSIONS[4])
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    compact_changelog(spark, p)
    assert_results_equal(current_rows(spark, p), _expected_old(_upto(VERSIONS, 4)))
    assert_results_equal(sink_rows(spark, p.sink.current), _expected_old(_upto(VERSIONS, 4)))


def test_a_stop_a_redeploy_requests_is_recorded_before_the_query_stops(spark, tmp_path, monkeypatch):
    """The live phase stops its query on a redeploy's request, then said why: a caller polling it in between (the
    Dagster live step does) saw a query 'stopped without an error (stopped from outside)', a failure. The moment
    between is held open here: the reason must be there before the query stops."""
    import time

    from phases._internal.coordination import leases

    root, source, old, new = _handed_off(spark, tmp_path, VERSIONS, 3)
    runner = LiveRunner.from_manifest(spark, old)
    real = LiveRunner._stop_between_batches

    def stop_then_linger(self, wait_s: float = 60.0) -> None:
        real(self, wait_s)
        time.sleep(3)  # the query is stopped; the watcher has not gone on yet

    monkeypatch.setattr(LiveRunner, "_stop_between_batches", stop_then_linger)
    runner.start()
    try:
        leases.request_stop(spark, Placement(old), "live", "the test", "a redeploy's swap")
        deadline = time.monotonic() + 60
        while runner.query.isActive and time.monotonic() < deadline:
            runner.raise_if_failed()
            time.sleep(0.05)
        for _ in range(20):  # through the lingering moment
            runner.raise_if_failed()
            time.sleep(0.1)
        assert runner.stopped_for is not None and "a redeploy's swap" in runner.stopped_for
    finally:
        runner.stop()
        leases.clear_stop_request(spark, Placement(old), "live")


def _log_two_behind_right_after_the_swap(spark, tmp_path):
    """(root, source, old, new): the old definition handed off and live, redeployed to the new one, and the redeploy
    log's two newest commits (the ``swapping`` and ``swapped`` rows) removed before the new live phase wrote: the
    log says generation 0 serves, the sink's newest commit is the swap's."""
    root, source, old, new = _handed_off(spark, tmp_path, VERSIONS, 3)
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    Redeploy(spark, new).run(reason="the test's redeploy")
    remove_newest_commits(Placement(old).redeploy_log, 2)
    assert generations.read(spark, Placement(old)).serving == 0
    return root, source, old, new


def test_a_backlog_reset_with_the_redeploy_log_two_commits_behind_is_refused_and_the_redeploy_repairs_it(
    spark, tmp_path
):
    """A reset rewrites the sink consumers read: with the log behind the sink, the old definition's reset would
    overwrite the new one's results. Each reset is refused naming the swap the log does not record; the redeploy
    the refusal names repairs the log, then the new definition's reset and live phase are exact."""
    root, source, old, new = _log_two_behind_right_after_the_swap(spark, tmp_path)
    append_version(spark, source, VERSIONS[4])
    reset = lambda spark_, p: BacklogRunner(spark_, p).run(reset=True)  # noqa: E731
    _each_refused_naming_the_repair(
        spark, (old, new), reset, new, _expected_new(_upto(VERSIONS, 3)), errors=(PhaseStateError, ManifestError)
    )
    Redeploy(spark, new).run(reason="run again, as the refusal said")
    assert generations.read(spark, Placement(new)).serving == 1
    BacklogRunner(spark, new).run(reset=True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(_upto(VERSIONS, 4)))
    append_version(spark, source, VERSIONS[5])
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(_upto(VERSIONS, 5)))


def test_a_live_start_right_after_the_swap_with_the_log_two_commits_behind_is_refused_and_repaired(spark, tmp_path):
    """The log lost its ``swapping`` and ``swapped`` rows before the new live phase wrote: the old definition's start
    would write the old results over the swap. Both starts are refused with the redeploy that repairs the log;
    after it the new live phase goes on exactly, and a rollback too."""
    root, source, old, new = _log_two_behind_right_after_the_swap(spark, tmp_path)
    append_version(spark, source, VERSIONS[4])
    _each_refused_naming_the_repair(spark, (old, new), _live_start, new, _expected_new(_upto(VERSIONS, 3)))
    Redeploy(spark, new).run(reason="run again, as the refusal said")
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    assert_results_equal(sink_rows(spark, new.sink.path), _expected_new(_upto(VERSIONS, 4)))
    append_version(spark, source, VERSIONS[5])
    Redeploy(spark, old).run(reason="roll back")
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    assert_results_equal(sink_rows(spark, old.sink.path), _expected_old(_upto(VERSIONS, 5)))


def test_a_changelog_compaction_with_the_old_definition_after_a_swap_compacts_what_serves(spark, tmp_path):
    """compact_changelog given the definition that no longer serves: the current table consumers read is the
    serving definition's latest row per key, never the old one's."""
    from datetime import timedelta

    from phases import compact_changelog
    from phases._internal.definition import DeltaSink
    from tests.helpers import current_rows

    root, source = str(tmp_path / "run"), str(tmp_path / "source")
    write_source(spark, source, _upto(VERSIONS, 3))
    sink = DeltaSink(path=f"{root}/sink", mode="changelog", compact_every=timedelta(0))
    old, new = _old(source, root, sink=sink), _new(source, root, sink=sink)
    BacklogRunner(spark, old).run()
    LiveRunner.from_manifest(spark, old).start(available_now=True)
    compact_changelog(spark, old)
    assert_results_equal(current_rows(spark, old), _expected_old(_upto(VERSIONS, 3)))
    Redeploy(spark, new).run()
    append_version(spark, source, VERSIONS[4])
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    compact_changelog(spark, old)
    assert_results_equal(current_rows(spark, new), _expected_new(_upto(VERSIONS, 4)))
    compact_changelog(spark, new)
    assert_results_equal(current_rows(spark, new), _expected_new(_upto(VERSIONS, 4)))


def test_a_changelog_read_or_compaction_with_other_key_columns_than_the_serving_definitions_is_refused(spark, tmp_path):
    """After a redeploy that changed the key columns, compact_changelog and read_current given the old definition
    folded the table consumers read by the old keys: one row per old key where the serving definition has one per
    new key, silently. Both are refused naming the two key lists; with the serving definition they go on."""
    from datetime import timedelta

    from phases import compact_changelog, read_current
    from phases._internal.definition import DeltaSink

    root, source = str(tmp_path / "run"), str(tmp_path / "source")
    write_source(spark, source, _upto(VERSIONS, 3))
    sink = DeltaSink(path=f"{root}/sink", mode="changelog", compact_every=timedelta(0))
    old = _old(source, root, sink=sink)
    new = _old(source, root, sink=sink, key_columns=["key", "value"])
    BacklogRunner(spark, old).run()
    Redeploy(spark, new).run()
    append_version(spark, source, VERSIONS[4])
    LiveRunner.from_manifest(spark, new).start(available_now=True)
    for call in (lambda: compact_changelog(spark, old), lambda: read_current(spark, old).collect()):
        with pytest.raises(PhaseStateError, match=r"key columns \['key', 'value'\].*key columns \['key'\]"):
            call()
    compact_changelog(spark, new)
    served = [(r["key"], r["value"]) for r in read_current(spark, new).collect()]
    changes = spark.read.format("delta").load(new.sink.path).select("key", "value").distinct().collect()
    assert sorted(served) == sorted((r["key"], r["value"]) for r in changes)  # one row per (key, value)
