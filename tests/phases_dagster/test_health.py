"""The health sensor's relaunch rule (a pure function): relaunch a failed live run after a doubling backoff, at most
``max_relaunches`` times; never one stopped on purpose; stop at once when an engine error repeats."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from phases_dagster.health import LiveRunRecord, decide_relaunch
from phases_dagster.settings import LiveHealth

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
POLICY = LiveHealth(backoff_seconds=30, max_backoff_seconds=100, max_relaunches=3)


def failed(run_id: str, ago_s: float, error: str = "RunWorkerLost: exit code -9") -> LiveRunRecord:
    return LiveRunRecord(run_id, "FAILURE", NOW - timedelta(seconds=ago_s), error)


def test_a_running_or_stopped_live_run_is_left_alone():
    assert decide_relaunch([], POLICY, NOW).action == "none"
    running = LiveRunRecord("r2", "STARTED", None, None)
    assert decide_relaunch([running, failed("r1", 5)], POLICY, NOW).action == "none"
    # A second start refused by the lease of the live run that still runs: that run is fine, nothing to relaunch.
    second = failed("r3", 500, "LeaseHeld: the live lease is held by live run m (alive)")
    decision = decide_relaunch([second, running], POLICY, NOW)
    assert decision.action == "none" and "r2 is started" in decision.reason
    stopped = decide_relaunch([LiveRunRecord("r1", "CANCELED", NOW, None)], POLICY, NOW)
    assert stopped.action == "none" and "stopped" in stopped.reason
    assert decide_relaunch([LiveRunRecord("r1", "SUCCESS", NOW, None)], POLICY, NOW).action == "none"


def test_a_failed_run_is_relaunched_after_a_doubling_backoff():
    assert decide_relaunch([failed("r1", 10)], POLICY, NOW).action == "wait"
    first = decide_relaunch([failed("r1", 31)], POLICY, NOW)
    assert (first.action, first.attempt) == ("relaunch", 1) and "exit code -9" in first.reason
    # The second consecutive failure waits 60 s, the third 100 s (the cap), not 120 s.
    assert decide_relaunch([failed("r2", 59), failed("r1", 200)], POLICY, NOW).action == "wait"
    assert decide_relaunch([failed("r2", 61), failed("r1", 200)], POLICY, NOW).attempt == 2
    third = [failed("r3", 101), failed("r2", 200), failed("r1", 300)]
    assert decide_relaunch(third, POLICY, NOW).action == "relaunch"


def test_relaunching_stops_at_the_cap_and_says_why():
    runs = [failed(f"r{i}", 1000 + i) for i in range(4)]
    decision = decide_relaunch(runs, POLICY, NOW)
    assert decision.action == "give_up" and "max_relaunches=3" in decision.reason
    # A success in between resets the count.
    runs = [failed("r5", 1000), LiveRunRecord("r4", "CANCELED", NOW, None), *runs]
    assert decide_relaunch(runs, POLICY, NOW).action == "relaunch"


def test_an_engine_error_that_repeats_is_not_relaunched_again():
    held = "LeaseHeld: pipeline 'x' live lease is held by live run m (pid 7, alive)"
    once = decide_relaunch([failed("r1", 100, held)], POLICY, NOW)
    assert once.action == "relaunch"
    twice = decide_relaunch([failed("r2", 100, held), failed("r1", 200, held)], POLICY, NOW)
    assert twice.action == "give_up" and "same error" in twice.reason and "LeaseHeld" in twice.reason
    # A lost worker twice is not an engine error, nor is the live query's own failure (a broker gone): both are
    # retried up to the cap.
    assert decide_relaunch([failed("r2", 100), failed("r1", 200)], POLICY, NOW).action == "relaunch"
    gone = "LiveQueryStopped: the live query of 'x' stopped: broker not available"
    assert decide_relaunch([failed("r2", 100, gone), failed("r1", 200, gone)], POLICY, NOW).action == "relaunch"


def test_relaunching_can_be_turned_off():
    off = LiveHealth(relaunch=False)
    assert decide_relaunch([failed("r1", 1000)], off, NOW).action == "give_up"


def test_the_freshness_check_is_not_green_while_the_live_phase_is_down_even_with_nothing_waiting(tmp_path):
    """It used to pass with the live phase stopped when no new data had come: a pipeline meant to be live that is
    not must show it, as a warning or a failure (``health.when_live_down``), and data waiting fails it as before."""
    import dagster as dg
    import pyarrow as pa
    from deltalake import write_deltalake

    from phases import Placement
    from phases_dagster.handoff_events import Handoff
    from phases_dagster.health import sink_freshness
    from phases_dagster.settings import WhenLiveDown
    from tests.conftest import make_pipeline

    source = str(tmp_path / "source")
    write_deltalake(source, pa.table({"key": ["a"], "value": [1]}))
    p = Placement(make_pipeline(source, str(tmp_path / "run")))
    handoff = Handoff(manifest_id="m1", fingerprint="f", source_version=0, final_watermark_us=None, run_id="r1")
    lag = timedelta(minutes=10)

    running = sink_freshness(p, handoff, lag, "running", NOW)
    assert running.passed, running
    for state in ("stopped", "failed"):
        down = sink_freshness(p, handoff, lag, state, NOW)
        assert not down.passed and down.severity == dg.AssetCheckSeverity.WARN, down
        assert f"the live phase is {state}" in down.description
        failing = sink_freshness(p, handoff, lag, state, NOW, WhenLiveDown.FAIL)
        assert not failing.passed and failing.severity == dg.AssetCheckSeverity.ERROR
        assert sink_freshness(p, handoff, lag, state, NOW, WhenLiveDown.PASS).passed
    # Before the switch the backlog owns the sink: nothing to flag.
    assert sink_freshness(p, handoff, lag, "not started", NOW).passed
    # Data waiting longer than max_lag fails the check whatever the setting (ERROR).
    write_deltalake(source, pa.table({"key": ["b"], "value": [2]}), mode="append")
    stale = sink_freshness(p, handoff, timedelta(0), "stopped", datetime.now(UTC) + timedelta(seconds=5))
    assert not stale.passed and stale.severity == dg.AssetCheckSeverity.ERROR


def test_the_freshness_words_count_one_as_one():
    """The check said "1 versions wait"."""
    from phases._internal.sources.lag import Unapplied

    one, three = Unapplied("source", 1, "versions", None), Unapplied("topic t", 3, "records", None)
    assert (one.amount, one.verb) == ("1 version", "waits")
    assert (three.amount, three.verb) == ("3 records", "wait")


def test_live_phase_running_is_evaluated_again_when_its_words_change_and_not_otherwise():
    """The check kept "is queued" for a whole run, and a relaunch's countdown never moved: the sensor reported it only
    when the state or the run changed. Any other description is reported; the same one is not repeated."""
    import dagster as dg

    from phases_dagster.health import Verdict, _due, check_evaluation

    asset, key = dg.AssetKey("x_live"), dg.AssetCheckKey(dg.AssetKey("x_live"), "live_phase_running")
    queued = Verdict(True, "running: run r1 is queued", {"live_state": "running", "run_id": "r1"})
    started = Verdict(True, "running: run r1 started at 12:00", {"live_state": "running", "run_id": "r1"})
    with dg.instance_for_test() as instance:
        assert _due(instance, key, queued, NOW, words=True)  # never evaluated
        instance.report_runless_asset_event(check_evaluation(asset, "live_phase_running", queued))
        assert not _due(instance, key, queued, NOW, words=True)
        assert _due(instance, key, started, NOW, words=True)
        assert not _due(instance, key, started, NOW)  # without words: same state, same run
