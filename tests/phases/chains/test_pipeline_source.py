"""Pipelines that feed pipelines: a pipeline's results as another's source (``PipelineSource``), named by the upstream
pipeline. A windowed aggregation's results (per-key windows of 10 s) feed a windowed aggregation of them (30 s
windows of the 10 s totals): for any cut-off of either stage and any split of their live phases into micro-batches,
each stage equals the plain reference over its input, and the downstream equals one streaming job over the upstream's
results."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from phases import PipelineSource
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Aggregation, DeltaSource, IntervalJoin, Window, WindowedAggregate
from phases._internal.errors import DefinitionError, PhaseStateError, SourceError
from phases._internal.live.runner import LiveRunner
from phases._internal.redeploy.runner import Redeploy
from phases._internal.storage import tables
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import EVENT_VERSIONS, append_version, materialize, us_of, write_source
from tests.phases.operators.test_windows import AGGS, emitted_windows
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

UP_SIZE_S, DOWN_SIZE_S = 10, 30
# The downstream's aggregations over the upstream's 10 s totals, named as the reference's windows name theirs.
DOWN_AGGS = [
    Aggregation(name="n", kind="count"),
    Aggregation(name="total", kind="sum", column="total"),
    Aggregation(name="hi", kind="max", column="total"),
]


def _upstream(source: str, root: str):
    window = WindowedAggregate(window=Window(size=timedelta(seconds=UP_SIZE_S)), aggregations=AGGS)
    return make_pipeline(source, root, delay_s=DELAY_S, name="minutes", operator=window)


def _downstream(upstream, root: str, delay_s: int):
    window = WindowedAggregate(window=Window(size=timedelta(seconds=DOWN_SIZE_S)), aggregations=DOWN_AGGS)
    source = PipelineSource(upstream=upstream)
    return make_pipeline(source, root, delay_s=delay_s, name="hours", event_time="window_start", operator=window)


def _windows(spark, path: str) -> dict[tuple[str, int, int], dict]:
    return emitted_windows(spark.read.format("delta").load(path).collect())


def _live(spark, pipeline, files: int | None) -> None:
    LiveRunner.from_manifest(spark, pipeline, max_files_per_trigger=files).start(available_now=True)


def _chain_expected(versions: dict, up_delay_us: int, down_delay_us: int = 0) -> tuple[dict, dict]:
    """The reference's upstream windows over ``versions``, and the downstream's windows over those (one version:
    the upstream's results, each window's start as its event time)."""
    size = UP_SIZE_S * SECOND
    up_expected, _ = reference.run_windows(versions, up_delay_us, size, size)
    rows = [(key, start, out["total"]) for (key, start, _), out in up_expected.items()]
    down_expected, _ = reference.run_windows({1: rows}, down_delay_us, DOWN_SIZE_S * SECOND, DOWN_SIZE_S * SECOND)
    return up_expected, down_expected


@pytest.mark.slow
@settings(max_examples=examples(2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=EVENT_VERSIONS,
    cuts=st.tuples(st.integers(min_value=0, max_value=5), st.integers(min_value=0, max_value=5)),
    down_delay_s=st.sampled_from([0, 30]),
    files=st.sampled_from([None, 1]),
)
def test_a_window_pipeline_feeding_a_window_pipeline_equals_the_reference_for_any_cutoffs_and_splits(
    spark, tmp_path, raw, cuts, down_delay_s, files
):
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = materialize(raw)
    up_cut = min(cuts[0], len(versions))
    down_cut = min(max(cuts[1], up_cut), len(versions))  # the downstream hands off at or after the upstream
    write_source(spark, source, {v: rows for v, rows in versions.items() if v <= up_cut})
    up = _upstream(source, str(root / "up"))
    down = _downstream(up, str(root / "down"), down_delay_s)

    BacklogRunner(spark, up).run()
    _live(spark, up, files)  # the switch: the upstream is live
    for v in range(up_cut + 1, down_cut + 1):
        append_version(spark, source, versions[v])
    _live(spark, up, files)  # the upstream applied versions ..down_cut in micro-batches of its own
    BacklogRunner(spark, down).run()  # the downstream's backlog: the upstream's results so far
    _live(spark, down, files)
    for v in range(down_cut + 1, len(versions) + 1):
        append_version(spark, source, versions[v])
    _live(spark, up, files)
    _live(spark, down, files)

    # The downstream's records are the upstream's windows: each upstream write holds windows that end after every
    # window of the writes before it (the watermark closes them in order), so none is late downstream, whatever the
    # upstream's cut-off and split; the reference is its windows over all of them.
    up_expected, down_expected = _chain_expected(versions, DELAY_S * SECOND, down_delay_s * SECOND)
    assert _windows(spark, up.sink.path) == up_expected
    assert _windows(spark, down.sink.path) == down_expected
    # One streaming job over the upstream's results, from their first version, one version per micro-batch.
    single = _downstream(up, str(root / "single"), down_delay_s)
    single = single.model_copy(update={"sink": single.sink.model_copy(update={"path": str(root / "single_sink")})})
    LiveRunner.streaming_only(spark, single, max_files_per_trigger=1).start(available_now=True)
    assert _windows(spark, single.sink.path) == down_expected


def test_the_downstream_backlog_waits_for_the_upstreams_handoff_and_names_it(spark, tmp_path):
    source = str(tmp_path / "source")
    up = _upstream(source, str(tmp_path / "up"))
    down = _downstream(up, str(tmp_path / "down"), 0)
    with pytest.raises(SourceError, match=r"pipeline 'minutes'.*has not handed off.*Run the backlog of 'minutes'"):
        BacklogRunner(spark, down).run()
    write_source(spark, source, {1: [("a", 20 * SECOND, 1)]})
    append_version(spark, source, [("b", 45 * SECOND, 2), ("a", 61 * SECOND, 3)])
    BacklogRunner(spark, up).run()
    handoff = BacklogRunner(spark, down).run()
    # The downstream's event time is the upstream's window_start, a name its own windows' bounds have too: its state
    # keeps the records' greatest event time (the newest upstream window's start), not its own windows' start.
    newest = spark.read.format("delta").load(up.sink.path).agg(F.unix_micros(F.max("window_start"))).collect()[0][0]
    state = spark.read.format("delta").load(handoff.state_path).agg(F.unix_micros(F.max("_max_ts"))).collect()[0][0]
    assert state == newest == handoff.backlog_max_event_time_us
    # The upstream's sink keeps its change data feed from its first version (the downstream read it so).
    properties = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{up.sink.path}`").collect()}
    assert properties["delta.enableChangeDataFeed"] == "true" and tables.version(spark, up.sink.path) >= 0
    assert properties["delta.feature.changeDataFeed"] == "supported" and properties["delta.minWriterVersion"] == "7"
    assert properties["delta.minReaderVersion"] == "1"


def test_a_pipeline_source_is_named_by_its_upstream_and_refuses_a_keyed_aggregation_without_its_change_feed(tmp_path):
    up = _upstream(str(tmp_path / "source"), str(tmp_path / "up"))
    down = _downstream(up, str(tmp_path / "down"), 0)
    assert down.source.path == up.sink.path and down.source.upstream is up
    assert down.state_spec()["source"] == {"kind": "pipeline", "upstream": "minutes", "path": up.sink.path}
    with pytest.raises(DefinitionError, match="source.path is the upstream pipeline's sink"):
        PipelineSource(upstream=up, path=str(tmp_path / "elsewhere"))
    keyed = make_pipeline(DeltaSource(path=str(tmp_path / "source")), str(tmp_path / "keyed"))
    with pytest.raises(DefinitionError, match="is a keyed aggregation: its results are read as changes of its sink"):
        PipelineSource(upstream=keyed)


def test_an_upstream_sink_without_its_change_feed_is_refused_and_the_way_out_reads_it_exactly(spark, tmp_path):
    """A sink made before the engine turned the change feed on (an earlier release): the downstream's start names the
    ALTER TABLE, then the starting_version that reads the versions before it as one snapshot; followed, both stages
    equal their references."""
    source = str(tmp_path / "source")
    versions = {1: [("a", 20 * SECOND, 1), ("b", 25 * SECOND, 2)], 2: [("a", 41 * SECOND, 3)]}
    later = {3: [("b", 62 * SECOND, 4), ("a", 75 * SECOND, 5)], 4: [("c", 99 * SECOND, 6)]}
    write_source(spark, source, versions)
    up = _upstream(source, str(tmp_path / "up"))
    spark.range(0).write.format("delta").save(up.sink.path)  # the sink as an earlier release left it: no feed
    BacklogRunner(spark, up).run()
    LiveRunner.from_manifest(spark, up).start(available_now=True)
    down = _downstream(up, str(tmp_path / "down"), 0)
    with pytest.raises(SourceError, match=r"change data feed on.*To proceed: ALTER TABLE delta.`.*` SET TBLPROPERTIES"):
        BacklogRunner(spark, down).run()
    spark.sql(f"ALTER TABLE delta.`{up.sink.path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    turned_on = tables.version(spark, up.sink.path)
    with pytest.raises(SourceError, match=rf"PipelineSource\(upstream=minutes, starting_version={turned_on}\)"):
        BacklogRunner(spark, down).run()
    down = down.model_copy(update={"source": PipelineSource(upstream=up, starting_version=turned_on)})
    BacklogRunner(spark, down).run()
    LiveRunner.from_manifest(spark, down).start(available_now=True)
    for rows in later.values():
        append_version(spark, source, rows)
    _live(spark, up, None)
    _live(spark, down, None)

    up_expected, down_expected = _chain_expected({**versions, **later}, DELAY_S * SECOND)
    assert _windows(spark, up.sink.path) == up_expected
    assert down_expected and _windows(spark, down.sink.path) == down_expected


def test_an_upstream_reset_stops_the_downstream_live_phase_and_its_reset_follows_it_exactly(spark, tmp_path):
    """The upstream writes its results whole again (a reset of its backlog): the downstream's live phase stops at that
    version, naming it, and applies nothing of it; its own reset then reads the new results (up to the rewrite as one
    snapshot) and both stages equal their references through the versions that follow."""
    source = str(tmp_path / "source")
    first = {1: [("a", 20 * SECOND, 1), ("b", 25 * SECOND, 2)], 2: [("a", 41 * SECOND, 3), ("b", 58 * SECOND, 9)]}
    second = {3: [("b", 62 * SECOND, 4)], 4: [("a", 75 * SECOND, 5)]}
    third = {5: [("c", 99 * SECOND, 6)], 6: [("a", 131 * SECOND, 7)]}
    write_source(spark, source, first)
    up = _upstream(source, str(tmp_path / "up"))
    down = _downstream(up, str(tmp_path / "down"), 0)
    BacklogRunner(spark, up).run()
    _live(spark, up, None)
    BacklogRunner(spark, down).run()
    _live(spark, down, None)
    assert _windows(spark, down.sink.path) or spark.read.format("delta").load(up.sink.path).count() > 0
    for rows in second.values():
        append_version(spark, source, rows)
    BacklogRunner(spark, up).run(reset=True)  # the upstream's results written whole again
    _live(spark, up, None)
    before = _windows(spark, down.sink.path)
    with pytest.raises(
        PhaseStateError, match=r"pipeline 'minutes' wrote its results again at version \d+ .*reset=True"
    ):
        _live(spark, down, None)
    assert _windows(spark, down.sink.path) == before  # nothing of the rewrite applied
    BacklogRunner(spark, down).run(reset=True)  # the way out the error names
    _live(spark, down, None)
    for rows in third.values():
        append_version(spark, source, rows)
    _live(spark, up, None)
    _live(spark, down, None)

    up_expected, down_expected = _chain_expected({**first, **second, **third}, DELAY_S * SECOND)
    assert _windows(spark, up.sink.path) == up_expected
    assert down_expected and _windows(spark, down.sink.path) == down_expected


def test_a_catch_up_increment_over_an_upstream_rewrite_stops_and_a_reset_backlog_reads_the_new_results(spark, tmp_path):
    source = str(tmp_path / "source")
    first = {1: [("a", 20 * SECOND, 1), ("b", 58 * SECOND, 2)]}
    write_source(spark, source, first)
    up = _upstream(source, str(tmp_path / "up"))
    down = _downstream(up, str(tmp_path / "down"), 0)
    BacklogRunner(spark, up).run()
    BacklogRunner(spark, down).run()  # not switched: a catch-up increment would follow the upstream's new results
    later = {2: [("a", 71 * SECOND, 3), ("b", 140 * SECOND, 4)]}
    append_version(spark, source, later[2])
    BacklogRunner(spark, up).run(reset=True)
    with pytest.raises(PhaseStateError, match=r"pipeline 'minutes' wrote its results again.*reset=True"):
        BacklogRunner(spark, down).run_increment()
    BacklogRunner(spark, down).run(reset=True)
    up_expected, down_expected = _chain_expected({**first, **later}, DELAY_S * SECOND)
    assert down_expected and _windows(spark, down.sink.path) == down_expected


def test_an_upstream_redeploy_stops_the_downstream_at_its_swap_and_the_downstreams_reset_follows_it(spark, tmp_path):
    """A redeploy of the upstream (a changed watermark delay) swaps its new results into the table the downstream reads:
    the downstream's live phase stops at the swap's version, applying nothing of it; its reset reads the new
    generation's results, and both stages then equal the new definition's references."""
    source = str(tmp_path / "source")
    first = {1: [("a", 20 * SECOND, 1), ("b", 44 * SECOND, 2)], 2: [("a", 61 * SECOND, 3), ("b", 77 * SECOND, 4)]}
    later = {3: [("c", 70 * SECOND, 5), ("a", 98 * SECOND, 6)], 4: [("b", 133 * SECOND, 7)]}
    write_source(spark, source, first)
    up = _upstream(source, str(tmp_path / "up"))
    down = _downstream(up, str(tmp_path / "down"), 0)
    BacklogRunner(spark, up).run()
    _live(spark, up, None)
    BacklogRunner(spark, down).run()
    _live(spark, down, None)
    assert _windows(spark, down.sink.path) or _windows(spark, up.sink.path)

    changed = up.model_copy(update={"watermark_delay": timedelta(seconds=DELAY_S + 10)})
    assert Redeploy(spark, changed).run(reason="a longer delay").swapped
    before = _windows(spark, down.sink.path)
    with pytest.raises(PhaseStateError, match=r"pipeline 'minutes' wrote its results again.*redeploy's swap"):
        _live(spark, down, None)
    assert _windows(spark, down.sink.path) == before
    BacklogRunner(spark, down).run(reset=True)
    _live(spark, down, None)
    for rows in later.values():
        append_version(spark, source, rows)
    _live(spark, changed, None)
    _live(spark, down, None)

    up_expected, down_expected = _chain_expected({**first, **later}, (DELAY_S + 10) * SECOND)
    assert _windows(spark, up.sink.path) == up_expected
    assert down_expected and _windows(spark, down.sink.path) == down_expected


@pytest.mark.slow
def test_kill_9_of_either_stage_at_its_sink_write_then_restarts_count_every_result_once(spark, tmp_path):
    """A real crash of each stage's live process: the upstream's once its sink append committed and before its
    progress record (the restart writes the batch again: the downstream must not see its results twice), then the
    downstream's once its own sink append committed. After restarts that take the dead leases over, both stages
    equal their references."""
    import subprocess
    import sys

    source = str(tmp_path / "source")
    first = {1: [("a", 20 * SECOND, 1), ("b", 44 * SECOND, 2)]}
    later = {2: [("a", 61 * SECOND, 3), ("c", 77 * SECOND, 4)], 3: [("b", 99 * SECOND, 5), ("a", 140 * SECOND, 6)]}
    write_source(spark, source, first)
    up = _upstream(source, str(tmp_path / "up"))
    down = _downstream(up, str(tmp_path / "down"), 0)
    BacklogRunner(spark, up).run()
    _live(spark, up, None)
    BacklogRunner(spark, down).run()
    _live(spark, down, None)
    for rows in later.values():
        append_version(spark, source, rows)

    def crash(pipeline) -> None:
        child = subprocess.run(
            [sys.executable, "-m", "tests.phases.live.live_child", pipeline.model_dump_json(), "progress"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert child.returncode == -9, child.stderr[-2000:]

    crash(up)
    LiveRunner.from_manifest(spark, up, take_over=True).start(available_now=True)
    crash(down)
    LiveRunner.from_manifest(spark, down, take_over=True).start(available_now=True)

    up_expected, down_expected = _chain_expected({**first, **later}, DELAY_S * SECOND)
    assert _windows(spark, up.sink.path) == up_expected
    assert down_expected and _windows(spark, down.sink.path) == down_expected


def test_an_interval_join_of_two_pipelines_results_equals_the_reference(spark, tmp_path):
    """Both inputs of a two-input operator may be other pipelines' results: clicks and views per 10 s window, joined
    on the key where a view's window starts 0..10 s after a click's. Each input keeps its own arrival order; the
    windows of each arrive in order, so none is late, and the pairs are those of the two references' windows."""
    clicks = {1: [("a", 3 * SECOND, 1), ("b", 12 * SECOND, 2)], 2: [("a", 31 * SECOND, 3), ("b", 55 * SECOND, 4)]}
    views = {1: [("a", 14 * SECOND, 5), ("b", 18 * SECOND, 6)], 2: [("a", 36 * SECOND, 7), ("a", 70 * SECOND, 8)]}
    later_clicks = {3: [("a", 90 * SECOND, 9)]}
    later_views = {3: [("b", 95 * SECOND, 10)]}
    write_source(spark, str(tmp_path / "clicks"), clicks)
    write_source(spark, str(tmp_path / "views"), views)
    up_clicks = _upstream(str(tmp_path / "clicks"), str(tmp_path / "up_clicks")).model_copy(update={"name": "clicks"})
    up_views = _upstream(str(tmp_path / "views"), str(tmp_path / "up_views")).model_copy(update={"name": "views"})
    join = IntervalJoin(right=PipelineSource(upstream=up_views), lower=timedelta(0), upper=timedelta(seconds=UP_SIZE_S))
    joined = make_pipeline(
        PipelineSource(upstream=up_clicks),
        str(tmp_path / "joined"),
        delay_s=0,
        name="clicks_then_views",
        event_time="window_start",
        operator=join,
    )
    for up in (up_clicks, up_views):
        BacklogRunner(spark, up).run()
        _live(spark, up, None)
    BacklogRunner(spark, joined).run()
    _live(spark, joined, None)
    append_version(spark, str(tmp_path / "clicks"), later_clicks[3])
    append_version(spark, str(tmp_path / "views"), later_views[3])
    for up in (up_clicks, up_views):
        _live(spark, up, None)
    _live(spark, joined, None)

    size, delay = UP_SIZE_S * SECOND, DELAY_S * SECOND
    left, _ = reference.run_windows({**clicks, **later_clicks}, delay, size, size)
    right, _ = reference.run_windows({**views, **later_views}, delay, size, size)
    expected = sorted(
        (key, start, rstart)
        for (key, start, _), _ in left.items()
        for (rkey, rstart, _), _ in right.items()
        if key == rkey and start <= rstart <= start + size
    )
    assert expected
    rows = spark.read.format("delta").load(joined.sink.path).collect()
    got = sorted((r["key"], us_of(r["window_start"]), us_of(r["right_window_start"])) for r in rows)
    assert got == expected
