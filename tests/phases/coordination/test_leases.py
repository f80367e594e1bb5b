"""One backlog and one live phase per pipeline at a time: a second start is refused with the holder's name
and the running one goes on; a dead holder's lease is taken over only explicitly, and only when dead."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

import pytest

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.coordination import leases
from phases._internal.live.runner import LiveRunner
from phases._internal.placement import Placement
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, sink_rows, write_source
from tests.phases.live.test_live import BACKLOG, DELAY_S, LIVE, S


@pytest.fixture
def pipeline(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, BACKLOG)
    return make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)


def test_a_second_live_start_is_refused_and_the_running_one_goes_on(spark, pipeline):
    BacklogRunner(spark, pipeline).run()
    first = LiveRunner.from_manifest(spark, pipeline)
    first.start()
    try:
        with pytest.raises(leases.LeaseHeld) as err:
            LiveRunner.from_manifest(spark, pipeline).start()
        msg = str(err.value)
        assert f"live phase is held by {first.holder} since" in msg
        assert f"pid {os.getpid()}" in msg and "take_over=True" in msg
        append_version(spark, pipeline.source.path, LIVE[3])
        first.process_available()
        first.raise_if_failed()
    finally:
        first.stop()
    expected, _ = reference.run({**BACKLOG, 3: LIVE[3]}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, pipeline.sink.path), expected)
    assert not os.path.exists(leases.lease_path(Placement(pipeline), "live")), "stop() did not release the lease"


def test_a_reset_is_refused_while_the_live_phase_runs_and_names_its_holder(spark, pipeline):
    """A reset used to be accepted under a running live phase: it wrote a new manifest and rewrote the sink."""
    BacklogRunner(spark, pipeline).run()
    live = LiveRunner.from_manifest(spark, pipeline)
    live.start()
    try:
        append_version(spark, pipeline.source.path, LIVE[3])
        with pytest.raises(leases.LeaseHeld) as err:
            BacklogRunner(spark, pipeline).run(reset=True)
        msg = str(err.value)
        assert "a reset is refused while its live phase runs" in msg and live.holder in msg
        live.process_available()
        live.raise_if_failed()
    finally:
        live.stop()
    expected, _ = reference.run({**BACKLOG, 3: LIVE[3]}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, pipeline.sink.path), expected)
    BacklogRunner(spark, pipeline).run(reset=True)  # once stopped, a reset goes through
    assert not os.path.exists(leases.lease_path(Placement(pipeline), "live"))


def test_a_second_backlog_is_refused_while_one_runs_and_the_first_finishes(spark, pipeline):
    first = BacklogRunner(spark, pipeline)
    done: dict = {}
    thread = threading.Thread(target=lambda: done.setdefault("handoff", first.run()))
    thread.start()
    path = leases.lease_path(Placement(pipeline), "backlog")
    deadline = time.time() + 60
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.05)
    try:
        with pytest.raises(leases.LeaseHeld, match=f"its backlog is held by {first.holder} since"):
            BacklogRunner(spark, pipeline).run()
    finally:
        thread.join()
    assert done["handoff"].source_version == len(BACKLOG)
    assert not os.path.exists(path)


def test_a_dead_holders_lease_is_taken_over_only_explicitly(spark, pipeline):
    BacklogRunner(spark, pipeline).run()
    gone = subprocess.Popen(["true"])
    gone.wait()
    path = leases.lease_path(Placement(pipeline), "live")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stale = {"pipeline": pipeline.name, "role": "live", "holder": "live run crashed", "host": socket.gethostname()}
    with open(path, "w") as f:
        json.dump({**stale, "pid": gone.pid, "since_us": 1}, f)
    with pytest.raises(leases.LeaseHeld, match="held by live run crashed since 1970") as err:
        LiveRunner.from_manifest(spark, pipeline).start(available_now=True)
    # Not "the running one goes on": the holder's process is gone, and taking over is safe.
    assert "its process is gone" in str(err.value) and "Taking it over is safe" in str(err.value)
    assert "goes on" not in str(err.value)
    LiveRunner.from_manifest(spark, pipeline, take_over=True).start(available_now=True)
    assert not os.path.exists(path)

    # A live holder is never taken over, even when asked.
    with open(path, "w") as f:
        json.dump({**stale, "holder": "live run elsewhere", "pid": os.getpid(), "since_us": 1}, f)
    with pytest.raises(leases.LeaseHeld, match="cannot take over .* still alive"):
        LiveRunner.from_manifest(spark, pipeline, take_over=True).start(available_now=True)


def test_a_lease_under_a_file_uri_root_is_the_folders_file_not_a_relative_file_folder(spark, tmp_path, monkeypatch):
    """``file:/x`` roots (the cluster tier's) once made ``os.open("file:/x/...")``: a folder named ``file:`` in
    the working directory, which another process's lease check would never see."""
    monkeypatch.chdir(tmp_path)
    p = make_pipeline(f"file:{tmp_path}/source", f"file:{tmp_path}/run")
    lease = leases.acquire(spark, Placement(p), "backlog", "test-holder")
    try:
        assert os.path.exists(f"{tmp_path}/run/leases/{p.name}.backlog.json")
        assert not os.path.exists(tmp_path / "file:")
        with pytest.raises(leases.LeaseHeld):
            other = p.model_copy(update={"locations": p.locations.model_copy(update={"root": f"{tmp_path}/run"})})
            leases.acquire(spark, Placement(other), "backlog", "other-holder")
    finally:
        leases.release(spark, lease)
    assert not os.path.exists(f"{tmp_path}/run/leases/{p.name}.backlog.json")
