"""Keyed process functions with state and event-time timers in two phases: for any cut-off, the backlog
(sorted, one key at a time, timers fired up to the final backlog watermark) plus the live phase (the same
pass per micro-batch, from the handed-over state and timers on Delta) emit exactly what one streaming job over
all versions emits, and what a plain-Python run of the documented rules emits."""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import date

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import ProcessOperator
from phases._internal.errors import DefinitionError, PhaseStateError, ProcessFunctionError
from phases._internal.lateness import VERSION, WATERMARK_US
from phases._internal.live.runner import LiveRunner
from phases._internal.operators.process_function import to_us
from phases._internal.operators.process_pass import KIND, OUT, ProcessLogic, pass_partition
from phases._internal.placement import Placement
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import (
    EVENT_VERSIONS,
    append_version,
    crash_on_state_write,
    materialize,
    quarantine_rows,
    ts,
    us_of,
    write_source,
)
from tests.phases.operators.process_functions import Sessions
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

SESSIONS = ProcessOperator(function="tests.phases.operators.process_functions:Sessions")
ARRIVALS = "tests.phases.operators.process_functions:Arrivals"


def _pipeline(source: str, root: str, operator: ProcessOperator = SESSIONS):
    return make_pipeline(source, root, delay_s=DELAY_S, operator=operator)


def _outputs(rows) -> list[tuple]:
    out = []
    for r in rows:
        d = r if isinstance(r, dict) else r.asDict()
        start, end = us_of(d["session_start"]), us_of(d["session_end"])
        out.append((d["key"], start, end, d["events"], d["total"], d["distinct_values"]))
    return sorted(out, key=repr)


def _sink(spark, path: str) -> list[tuple]:
    return _outputs(spark.read.format("delta").load(path).collect())


@pytest.mark.slow
@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=EVENT_VERSIONS,
    cut=st.integers(min_value=0, max_value=5),
    files=st.integers(min_value=1, max_value=3),
    per_trigger=st.integers(min_value=1, max_value=2),
)
def test_process_function_two_phase_equals_a_single_streaming_job_for_any_cutoff_and_split(
    spark, tmp_path, raw, cut, files, per_trigger
):
    """Versions written as ``files`` files and read ``per_trigger`` files a micro-batch: a version spans
    micro-batches, a micro-batch spans versions, and versions pile up before the second live start."""
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = materialize(raw)
    cutoff = min(cut, len(versions))
    backlog_versions = {v: rows for v, rows in versions.items() if v <= cutoff}
    write_source(spark, source, backlog_versions, files=files)

    two_phase = _pipeline(source, str(root / "two_phase"))
    handoff = BacklogRunner(spark, two_phase).run()
    # The backlog emits what the rules emit up to the final backlog watermark.
    assert _sink(spark, two_phase.sink.path) == _outputs(
        reference.run_process(backlog_versions, DELAY_S * SECOND, Sessions(), ts)
    )
    assert handoff.sink_rows == len(_sink(spark, two_phase.sink.path))
    LiveRunner.from_manifest(spark, two_phase, max_files_per_trigger=per_trigger).start(available_now=True)
    for v in sorted(versions):
        if v > cutoff:
            append_version(spark, source, versions[v], files)
    LiveRunner.from_manifest(spark, two_phase, max_files_per_trigger=per_trigger).start(available_now=True)

    single = _pipeline(source, str(root / "single"))
    LiveRunner.streaming_only(spark, single, max_files_per_trigger=per_trigger).start(available_now=True)

    expected = _outputs(reference.run_process(versions, DELAY_S * SECOND, Sessions(), ts))
    assert _sink(spark, two_phase.sink.path) == expected
    assert _sink(spark, single.sink.path) == expected
    assert quarantine_rows(spark, str(root / "two_phase")) == quarantine_rows(spark, str(root / "single"))


