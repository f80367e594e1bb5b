"""The Dagster half of the pytest kit (:mod:`phases_dagster.testing`): a user's pipeline materialized with its
checks."""

from __future__ import annotations

from phases_dagster.testing import materialize_backlog
from tests.helpers import write_source
from tests.phases.backlog.test_backlog import DELAY_S, S
from tests.phases_dagster.conftest import relative_pipeline


def test_materialize_backlog_runs_the_backlog_and_its_checks_on_a_throwaway_instance(spark, tmp_path):
    write_source(spark, str(tmp_path / "src"), {1: [("a", 10 * S, 1), ("b", 20 * S, 2)], 2: [("a", 30 * S, 3)]})
    result = materialize_backlog(spark, relative_pipeline(delay_s=DELAY_S), root=tmp_path)
    assert result.success and result.checks and all(result.checks.values()), result.checks
    assert result.metadata["keys"] == 2 and result.metadata["input_rows"] == 3
    assert result.metadata["handoff"]["source_version"] == 2


def test_a_topic_sinks_asset_shows_its_topic_the_records_published_and_the_last_batch(spark, kafka, tmp_path):
    import uuid

    import dagster as dg

    from phases import KafkaSink
    from phases_dagster.settings import Names

    topic = f"totals-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    write_source(spark, str(tmp_path / "src"), {1: [("a", 10 * S, 1), ("b", 20 * S, 2)], 2: [("a", 30 * S, 3)]})
    sink = KafkaSink(topic=topic, bootstrap_servers=kafka.bootstrap_servers, path="results")
    pipeline = relative_pipeline(delay_s=DELAY_S, sink=sink)
    result = materialize_backlog(spark, pipeline, root=tmp_path)
    assert result.success, result.checks
    [sink_event] = [
        e.step_materialization_data.materialization
        for e in result.result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key == dg.AssetKey(Names(pipeline).sink)
    ]
    meta = {k: getattr(v, "value", v) for k, v in sink_event.metadata.items()}
    assert meta["topic"] == topic and meta["topic_records"] == 2 and meta["topic_last_batch"] == -1, meta
    assert meta["topic_handoff"] == result.metadata["handoff"]["manifest_id"]
    assert sum(meta["topic_end_offsets"].values()) >= 2 and meta["dagster/row_count"] == 2
