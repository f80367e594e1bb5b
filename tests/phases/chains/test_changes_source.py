"""A keyed aggregation's results as another pipeline's source, read as changes: per key, the count of its events, the
sum of their values and the newest event time; downstream, per count, how many keys have it, the sum and the average of
their totals (a histogram that moves as keys move between counts). Each upstream write takes a key's old row back and
adds its new one; the downstream's counts and sums subtract what is taken back, and a count no key has any more leaves
the sink. For any cut-off of either stage and any split into micro-batches, the upstream equals the plain reference and
the downstream equals the same grouping of the upstream's results."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from phases import PipelineSource
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Aggregation, DeltaSink, KeyedAggregate, Window, WindowedAggregate
from phases._internal.errors import DefinitionError
from phases._internal.live.runner import LiveRunner
from phases._internal.redeploy.runner import Redeploy
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import EVENT_VERSIONS, append_version, materialize, table_rows, write_source
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

UP_AGGS = [
    Aggregation(name="n", kind="count"),
    Aggregation(name="total", kind="sum", column="value"),
    Aggregation(name="last", kind="max", column="ts"),
]
DOWN_AGGS = [
    Aggregation(name="keys", kind="count"),
    Aggregation(name="total", kind="sum", column="total"),
    Aggregation(name="mean", kind="avg", column="total"),
]


def _upstream(source: str, root: str):
    sink = DeltaSink(path=f"{root}/sink", change_feed=True)
    return make_pipeline(
        source, root, delay_s=DELAY_S, name="per_key", operator=KeyedAggregate(aggregations=UP_AGGS), sink=sink
    )


def _downstream(upstream, root: str, **overrides):
    fields = dict(
        name="by_count", key_columns=["n"], event_time="last", operator=KeyedAggregate(aggregations=DOWN_AGGS)
    )
    return make_pipeline(PipelineSource(upstream=upstream), root, **{**fields, **overrides})


def _live(spark, pipeline, files: int | None = None) -> None:
    LiveRunner.from_manifest(spark, pipeline, max_files_per_trigger=files).start(available_now=True)


def _both_live(spark, source: str, root: str, first: dict):
    """The chain over ``first``: both backlogs and live phases, the upstream first; (upstream, downstream)."""
    write_source(spark, source, first)
    up = _upstream(source, f"{root}/up")
    down = _downstream(up, f"{root}/down")
    BacklogRunner(spark, up).run()
    _live(spark, up)
    BacklogRunner(spark, down).run()
    _live(spark, down)
    return up, down


def _by_count(per_key: dict[str, dict]) -> dict[int, dict]:
    """The downstream's reference: the upstream's rows grouped by their count (SQL: a sum or an average of no values
    is null)."""
    groups: dict[int, list] = defaultdict(list)
    for row in per_key.values():
        groups[row["n"]].append(row["total"])
    out = {}
    for n, totals in groups.items():
        present = [t for t in totals if t is not None]
        out[n] = {
            "keys": len(totals),
            "total": sum(present) if present else None,
            "mean": sum(present) / len(present) if present else None,
        }
    return out


def _results(spark, path: str, key: str, columns: tuple[str, ...]) -> dict:
    return {row[key]: {c: row[c] for c in columns} for row in table_rows(spark, path)}


def _expected_upstream(versions: dict, delay_s: int = DELAY_S) -> dict[str, dict]:
    expected, _ = reference.run(versions, delay_s * SECOND)
    return {key: {"n": row["n"], "total": row["total"]} for key, row in expected.items()}


def _check(spark, up, down, versions: dict, delay_s: int = DELAY_S) -> None:
    """The upstream's sink equals the reference over ``versions`` (with the watermark delay ``delay_s``), the
    downstream's the same grouping of it."""
    up_expected = _expected_upstream(versions, delay_s)
    assert _results(spark, up.sink.path, "key", ("n", "total")) == up_expected
    assert _results(spark, down.sink.path, "n", ("keys", "total", "mean")) == _by_count(up_expected)


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=EVENT_VERSIONS,
    cuts=st.tuples(st.integers(min_value=0, max_value=5), st.integers(min_value=0, max_value=5)),
    files=st.sampled_from([None, 1]),
)
# A key updated in the version after its insert, both read by one downstream micro-batch: Delta's offset after a version
# of change files stays at its last file, which read as a version in part held the update back for good.
@example(raw=[[("a", 0, 0)], [("a", 0, 0)]], cuts=(0, 0), files=None)
def test_a_keyed_aggregation_feeding_an_aggregation_over_its_changes_equals_the_reference_for_any_cutoffs_and_splits(
    spark, tmp_path, raw, cuts, files
):
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = materialize(raw)
    up_cut = min(cuts[0], len(versions))
    down_cut = min(max(cuts[1], up_cut), len(versions))  # the downstream hands off at or after the upstream
    write_source(spark, source, {v: rows for v, rows in versions.items() if v <= up_cut})
    up = _upstream(source, str(root / "up"))
    down = _downstream(up, str(root / "down"))

    BacklogRunner(spark, up).run()
    _live(spark, up, files)
    for v in range(up_cut + 1, down_cut + 1):
        append_version(spark, source, versions[v])
    _live(spark, up, files)  # the upstream's MERGEs: keys' rows replaced, so taken back and added downstream
    BacklogRunner(spark, down).run()  # the upstream's table as of its newest version
    _check(spark, up, down, {v: rows for v, rows in versions.items() if v <= down_cut})
    _live(spark, down, files)
    for v in range(down_cut + 1, len(versions) + 1):
        append_version(spark, source, versions[v])
        _live(spark, up, files)
    _live(spark, down, files)
    _check(spark, up, down, versions)


