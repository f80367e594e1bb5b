"""The pytest kit for users' own pipelines (phases.testing, phases.pytest_plugin): its fixtures come through the
installed ``pytest11`` entry point (this suite's ``spark`` fixture is the kit's ``phases_spark``), its equivalence
helper holds for a pipeline at every cut-off, and its diff names the rows that differ."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from phases import testing
from phases._internal.errors import DefinitionError
from tests.conftest import make_pipeline
from tests.helpers import EPOCH

S = timedelta(seconds=1)


def test_the_kit_is_registered_as_a_pytest_plugin(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("phases"), "phases.pytest_plugin is not loaded through pytest11"


def test_assert_equivalent_holds_for_a_keyed_pipeline_at_every_cutoff(phases_spark, delta_source, tmp_path):
    versions = [
        [("a", EPOCH + 30 * S, 1), ("b", EPOCH + 5 * S, None)],
        pd.DataFrame({"key": ["a", "b"], "ts": [EPOCH + 40 * S, EPOCH], "value": [3, 7]}),  # b: late (W = 20 s)
        [{"key": "c", "ts": EPOCH + 41 * S, "value": 4}],
    ]
    pipeline = make_pipeline(delta_source([]), str(tmp_path / "mine"), delay_s=10)
    testing.assert_equivalent(phases_spark, pipeline, versions, work=tmp_path / "work")

    got = testing.run_two_phase(phases_spark, pipeline, versions, 1, work=tmp_path / "one")
    sink = got.sink.set_index("key")
    assert sink["n"].to_dict() == {"a": 2, "b": 1, "c": 1}
    assert sink.loc["a", "total"] == 4 and sink.loc["c", "total"] == 4 and pd.isna(sink.loc["b", "total"])
    assert got.quarantine["reason"].tolist() == ["late: event time <= watermark"]
    assert '"value":7' in got.quarantine["record"][0]


def test_assert_equivalent_compares_what_a_topic_sinks_consumer_reads(
    phases_spark, phases_kafka, delta_source, tmp_path
):
    """A topic sink: each run of the kit writes a topic of its own, and compares what a read_committed consumer reads of
    it (folded per key for an aggregation)."""
    from phases import KafkaSink

    versions = [
        [("a", EPOCH + 30 * S, 1), ("b", EPOCH + 5 * S, 2)],
        [("a", EPOCH + 40 * S, 3), ("c", EPOCH + 41 * S, 4)],
    ]
    sink = KafkaSink(topic="totals", bootstrap_servers=phases_kafka.bootstrap_servers, path="unused", mode="changelog")
    pipeline = make_pipeline(delta_source([]), str(tmp_path / "mine"), delay_s=10, sink=sink)
    testing.assert_equivalent(phases_spark, pipeline, versions, work=tmp_path / "work", cutoffs=[1])
    got = testing.run_two_phase(phases_spark, pipeline, versions, 1, work=tmp_path / "one").sink.set_index("key")
    assert got["n"].to_dict() == {"a": 2, "b": 1, "c": 1} and "_batch_id" not in got.columns


def test_the_diff_lists_the_rows_only_one_side_has():
    reference = pd.DataFrame({"key": ["a", "b", "b"], "n": [1, 2, 2], "mean": [0.1 + 0.2, 1.0, 1.0]})
    same = pd.DataFrame({"key": ["b", "a", "b"], "n": [2, 1, 2], "mean": [1.0, 0.3, 1.0]})
    assert testing.frame_diff(reference, same, "sink") == ""
    other = pd.DataFrame({"key": ["a", "b"], "n": [1, 3], "mean": [0.3, 1.0]})
    diff = testing.frame_diff(reference, other, "sink")
    assert diff.splitlines() == [
        "sink: 2 row(s) only in the reference, 1 only in two-phase",
        "  only in reference (one streaming job) (2x): key='b', n=2, mean=1.0",
        "  only in two-phase: key='b', n=3, mean=1.0",
    ]


def test_a_two_input_pipeline_is_refused_with_what_to_do(tmp_path):
    from phases._internal.definition import DeltaSource, IntervalJoin

    join = IntervalJoin(right=DeltaSource(path="right"), lower=timedelta(seconds=-1), upper=timedelta(seconds=1))
    p = make_pipeline("src", str(tmp_path), operator=join)
    with pytest.raises(DefinitionError, match="two inputs"):
        testing.relocate(p, tmp_path, "src")


def test_a_cutoff_outside_the_versions_is_refused(phases_spark, tmp_path):
    with pytest.raises(ValueError, match=r"cutoff 3 is not in 0\.\.1"):
        testing.run_two_phase(phases_spark, make_pipeline("s", str(tmp_path)), [[]], 3, work=tmp_path)


@pytest.mark.parametrize(
    ("code", "needs"),
    [
        ("import phases.pytest_plugin", "pytest"),
        ("from phases.testing import event_versions; event_versions()", "hypothesis"),
    ],
)
def test_without_the_testing_extra_the_kit_names_the_extra_to_install(code, needs):
    """A user who installed the package without its ``testing`` extra gets an engine error that says what to
    install, not a bare ImportError; ``import phases`` and the helpers that need no test framework still work."""
    import subprocess
    import sys

    blocked = f"import sys; sys.modules['{needs}'] = None; import phases; phases.run_two_phase; "
    done = subprocess.run([sys.executable, "-c", blocked + code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "SetupError" in done.stderr and "two-phase-pipelines[testing]" in done.stderr, done.stderr[-2000:]
