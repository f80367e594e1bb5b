"""Two-input keyed operators (interval join, windowed co-group) in two phases: each input has its own
versions and lateness; for any pair of cut-offs the backlog plus the live phase emit exactly what one
streaming job over all versions of both inputs emits, and what a plain-Python reference emits."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import CoGroup, DeltaSource, Filter, IntervalJoin, Window
from phases._internal.errors import DefinitionError
from phases._internal.live.runner import LiveRunner
from phases._internal.operators import registry as operators
from phases._internal.placement import Placement
from phases._internal.sources.delta import DeltaTableSource
from phases._internal.tagging import tag_version_range
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import (
    EVENT_VERSIONS,
    append_version,
    assert_grouped_by_key,
    crash_on_state_write,
    materialize,
    quarantine_rows,
    ts,
    us_of,
    write_source,
)
from tests.phases.operators.two_input_functions import match_summary
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

LOWER_S, UPPER_S, WINDOW_S = -5, 10, 10


def _join(right: str, bucket_s: int | None = None) -> IntervalJoin:
    return IntervalJoin(
        right=DeltaSource(path=right),
        lower=timedelta(seconds=LOWER_S),
        upper=timedelta(seconds=UPPER_S),
        bucket=None if bucket_s is None else timedelta(seconds=bucket_s),
    )


def _co_group(right: str) -> CoGroup:
    return CoGroup(
        right=DeltaSource(path=right),
        window=Window(size=timedelta(seconds=WINDOW_S)),
        function="tests.phases.operators.two_input_functions:match_summary",
        output_schema="left_n long, right_n long, left_total long, trace string",
    )


def _pairs(spark, path: str) -> list[tuple]:
    return _pairs_of(spark.read.format("delta").load(path).collect())


def _pairs_of(rows) -> list[tuple]:
    return sorted(
        ((r["key"], us_of(r["ts"]), r["value"], us_of(r["right_ts"]), r["right_value"]) for r in rows), key=repr
    )


def _groups(rows) -> list[tuple]:
    out = []
    for r in rows:
        d = r if isinstance(r, dict) else r.asDict()
        out.append(
            (
                d["key"],
                us_of(d["window_start"]),
                us_of(d["window_end"]),
                d["left_n"],
                d["right_n"],
                d["left_total"],
                d["trace"],
            )
        )
    return sorted(out, key=repr)


def _run_two_phase_and_single(
    spark, root, left_versions, right_versions, cut_left, cut_right, operator_for, files=1, per_trigger=1
):
    """Backlog up to the cut-offs, the live phase over the rest (versions written as ``files`` files, read
    ``per_trigger`` files a micro-batch: versions of both inputs split across and merged into micro-batches),
    and one streaming job over everything."""
    left_src, right_src = str(root / "left"), str(root / "right")
    write_source(spark, left_src, {v: r for v, r in left_versions.items() if v <= cut_left}, files=files)
    write_source(spark, right_src, {v: r for v, r in right_versions.items() if v <= cut_right}, files=files)
    two_phase = make_pipeline(left_src, str(root / "two_phase"), delay_s=DELAY_S, operator=operator_for(right_src))
    handoff = BacklogRunner(spark, two_phase).run()
    assert handoff.source_version == cut_left and handoff.right_source_version == cut_right
    backlog_sink = spark.read.format("delta").load(two_phase.sink.path).collect()
    LiveRunner.from_manifest(spark, two_phase, max_files_per_trigger=per_trigger).start(available_now=True)
    for path, versions, cut in ((left_src, left_versions, cut_left), (right_src, right_versions, cut_right)):
        for v in sorted(versions):
            if v > cut:
                append_version(spark, path, versions[v], files)
    LiveRunner.from_manifest(spark, two_phase, max_files_per_trigger=per_trigger).start(available_now=True)
    single = make_pipeline(left_src, str(root / "single"), delay_s=DELAY_S, operator=operator_for(right_src))
    LiveRunner.streaming_only(spark, single, max_files_per_trigger=per_trigger).start(available_now=True)
    assert quarantine_rows(spark, str(root / "two_phase")) == quarantine_rows(spark, str(root / "single"))
    return two_phase, single, backlog_sink


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    left=EVENT_VERSIONS,
    right=EVENT_VERSIONS,
    cut_left=st.integers(min_value=0, max_value=5),
    cut_right=st.integers(min_value=0, max_value=5),
    files=st.integers(min_value=1, max_value=3),
    per_trigger=st.integers(min_value=1, max_value=2),
    bucket_s=st.sampled_from([None, 1, 4, 40]),
)
def test_interval_join_two_phase_equals_a_single_streaming_job_for_any_cutoffs_and_splits(
    spark, tmp_path, left, right, cut_left, cut_right, files, per_trigger, bucket_s
):
    """Also for any event-time bucket: narrower than the interval (a left row in several buckets), the
    default (upper - lower) and wider."""
    lv, rv = materialize(left), materialize(right)
    cl, cr = min(cut_left, len(lv)), min(cut_right, len(rv))
    root = tmp_path / uuid.uuid4().hex
    two_phase, single, backlog_sink = _run_two_phase_and_single(
        spark, root, lv, rv, cl, cr, lambda right: _join(right, bucket_s), files, per_trigger
    )
    bounds = (DELAY_S * SECOND, LOWER_S * SECOND, UPPER_S * SECOND)
    before = reference.run_interval_join(
        {v: r for v, r in lv.items() if v <= cl}, {v: r for v, r in rv.items() if v <= cr}, *bounds
    )
    assert _pairs_of(backlog_sink) == before
    expected = reference.run_interval_join(lv, rv, *bounds)
    assert _pairs(spark, two_phase.sink.path) == expected
    assert _pairs(spark, single.sink.path) == expected


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    left=EVENT_VERSIONS,
    right=EVENT_VERSIONS,
    cut_left=st.integers(min_value=0, max_value=5),
    cut_right=st.integers(min_value=0, max_value=5),
    files=st.integers(min_value=1, max_value=3),
    per_trigger=st.integers(min_value=1, max_value=2),
)
def test_co_group_two_phase_equals_a_single_streaming_job_for_any_cutoffs_and_splits(
    spark, tmp_path, left, right, cut_left, cut_right, files, per_trigger
):
    lv, rv = materialize(left), materialize(right)
    cl, cr = min(cut_left, len(lv)), min(cut_right, len(rv))
    root = tmp_path / uuid.uuid4().hex
    two_phase, single, backlog_sink = _run_two_phase_and_single(
        spark, root, lv, rv, cl, cr, _co_group, files, per_trigger
    )
    args = (DELAY_S * SECOND, WINDOW_S * SECOND, match_summary, ts)
    before = reference.run_co_group(
        {v: r for v, r in lv.items() if v <= cl}, {v: r for v, r in rv.items() if v <= cr}, *args
    )
    assert _groups(backlog_sink) == _groups(before)
    expected = _groups(reference.run_co_group(lv, rv, *args))
    assert _groups(spark.read.format("delta").load(two_phase.sink.path).collect()) == expected
    assert _groups(spark.read.format("delta").load(single.sink.path).collect()) == expected


def test_co_group_waits_for_an_input_without_records(spark, tmp_path):
    """Windows close only once both inputs have a watermark: an empty right input holds them open."""
    rows = {1: [("a", 0, 1), ("a", 3 * SECOND, 2)], 2: [("b", 60 * SECOND, 5)]}
    write_source(spark, str(tmp_path / "left"), rows)
    write_source(spark, str(tmp_path / "right"), {})
    p = make_pipeline(
        str(tmp_path / "left"), str(tmp_path / "p"), delay_s=DELAY_S, operator=_co_group(str(tmp_path / "right"))
    )
    handoff = BacklogRunner(spark, p).run()
    assert handoff.sink_rows == 0 and handoff.right_max_event_time_us is None
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    assert spark.read.format("delta").load(p.sink.path).count() == 0
    append_version(spark, str(tmp_path / "right"), [("a", 70 * SECOND, 9)])  # right W -> none yet (first version)
    append_version(spark, str(tmp_path / "right"), [("z", 80 * SECOND, 1)])  # right W -> 55 s: a's window closes
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    got = _groups(spark.read.format("delta").load(p.sink.path).collect())
    assert got == [("a", 0, 10 * SECOND, 2, 0, 3, "1,2|")]


def test_join_rows_of_one_input_after_a_restart_match_rows_handed_over_by_the_backlog(spark, tmp_path):
    # The first micro-batch after a restart holds right rows only: they must meet the left rows the backlog
    # handed over in the state.
    left = {1: [("a", 10 * SECOND, 1), ("a", -19 * SECOND, 2)]}
    right = {1: [("a", 18 * SECOND, -36), ("b", 25 * SECOND, None)]}
    two_phase, single, backlog_sink = _run_two_phase_and_single(spark, tmp_path, left, right, 1, 0, _join)
    assert backlog_sink == []
    expected = [("a", 10 * SECOND, 1, 18 * SECOND, -36)]
    assert _pairs(spark, two_phase.sink.path) == expected
    assert _pairs(spark, single.sink.path) == expected


def test_two_input_backlog_output_is_grouped_by_key(spark, tmp_path):
    left, right = str(tmp_path / "left"), str(tmp_path / "right")
    write_source(spark, left, {1: [(f"k{i % 7}", i * SECOND, i) for i in range(90)]})
    write_source(spark, right, {1: [(f"k{i % 5}", i * SECOND + 2 * SECOND, i) for i in range(90)]})
    for operator in (_join(right), _co_group(right)):
        p = make_pipeline(left, str(tmp_path / operator.kind), delay_s=DELAY_S, operator=operator)
        lt = tag_version_range(spark, Placement(p), DeltaTableSource(spark, p.source, p.source.path), (0, 1), None)
        rt = tag_version_range(
            spark, Placement(p), DeltaTableSource(spark, p.right_source, p.right_source.path), (0, 1), None
        )
        logic = operators.kind_of(p).logic(spark, p, [lt.prepared.schema, rt.prepared.schema])
        wm = [t.running_max_us - p.delay_us for t in (lt, rt)]
        out, _ = logic.backlog(lt.prepared, rt.prepared, *wm)
        partitions = out.select("key").rdd.glom().collect()
        assert sum(len(rows) for rows in partitions) > 0, operator.kind
        assert_grouped_by_key(partitions)


def test_two_input_definitions_are_validated(tmp_path):
    with pytest.raises(DefinitionError, match="lower .* must be <= upper"):
        IntervalJoin(right=DeltaSource(path="r"), lower=timedelta(seconds=5), upper=timedelta(seconds=1))
    with pytest.raises(DefinitionError, match="bucket must be > 0"):
        IntervalJoin(right=DeltaSource(path="r"), lower=timedelta(0), upper=timedelta(1), bucket=timedelta(0))
    with pytest.raises(DefinitionError, match="up to 3601 buckets .* at most 1000"):
        IntervalJoin(
            right=DeltaSource(path="r"), lower=timedelta(0), upper=timedelta(hours=1), bucket=timedelta(seconds=1)
        )
    a, b = (
        make_pipeline("l", "root", operator=_join("r", bucket_s)).fingerprint()
        for bucket_s in (None, 4)  # a bucket shapes no state: a handoff stays valid when it changes
    )
    assert a == b
    assert _join("r").bucket_width == timedelta(seconds=UPPER_S - LOWER_S)
    with pytest.raises(DefinitionError, match="co_group windows are tumbling"):
        CoGroup(
            right=DeltaSource(path="r"),
            window=Window(size=timedelta(seconds=10), slide=timedelta(seconds=5)),
            function="m:f",
            output_schema="n long",
        )
    with pytest.raises(DefinitionError, match="not supported with two-input operators"):
        make_pipeline("l", "root", operator=_join("r"), steps=[Filter(condition="value > 0")])
    with pytest.raises(DefinitionError, match="right source is the pipeline's own source"):
        make_pipeline("l", "root", operator=_join("l"))


def test_a_join_batch_that_dies_after_its_pairs_before_its_state_is_replayed_exactly_once(spark, tmp_path, monkeypatch):
    """The micro-batch appended its pairs, then died before its keys' held rows were replaced in the state store: the
    restart joins against the same store version again, Delta skips the second append, and later rows still meet
    the rows of that batch."""
    left_src, right_src = str(tmp_path / "left"), str(tmp_path / "right")
    write_source(spark, left_src, {1: [("a", 10 * SECOND, 1)]})
    write_source(spark, right_src, {1: [("b", 10 * SECOND, 2)]})
    p = make_pipeline(left_src, str(tmp_path / "p"), delay_s=DELAY_S, operator=_join(right_src))
    BacklogRunner(spark, p).run()
    append_version(spark, right_src, [("a", 15 * SECOND, 3)])  # meets the handed-over left row
    append_version(spark, left_src, [("a", 12 * SECOND, 4)])  # meets the right row of the same batch
    crash_on_state_write(monkeypatch, "simulated crash after the pairs were appended")
    with pytest.raises(Exception, match="simulated crash"):
        LiveRunner.from_manifest(spark, p).start(available_now=True)
    monkeypatch.undo()
    assert len(_pairs(spark, p.sink.path)) == 2

    LiveRunner.from_manifest(spark, p).start(available_now=True)
    append_version(spark, right_src, [("a", 20 * SECOND, 5)])  # meets both left rows (10 s, 12 s)
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    expected = [
        ("a", 10 * SECOND, 1, 15 * SECOND, 3),
        ("a", 10 * SECOND, 1, 20 * SECOND, 5),
        ("a", 12 * SECOND, 4, 15 * SECOND, 3),
        ("a", 12 * SECOND, 4, 20 * SECOND, 5),
    ]
    assert _pairs(spark, p.sink.path) == sorted(expected, key=repr)


@pytest.mark.parametrize("bucket_ms", [None, 5, 700, 3_000, 60_000])
def test_bucketed_join_finds_every_pair_of_an_interval_for_any_bucket(spark, bucket_ms):
    """The join's time buckets (narrower than the interval, the default, wider; event times on both sides of
    the epoch and on bucket edges) find exactly the pairs a comparison of every pair of a key finds."""
    import random
    from datetime import UTC, datetime

    from phases._internal.operators.join_logic import IntervalJoinLogic

    rng = random.Random(bucket_ms or 0)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    times = [rng.choice([-1, 1]) * rng.randrange(0, 20_000) for _ in range(300)]  # ms around the epoch
    times += [0, -1, 1, 2_999, 3_000, -3_000, -3_001]
    left = [(rng.choice("ab"), t, i) for i, t in enumerate(times[:160])]
    right = [(rng.choice("ab"), t, i) for i, t in enumerate(times[160:])]
    lower_ms, upper_ms = -1_500, 2_000
    op = IntervalJoin(
        right=DeltaSource(path="r"),
        lower=timedelta(milliseconds=lower_ms),
        upper=timedelta(milliseconds=upper_ms),
        bucket=None if bucket_ms is None else timedelta(milliseconds=bucket_ms),
    )
    p = make_pipeline("l", "root", operator=op)

    def frame(rows):
        return spark.createDataFrame(
            [(k, epoch + timedelta(milliseconds=t), v) for k, t, v in rows], "key string, ts timestamp, value long"
        )

    lf, rf = frame(left), frame(right)
    logic = IntervalJoinLogic(p, lf.schema, rf.schema)
    got = sorted(
        (r["key"], r["value"], r["right_value"]) for r in logic.pairs(lf, rf).collect()
    )  # fmt: skip
    expected = sorted(
        (lk, lv, rv) for lk, lt, lv in left for rk, rt, rv in right if lk == rk and lt + lower_ms <= rt <= lt + upper_ms
    )
    assert expected and got == expected