def _pass_input(logic: ProcessLogic, rows: list[tuple]) -> pa.RecordBatch:
    """The pass's input as Spark hands it to a worker: (key, version, ts µs, value) records in the sort's order, by
    key, version and event time; rows that share all three come in the order given."""
    keys, versions, tss, values = (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [], [])
    n = len(rows)
    return pa.RecordBatch.from_pydict(
        {
            "key": keys,
            "_order": [1] * n,
            VERSION: versions,
            WATERMARK_US: [v * 1_000_000 for v in versions],
            "ts": tss,
            "value": values,
            "_state": [None] * n,
            "_timers": pa.array([None] * n, pa.list_(pa.int64())),
            "_rows": pa.array([None] * n, pa.int64()),
            "_max_us": pa.array([None] * n, pa.int64()),
        }
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.integers(0, 2),
            st.integers(0, 3).map(lambda s: s * 1_000_000),
            st.one_of(st.none(), st.integers(0, 2)),
        ),
        max_size=30,
    ),
    shuffle=st.randoms(use_true_random=False),
)
def test_a_versions_rows_reach_process_by_event_time_then_value_in_whatever_order_ties_arrive(spark, records, shuffle):
    """The pass's input is sorted by key, version and event time only; rows that share an event time arrive in any
    order. The function sees each version's rows ordered by event time, then by the rows' values (the rule, as the
    reference applies it), whatever that order was. (The pass runs here in-process; the session only parses the
    function's output schema.)"""
    spark_order = sorted(records, key=lambda r: r[:3])
    tied = list(spark_order)
    shuffle.shuffle(tied)
    tied.sort(key=lambda r: r[:3])  # stable: equal (key, version, ts) rows keep the shuffled order
    pipeline = make_pipeline("unused", "unused", operator=ProcessOperator(function=ARRIVALS))
    schema = T.StructType([T.StructField(n, t) for n, t in [("key", T.StringType()), ("ts", T.TimestampType()),
                                                               ("value", T.LongType())]])  # fmt: skip
    logic = ProcessLogic(spark, pipeline, schema)

    def seen(rows):
        out = []
        for batch in pass_partition(logic, iter([_pass_input(logic, rows)]), None):
            out += [(r["key"], to_us(r["ts"]), r["value"], r["place"]) for r in batch.to_pylist() if r[KIND] == OUT]
        return out

    expected = []
    for (key, _), group in itertools.groupby(spark_order, key=lambda r: r[:2]):
        dicts = [{"key": k, "ts": t, "value": v} for k, _, t, v in group]
        ordered = sorted(dicts, key=lambda d: (d["ts"], json.dumps(d, sort_keys=True, default=str)))
        expected += [(key, d["ts"], d["value"], place) for place, d in enumerate(ordered)]
    assert seen(tied) == seen(spark_order) == expected


def test_backlog_output_is_grouped_by_key_and_state_holds_open_sessions(spark, tmp_path):
    source = str(tmp_path / "source")
    rows = [(k, i * SECOND, i) for i in range(0, 40, 3) for k in ("a", "b", "c", "d")]
    rows += [("late_key", 100 * SECOND, 1)]  # pushes the watermark: most sessions close at the backlog's end
    write_source(spark, source, {1: rows[:30], 2: rows[30:]})
    p = _pipeline(source, str(tmp_path / "p"))
    handoff = BacklogRunner(spark, p).run()
    runner = BacklogRunner(spark, p)
    from phases._internal.tagging import tag_version_range

    tagged = tag_version_range(spark, Placement(p), runner.source, (0, 2), None)
    logic = ProcessLogic(spark, p, tagged.prepared.schema)
    passed = logic.backlog_pass(tagged.prepared, handoff.final_watermark_us).collect()
    keys = [r["key"] for r in passed]
    runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(runs) == len(set(keys)), f"a key appears in more than one run: {runs}"
    assert sum(1 for r in passed if r[KIND] == OUT) == handoff.sink_rows
    state = {r["key"]: r for r in spark.read.format("delta").load(handoff.state_path).collect()}
    assert set(state) == {"a", "b", "c", "d", "late_key"}
    assert state["late_key"]["_state"] is not None and state["late_key"]["_timers"]  # still open
    assert state["a"]["_state"] is None and not state["a"]["_timers"]  # closed by the final watermark


