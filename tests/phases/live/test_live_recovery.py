"""The live phase after an operator lost part of its records: a removed checkpoint folder, a removed or damaged
progress log, both. A restart resumes exactly (the result equals one streaming job over all the data) or is
refused with an engine error that names what is missing and the way out; never a silent difference."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import DeltaSink
from phases._internal.errors import LiveResumeError, StateStoreError
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import append_version, assert_results_equal, create_source, current_rows, sink_rows

S = 1_000_000
DELAY_S = 15
BACKLOG = {1: [("a", 100 * S, 1), ("b", 90 * S, 2)], 2: [("a", 110 * S, 3)]}


def _live_version(v: int) -> list:
    """Version ``v``'s rows: a new key, an old one, and one late record."""
    return [(f"k{v}", (100 + 10 * v) * S, v), ("a", (105 + 10 * v) * S, 10 * v), ("b", 60 * S, -v)]


def _started(spark, root: str, sink_mode: str = "upsert"):
    source = f"{root}/source"
    create_source(spark, source)
    for v in sorted(BACKLOG):
        append_version(spark, source, BACKLOG[v])
    sink = DeltaSink(path=f"{root}/run/sink", mode=sink_mode)
    p = make_pipeline(source, f"{root}/run", delay_s=DELAY_S, sink=sink)
    handoff = BacklogRunner(spark, p).run()
    return p, handoff.manifest_id


def _live(spark, p) -> None:
    LiveRunner.from_manifest(spark, p).start(available_now=True)


def _checkpoint(p, manifest_id: str) -> str:
    return f"{p.locations.checkpoints}/{manifest_id}"


def _progress_log(p, manifest_id: str) -> str:
    return f"{p.locations.live_run(manifest_id)}/progress_log"