def test_an_upstream_reset_and_the_downstreams_increment_follow_the_changes_exactly(spark, tmp_path):
    """The upstream writes its results whole again (a reset of its backlog): over changes that is every old row taken
    back and every new one added, so the downstream follows it live without a reset of its own, as a catch-up
    increment does over the upstream's MERGEs; a count that no key has any more leaves the downstream's sink."""
    source = str(tmp_path / "source")
    first = {1: [("a", 20 * SECOND, 1), ("b", 25 * SECOND, 2)], 2: [("c", 41 * SECOND, None)]}
    second = {3: [("b", 62 * SECOND, 4)], 4: [("a", 75 * SECOND, 5), ("c", 76 * SECOND, 7)]}
    third = {5: [("d", 99 * SECOND, 6)], 6: [("a", 131 * SECOND, 7), ("b", 132 * SECOND, 1)]}
    write_source(spark, source, first)
    up = _upstream(source, str(tmp_path / "up"))
    down = _downstream(up, str(tmp_path / "down"))
    BacklogRunner(spark, up).run()
    _live(spark, up)
    BacklogRunner(spark, down).run()
    _check(spark, up, down, first)  # three keys of count 1; c's total is null
    for rows in second.values():
        append_version(spark, source, rows)
        _live(spark, up)
    BacklogRunner(spark, down).run_increment()  # over the upstream's MERGEs: every key moved from 1 to 2
    _check(spark, up, down, {**first, **second})
    assert 1 not in _results(spark, down.sink.path, "n", ("keys",))
    _live(spark, down)
    for rows in third.values():
        append_version(spark, source, rows)
    BacklogRunner(spark, up).run(reset=True)  # the upstream's results written whole again
    _live(spark, up)
    _live(spark, down)
    _check(spark, up, down, {**first, **second, **third})