def test_process_function_errors_name_the_rule(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, {1: [("a", SECOND, 1)]})
    for function, match in [
        ("tests.phases.operators.process_functions:NotAFunction", "not a subclass of"),
        ("tests.phases.operators.process_functions:Missing", "cannot import"),
    ]:
        with pytest.raises(DefinitionError, match=match):
            BacklogRunner(
                spark, _pipeline(source, str(tmp_path / uuid.uuid4().hex), ProcessOperator(function=function))
            ).run()
    bad = _pipeline(
        source, str(tmp_path / "bad"), ProcessOperator(function="tests.phases.operators.process_functions:BadOutput")
    )
    with pytest.raises(Exception, match="yielded columns \\['surprise'\\] that are not in its output_schema"):
        BacklogRunner(spark, bad).run()
    p = _pipeline(source, str(tmp_path / "p"))
    BacklogRunner(spark, p).run()
    # Its state does not merge: increments run through the live step; daily slices are refused, saying what to do.
    from phases._internal.backlog.slices import SliceRunner

    with pytest.raises(PhaseStateError, match="process operator .* catch it up with increments"):
        SliceRunner(spark, p, date(2026, 3, 1)).run_slice(date(2026, 3, 1))


def test_state_values_must_be_json_like():
    from phases._internal.operators.process_function import ProcessContext

    ctx = ProcessContext()
    with pytest.raises(ProcessFunctionError, match="not a valid state value"):
        ctx.value("v").set(object())
    with pytest.raises(ProcessFunctionError, match="valid key types"):
        ctx.map("m").put((1, 2), 1)
    ctx.value("when").set(ts(5))
    ctx.map("m").put(3, [ts(1), {"a": None}])
    ctx.register_timer(ts(2_500))
    again = ProcessContext()
    again.load_state(ctx.dump_state(), ctx.timer_ms)
    assert again.value("when").get() == ts(5)
    assert again.map("m").get(3) == [ts(1), {"a": None}]
    assert again.timers() == [ts(2_000)]  # millisecond resolution


def test_sessions_open_at_the_switch_close_in_the_live_phase_with_their_backlog_events(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, {1: [("a", 0, 1), ("a", SECOND, 2), ("b", 0, 5)]})
    p = _pipeline(source, str(tmp_path / "p"))
    handoff = BacklogRunner(spark, p).run()
    assert handoff.sink_rows == 0 and handoff.state_rows == 2  # both sessions still open at the switch
    live = LiveRunner.from_manifest(spark, p)
    live.start()
    try:
        append_version(spark, source, [("c", 30 * SECOND, 7)])  # W -> 15 s: a's (11 s) and b's (10 s) timers fire
        live.process_available()
        append_version(spark, source, [("a", 40 * SECOND, 3)])  # a new session of a
        live.process_available()
    finally:
        live.stop()
    got = _sink(spark, p.sink.path)
    assert got == [("a", 0, 11 * SECOND, 2, 3, 2), ("b", 0, 10 * SECOND, 1, 5, 1)]
    versions = {1: [("a", 0, 1), ("a", SECOND, 2), ("b", 0, 5)], 2: [("c", 30 * SECOND, 7)], 3: [("a", 40 * SECOND, 3)]}
    assert got == _outputs(reference.run_process(versions, DELAY_S * SECOND, Sessions(), ts))


def test_a_crash_between_the_output_append_and_the_state_write_is_replayed_exactly_once(spark, tmp_path, monkeypatch):
    """The micro-batch dies after its outputs were appended, before its keys' rows are replaced in the state store:
    the restart runs the batch again from the same store version, produces the same outputs (Delta skips the second
    append) and then writes the state; no session is emitted twice or lost."""
    source = str(tmp_path / "source")
    versions = {1: [("a", 0, 1), ("a", SECOND, 2), ("b", 0, 5)], 2: [("c", 30 * SECOND, 7)], 3: [("a", 40 * SECOND, 3)]}
    write_source(spark, source, {1: versions[1]})
    p = _pipeline(source, str(tmp_path / "p"))
    BacklogRunner(spark, p).run()
    append_version(spark, source, versions[2])
    append_version(spark, source, versions[3])
    crash_on_state_write(monkeypatch, "simulated crash after the output append")
    with pytest.raises(Exception, match="simulated crash"):
        LiveRunner.from_manifest(spark, p).start(available_now=True)
    monkeypatch.undo()
    assert len(_sink(spark, p.sink.path)) == 2  # the first batch's outputs are in, its state write is not

    LiveRunner.from_manifest(spark, p).start(available_now=True)
    assert _sink(spark, p.sink.path) == _outputs(reference.run_process(versions, DELAY_S * SECOND, Sessions(), ts))