def test_a_removed_checkpoint_resumes_from_the_progress_log_and_loses_nothing(spark, tmp_path):
    """The issue's steps: live over a version, the checkpoint folder removed, one more version, restart. The
    restart used to read from the handoff again under the old micro-batch numbers, and Delta skipped its writes as
    already applied: the new version never reached the sink."""
    p, mid = _started(spark, str(tmp_path))
    versions = dict(BACKLOG)
    versions[3] = _live_version(3)
    append_version(spark, p.source.path, versions[3])
    _live(spark, p)
    shutil.rmtree(_checkpoint(p, mid))
    versions[4] = _live_version(4)
    append_version(spark, p.source.path, versions[4])
    _live(spark, p)
    expected, _ = reference.run(versions, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert os.path.isdir(f"{_checkpoint(p, mid)}/increment-from-1/commits"), "the new query has a checkpoint of its own"


def test_a_damaged_newest_progress_record_is_rebuilt_by_replaying_its_micro_batch(spark, tmp_path):
    """A truncated newest record used to stop every restart with a raw JSONDecodeError inside Spark's error. Its
    micro-batch's offsets are still in the checkpoint: the record is set aside and the micro-batch replayed (its
    writes are skipped as applied), which writes the record again."""
    p, mid = _started(spark, str(tmp_path))
    versions = dict(BACKLOG)
    versions[3] = _live_version(3)
    append_version(spark, p.source.path, versions[3])
    _live(spark, p)
    log = _progress_log(p, mid)
    newest = max(int(n.split(".")[0]) for n in os.listdir(log) if n.endswith(".json"))
    with open(f"{log}/{newest}.json", "r+") as f:
        f.truncate(17)
    versions[4] = _live_version(4)
    append_version(spark, p.source.path, versions[4])
    _live(spark, p)
    expected, _ = reference.run(versions, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    assert any(n.startswith(f"{newest}.json.damaged") for n in os.listdir(log)), "the damaged record is kept aside"


def test_a_removed_progress_log_after_live_writes_is_refused_with_the_way_out(spark, tmp_path):
    p, mid = _started(spark, str(tmp_path))
    for v in (3, 4):  # two micro-batches: the checkpoint is then ahead of anything a replay could rebuild
        append_version(spark, p.source.path, _live_version(v))
        _live(spark, p)
    shutil.rmtree(_progress_log(p, mid))
    append_version(spark, p.source.path, _live_version(5))
    with pytest.raises(LiveResumeError) as err:
        _live(spark, p)
    msg = str(err.value)
    assert "progress log" in msg and _progress_log(p, mid) in msg
    assert "reset=True" in msg and "restore" in msg


def test_a_progress_log_removed_after_the_first_micro_batch_is_rebuilt_by_replaying_it(spark, tmp_path):
    """The keyed state is in the state store and loaded by the version a record names: with the log gone after
    one micro-batch, the switch's record (rebuilt from the handoff) names the store's version 1, and the
    checkpoint still has the micro-batch's offsets, so the restart replays it from there (the sink write it
    made is skipped) and goes on: nothing lost, nothing counted twice."""
    p, mid = _started(spark, str(tmp_path))
    append_version(spark, p.source.path, _live_version(3))
    _live(spark, p)
    shutil.rmtree(_progress_log(p, mid))
    append_version(spark, p.source.path, _live_version(4))
    _live(spark, p)
    expected, _ = reference.run({**BACKLOG, 3: _live_version(3), 4: _live_version(4)}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)


def test_a_removed_state_store_is_refused_with_the_version_it_needs_and_the_way_out(spark, tmp_path):
    p, mid = _started(spark, str(tmp_path))
    append_version(spark, p.source.path, _live_version(3))
    _live(spark, p)
    shutil.rmtree(f"{p.locations.live_run(mid)}/state-store")
    append_version(spark, p.source.path, _live_version(4))
    with pytest.raises(StateStoreError) as err:
        _live(spark, p)
    assert "could not go from version 2 to 3" in str(err.value) and "reset=True" in str(err.value)


LOSSES = st.sampled_from(["checkpoint", "progress log", "both", "newest record", "nothing"])


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.integers(min_value=0, max_value=2),
    loss=LOSSES,
    after=st.integers(min_value=1, max_value=2),
    second_loss=LOSSES,
)
def test_any_lost_record_then_appends_and_restarts_equals_the_reference_or_is_refused(
    spark, tmp_path, before, loss, after, second_loss
):
    """Live runs over ``before`` versions, a loss, ``after`` more versions and restarts, a second loss, one more
    version and a restart: the sink equals the reference over every version, or a restart is refused with
    :class:`LiveResumeError`."""
    root = str(tmp_path / uuid.uuid4().hex)
    p, mid = _started(spark, root)
    versions = dict(BACKLOG)
    v = max(versions)

    def append_and_run() -> None:
        nonlocal v
        v += 1
        versions[v] = _live_version(v)
        append_version(spark, p.source.path, versions[v])
        _live(spark, p)

    def lose(what: str) -> None:
        log = _progress_log(p, mid)
        if what in ("checkpoint", "both") and os.path.exists(_checkpoint(p, mid)):
            shutil.rmtree(_checkpoint(p, mid))
        if what in ("progress log", "both") and os.path.exists(log):
            shutil.rmtree(log)
        if what == "newest record" and os.path.exists(log):
            ids = [int(n[: -len(".json")]) for n in os.listdir(log) if n.endswith(".json")]
            if ids:
                with open(f"{log}/{max(ids)}.json", "w") as f:
                    f.write('{"batch_id": ')

    _live(spark, p)  # the switch
    try:
        for _ in range(before):
            append_and_run()
        lose(loss)
        for _ in range(after):
            append_and_run()
        lose(second_loss)
        append_and_run()
    except LiveResumeError as refused:
        assert "reset=True" in str(refused)
        return
    expected, _ = reference.run(versions, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)


def _operation(log: str, version: int) -> str | None:
    with open(f"{log}/{version:020d}.json") as f:
        for line in f:
            info = json.loads(line).get("commitInfo")
            if info is not None:
                return info.get("operation")
    return None


def _roll_back(path: str, writes: int) -> None:
    """Removes the table's newest ``writes`` writes (commits that changed rows) and every commit after them, as
    restoring only that table from an older backup of its files would: each commit's JSON, its checksum files, and
    any checkpoint past the new head. (A compaction's commit alone changes no row: removing it loses nothing.)"""
    log = f"{path}/_delta_log"
    versions = sorted(int(n.split(".")[0]) for n in os.listdir(log) if n.endswith(".json") and n[:1].isdigit())
    keep = versions[-1]
    for version in reversed(versions):
        if writes == 0:
            break
        keep = version - 1
        if _operation(log, version) not in ("OPTIMIZE", "SET TBLPROPERTIES", "VACUUM START", "VACUUM END"):
            writes -= 1
    for name in os.listdir(log):
        head = name.lstrip(".").split(".")[0]
        if head.isdigit() and int(head) > keep:
            os.remove(f"{log}/{name}")
    last = f"{log}/_last_checkpoint"
    if os.path.exists(last):
        with open(last) as f:
            newest_checkpoint = json.load(f)["version"]
        if newest_checkpoint > keep:
            for name in ("_last_checkpoint", "._last_checkpoint.crc"):
                if os.path.exists(f"{log}/{name}"):
                    os.remove(f"{log}/{name}")


@pytest.mark.parametrize("sink_mode", ["upsert", "changelog"])
def test_a_sink_restored_one_commit_behind_its_progress_log_is_refused_naming_it(spark, tmp_path, sink_mode):
    """The sink's newest write removed (with its checksum files and the compaction after it), as restoring only the
    sink from a slightly older backup would, then a restart: no error, and both sink modes stayed wrong for good
    (the later micro-batches only add to the sink). Every start now checks each table the live phase writes against
    the progress log."""
    p, mid = _started(spark, str(tmp_path), sink_mode)
    _live(spark, p)  # the switch
    append_version(spark, p.source.path, _live_version(3))
    _live(spark, p)
    _roll_back(p.sink.path, 1)
    append_version(spark, p.source.path, _live_version(4))
    what = "upsert" if sink_mode == "upsert" else "sink"
    with pytest.raises(LiveResumeError) as refused:
        _live(spark, p)
    said = str(refused.value)
    assert f"{p.sink.path} holds" in said and f"of its {what!r} writes, the progress log expects micro-batch" in said
    assert "restore each such table to its newest version" in said and "reset=True" in said


def test_a_quarantine_restored_behind_its_progress_log_is_refused_naming_it(spark, tmp_path):
    """The same for the quarantine: the live phase's late rows of a micro-batch gone from it with no error."""
    p, mid = _started(spark, str(tmp_path))
    _live(spark, p)
    append_version(spark, p.source.path, _live_version(3))  # holds a late record: the quarantine gets a write
    _live(spark, p)
    _roll_back(p.locations.quarantine, 1)
    with pytest.raises(LiveResumeError, match=f"{p.locations.quarantine} holds .* 'quarantine' writes"):
        _live(spark, p)


def test_a_sink_whose_log_was_removed_with_its_files_left_is_refused_and_the_way_out_works(spark, tmp_path):
    """The sink's whole _delta_log removed, its data files left (a partial restore): the start is refused as for a
    missing sink, and the way out it names, a new backlog, writes the sink beside those files (not deleted)."""
    p, mid = _started(spark, str(tmp_path))
    _live(spark, p)
    versions = {**BACKLOG, 3: _live_version(3)}
    append_version(spark, p.source.path, versions[3])
    shutil.rmtree(f"{p.sink.path}/_delta_log")
    with pytest.raises(LiveResumeError, match=f"its sink {p.sink.path} is missing") as refused:
        _live(spark, p)
    assert "reset=True" in str(refused.value)
    BacklogRunner(spark, p).run(reset=True)
    _live(spark, p)
    expected, _ = reference.run(versions, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)


TABLES = st.sampled_from([("sink",), ("quarantine",), ("sink", "quarantine")])


@pytest.mark.slow
@settings(max_examples=examples(3), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.integers(min_value=0, max_value=3),
    restored=TABLES,
    commits=st.integers(min_value=0, max_value=2),
    sink_mode=st.sampled_from(["upsert", "changelog"]),
)
@example(before=0, restored=("quarantine",), commits=1, sink_mode="upsert")  # a quarantine left with no commit
def test_any_table_restored_to_an_older_commit_equals_the_reference_or_is_refused(
    spark, tmp_path, before, restored, commits, sink_mode
):
    """Live runs over ``before`` versions (0: restore points before the first live micro-batch, where only the handoff
    says what the tables hold); then ``restored`` tables lose their newest ``commits`` writes (a restore from an older
    backup), one more version is appended and the live phase restarts: the sink equals the reference over every
    version, or the restart is refused with :class:`LiveResumeError`, never a silent difference."""
    root = str(tmp_path / uuid.uuid4().hex)
    p, mid = _started(spark, root, sink_mode)
    versions = dict(BACKLOG)
    _live(spark, p)  # the switch
    for v in range(3, 3 + before):
        versions[v] = _live_version(v)
        append_version(spark, p.source.path, versions[v])
        _live(spark, p)
    paths = {"sink": p.sink.path, "quarantine": p.locations.quarantine}
    for table in restored:
        _roll_back(paths[table], commits)
    v = 3 + before
    versions[v] = _live_version(v)
    append_version(spark, p.source.path, versions[v])
    try:
        _live(spark, p)
    except LiveResumeError as refused:
        assert commits > 0 and "reset=True" in str(refused), refused
        return
    expected, _ = reference.run(versions, DELAY_S * S)
    if sink_mode == "upsert":
        assert_results_equal(sink_rows(spark, p.sink.path), expected)
    else:
        assert_results_equal(current_rows(spark, p), expected)


def test_a_removed_commit_whose_checksum_file_stayed_behind_does_not_block_the_way_out(spark, tmp_path):
    """The sink's newest write removed but its hidden checksum file (``.<v>.json.crc``) left behind: the restart is
    refused as for any table behind its log, and the way out, ``run(reset=True)``, used to fail on Hadoop's stale
    checksum (``ChecksumException``) when Delta wrote that version again. The engine removes a checksum file whose
    file is gone, naming it in a warning."""
    p, mid = _started(spark, str(tmp_path))
    _live(spark, p)
    versions = {**BACKLOG, 3: _live_version(3)}
    append_version(spark, p.source.path, versions[3])
    _live(spark, p)
    log = f"{p.sink.path}/_delta_log"
    kept = {n: Path(f"{log}/{n}").read_bytes() for n in os.listdir(log) if n.startswith(".") and n.endswith(".crc")}
    _roll_back(p.sink.path, 1)
    for name, data in kept.items():  # the checksum files come back, as a careless restore of the JSON files leaves them
        with open(f"{log}/{name}", "wb") as f:
            f.write(data)
    with pytest.raises(LiveResumeError, match="expects micro-batch"):
        _live(spark, p)
    BacklogRunner(spark, p).run(reset=True)
    _live(spark, p)
    expected, _ = reference.run(versions, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