def test_what_cannot_take_a_row_back_is_refused_at_definition_with_the_reason(tmp_path):
    source = str(tmp_path / "source")
    up = _upstream(source, str(tmp_path / "up"))
    root = str(tmp_path / "down")
    refusals = {
        "aggregations \\['hi \\(max\\)'\\] cannot take a row back": dict(
            operator=KeyedAggregate(aggregations=[*DOWN_AGGS, Aggregation(name="hi", kind="max", column="total")])
        ),
        "a window_aggregate cannot take back a result it has emitted": dict(
            operator=WindowedAggregate(window=Window(size=timedelta(minutes=1)), aggregations=DOWN_AGGS)
        ),
        "max_future compares a row with its version's commit time": dict(max_future=timedelta(hours=2)),
        "Use a DeltaSink in mode 'upsert'": dict(sink=DeltaSink(path=f"{root}/sink", mode="changelog")),
    }
    for message, overrides in refusals.items():
        with pytest.raises(DefinitionError, match=message):
            _downstream(up, root, **overrides)
    plain = make_pipeline(source, str(tmp_path / "plain"), operator=KeyedAggregate(aggregations=UP_AGGS))
    with pytest.raises(DefinitionError, match=r"needs its sink in mode 'upsert' with change_feed=True.*ALTER TABLE"):
        PipelineSource(upstream=plain)
    with pytest.raises(DefinitionError, match="a changelog sink's rows do not carry the value they replace"):
        DeltaSink(path=f"{root}/x", mode="changelog", change_feed=True)


@pytest.mark.slow
def test_kill_9_of_either_stage_at_each_write_boundary_then_restarts_take_every_change_once(spark, tmp_path):
    """Real crashes of each stage's live process at each boundary of a micro-batch's writes (live_child's kill points:
    before the sink's MERGE, after it and before the progress record, after the record and before Spark's commit):
    a restart must neither write the upstream's changes again (the downstream would take a row back twice) nor apply
    them twice downstream. Three rounds of new source versions, each stage killed at another point in each; after the
    restarts that take the dead leases over, both equal their references."""
    import subprocess
    import sys

    source = str(tmp_path / "source")
    first = {1: [("a", 20 * SECOND, 1), ("b", 44 * SECOND, 2)]}
    rounds = [
        ({2: [("a", 61 * SECOND, 3), ("c", 77 * SECOND, 4)]}, "progress", "sink"),
        ({3: [("b", 99 * SECOND, 5), ("a", 140 * SECOND, 6)]}, "sink", "recorded"),
        ({4: [("c", 150 * SECOND, 7), ("d", 160 * SECOND, 8)]}, "recorded", "progress"),
    ]
    up, down = _both_live(spark, source, str(tmp_path), first)

    def crash(pipeline, point: str) -> None:
        child = subprocess.run(
            [sys.executable, "-m", "tests.phases.live.live_child", pipeline.model_dump_json(), point],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert child.returncode == -9, child.stderr[-2000:]
        LiveRunner.from_manifest(spark, pipeline, take_over=True).start(available_now=True)

    applied = dict(first)
    for versions, up_point, down_point in rounds:
        for rows in versions.values():
            append_version(spark, source, rows)
        applied.update(versions)
        crash(up, up_point)
        crash(down, down_point)
        _check(spark, up, down, applied)


def test_an_upstream_redeploy_reaches_the_live_downstream_as_changes_and_both_equal_the_new_references(spark, tmp_path):
    """A redeploy of the upstream (a longer watermark delay: a record late before is counted now) swaps its new results
    into the table the downstream reads; over changes the swap is every old row taken back and every new one added, so
    the downstream's live phase follows it with no reset of its own, through the versions after it."""
    source = str(tmp_path / "source")
    first = {1: [("a", 20 * SECOND, 1), ("b", 44 * SECOND, 2)], 2: [("a", 70 * SECOND, 3), ("b", 25 * SECOND, 4)]}
    later = {3: [("c", 80 * SECOND, 5), ("a", 98 * SECOND, 6)], 4: [("b", 133 * SECOND, 7)]}
    up, down = _both_live(spark, source, str(tmp_path), first)
    _check(spark, up, down, first)  # b's record at 25 s is late under 15 s (W = 44 - 15 = 29 s): b counts once

    changed = up.model_copy(update={"watermark_delay": timedelta(seconds=DELAY_S + 30)})
    assert Redeploy(spark, changed).run(reason="a longer delay").swapped
    _live(spark, down)
    for rows in later.values():
        append_version(spark, source, rows)
    _live(spark, changed)
    _live(spark, down)
    assert _expected_upstream({**first, **later}, DELAY_S + 30)["b"]["n"] == 3  # the new delay counts b at 25 s
    _check(spark, up, down, {**first, **later}, DELAY_S + 30)
