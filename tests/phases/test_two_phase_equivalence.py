"""The core promise: for any cut-off version V, backlog(0..V) + live(V+1..) equals one streaming job over
all versions, and both equal an independent plain-Python reference — results and quarantine alike."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import DeltaSink
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import (
    EVENT_VERSIONS,
    append_version,
    assert_results_equal,
    materialize,
    quarantine_rows,
    sink_rows,
    write_source,
)

DELAY_S = 15
SECOND = 1_000_000


@pytest.mark.slow
@settings(max_examples=examples(3), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=EVENT_VERSIONS, cut=st.integers(min_value=0, max_value=5))
def test_two_phase_equals_single_streaming_job_for_any_cutoff(spark, tmp_path, raw, cut):
    root = tmp_path / uuid.uuid4().hex
    source = str(root / "source")
    versions = materialize(raw)
    cutoff = min(cut, len(versions))
    write_source(spark, source, {v: rows for v, rows in versions.items() if v <= cutoff})

    two_phase = make_pipeline(source, str(root / "two_phase"), delay_s=DELAY_S)
    handoff = BacklogRunner(spark, two_phase).run()
    assert handoff.source_version == cutoff
    live = LiveRunner.from_manifest(spark, two_phase)
    live.start(available_now=True)
    for v in sorted(versions):
        if v > cutoff:
            append_version(spark, source, versions[v])
    live = LiveRunner.from_manifest(spark, two_phase)  # restart from its checkpoint, picks up V+1..
    live.start(available_now=True)

    # The single job's sink is upserted by rewriting it whole every micro-batch, the two-phase one's as the engine
    # picks (a MERGE for so few keys): both ways must equal the reference.
    single_sink = DeltaSink(path=str(root / "single" / "sink"), upsert_write="rewrite")
    single = make_pipeline(source, str(root / "single"), delay_s=DELAY_S, sink=single_sink)
    LiveRunner.streaming_only(spark, single, max_files_per_trigger=1).start(available_now=True)

    expected, expected_q = reference.run(versions, DELAY_S * SECOND)
    assert_results_equal(sink_rows(spark, two_phase.sink.path), expected)
    assert_results_equal(sink_rows(spark, single.sink.path), expected)
    want_q = sorted(expected_q, key=repr)
    assert quarantine_rows(spark, str(root / "two_phase")) == want_q
    assert quarantine_rows(spark, str(root / "single")) == want_q
