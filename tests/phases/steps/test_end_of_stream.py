"""End-of-stream (full dam) steps with full-partition operators: they run blocking over the backlog, equal a
pandas reference per partition, feed an enrichment that both phases use, and are rejected where the live
phase would have to run them."""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import reduce

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import (
    AggregatePartition,
    Aggregation,
    DeltaSink,
    Derive,
    EndOfStreamStep,
    Enrichment,
    Filter,
    KeyedAggregate,
    MapPartition,
    ReducePartition,
    SortPartition,
)
from phases._internal.errors import DefinitionError, PhaseStateError
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import examples, make_pipeline
from tests.helpers import EVENT_VERSIONS, append_version, create_source, materialize, sink_rows, write_source
from tests.phases.test_two_phase_equivalence import DELAY_S, SECOND

FN = "tests.phases.steps.partition_functions"


def _steps(root: str, n: int) -> list[EndOfStreamStep]:
    out = lambda name: DeltaSink(path=f"{root}/{name}")  # noqa: E731
    return [
        EndOfStreamStep(
            name="sorted_running",
            partitions=n,
            operators=[
                SortPartition(key=f"{FN}:by_value_then_key", descending=True),
                MapPartition(function=f"{FN}:running_total", output_schema="key string, value long, running long"),
            ],
            output=out("sorted_running"),
        ),
        EndOfStreamStep(
            name="stats",
            partitions=n,
            operators=[
                SortPartition(by=["value"]),
                AggregatePartition(
                    aggregations=[
                        Aggregation(name="n", kind="count"),
                        Aggregation(name="total", kind="sum", column="value"),
                        Aggregation(name="lo", kind="min", column="value"),
                    ]
                ),
            ],
            output=out("stats"),
        ),
        EndOfStreamStep(
            name="xor",
            partitions=n,
            operators=[ReducePartition(name="x", column="value", reduce="acc ^ x")],
            output=out("xor"),
        ),
    ]


def _partitioned(spark, versions: dict, n: int) -> pd.DataFrame:
    """Valid records of ``versions`` (:func:`tests.reference.invalid_reason`: no null, nothing far in the future)
    with the partition Spark's hash partitioning puts them in (``pmod(hash(key, ts, value), n)``: the
    documented Murmur3 of ``repartition``), as pandas."""
    from tests.helpers import ts

    rows = [(k, ts(t), v) for vs in versions.values() for k, t, v in vs if reference.invalid_reason(k, t) is None]
    if not rows:
        return pd.DataFrame(columns=["key", "ts", "value", "p"])
    df = spark.createDataFrame(rows, "key string, ts timestamp, value long")
    return df.select("*", F.expr(f"pmod(hash(key, ts, value), {n})").alias("p")).toPandas()


def _expected(records: pd.DataFrame) -> tuple[list, list, list]:
    running, stats, xors = [], [], []
    for _, part in records.groupby("p"):
        values = [None if pd.isna(v) else int(v) for v in part["value"]]
        keyed = sorted(zip(values, part["key"], strict=True), key=lambda r: (r[0] if r[0] is not None else 0, r[1]))
        total = 0
        for value, key in reversed(keyed):
            total += value or 0
            running.append((key, value or 0, total))
        present = [v for v in values if v is not None]
        stats.append((len(values), sum(present) if present else None, min(present) if present else None))
        xors.append(reduce(lambda a, b: a ^ b, present) if present else None)
    return running, stats, xors


@pytest.mark.slow
@settings(max_examples=examples(3), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=EVENT_VERSIONS, cut=st.integers(min_value=0, max_value=5), n=st.integers(min_value=1, max_value=3))
def test_full_partition_operators_equal_a_per_partition_reference(spark, tmp_path, raw, cut, n):
    root = str(tmp_path / uuid.uuid4().hex)
    versions = materialize(raw)
    cutoff = min(cut, len(versions))
    backlog = {v: r for v, r in versions.items() if v <= cutoff}
    write_source(spark, f"{root}/source", backlog)
    p = make_pipeline(f"{root}/source", f"{root}/run", delay_s=DELAY_S, end_of_stream=_steps(root, n))
    handoff = BacklogRunner(spark, p).run()
    assert handoff.source_version == cutoff
    running, stats, xors = _expected(_partitioned(spark, backlog, n))

    got = [
        (r["key"], r["value"], r["running"])
        for r in spark.read.format("delta").load(f"{root}/sorted_running").collect()
    ]
    assert sorted(got, key=repr) == sorted(running, key=repr)
    got = [(r["n"], r["total"], r["lo"]) for r in spark.read.format("delta").load(f"{root}/stats").collect()]
    assert sorted(got, key=repr) == sorted(stats, key=repr)
    got = [r["x"] for r in spark.read.format("delta").load(f"{root}/xor").collect()]
    assert sorted(got, key=repr) == sorted(xors, key=repr)


def test_enrichment_from_the_backlog_is_used_by_both_phases(spark, tmp_path):
    root = str(tmp_path)
    s = SECOND
    backlog = {
        1: [("a", 10 * s, 1), ("a", 11 * s, 2), ("b", 12 * s, 3), ("a", 13 * s, 4)],
        2: [("c", 30 * s, 5), ("b", 31 * s, 6)],
    }
    live = {3: [("a", 50 * s, 7), ("b", 51 * s, 8), ("d", 52 * s, 9), ("c", 53 * s, -1)]}
    write_source(spark, f"{root}/source", backlog)
    tiers = EndOfStreamStep(
        name="tiers",
        partitions=2,
        partition_by=["key"],
        operators=[MapPartition(function=f"{FN}:key_tier", output_schema="key string, tier string")],
        output=DeltaSink(path=f"{root}/tiers"),
    )
    p = make_pipeline(
        f"{root}/source",
        f"{root}/run",
        delay_s=DELAY_S,
        end_of_stream=[tiers],
        enrich=Enrichment(step="tiers", on=["key"], columns=["tier"]),
        steps=[
            Filter(condition="value >= 0"),
            Derive(name="weighted", expression="CASE WHEN tier = 'big' THEN value * 10 ELSE value END"),
        ],
        operator=KeyedAggregate(aggregations=[Aggregation(name="total", kind="sum", column="weighted")]),
    )
    handoff = BacklogRunner(spark, p).run()
    assert {r["key"]: r["tier"] for r in spark.read.format("delta").load(f"{root}/tiers").collect()} == {
        "a": "big",
        "b": "small",
        "c": "small",
    }
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    for rows in live.values():
        append_version(spark, f"{root}/source", rows)
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    # a: (1+2+4+7)*10 (big); b: 3+6+8; c: 5 (-1 filtered out); d: 9 (no tier: not enriched)
    assert {k: r["total"] for k, r in sink_rows(spark, p.sink.path).items()} == {"a": 140, "b": 17, "c": 5, "d": 9}
    expected, _ = reference.run({**backlog, **live}, DELAY_S * s)
    assert set(expected) == {"a", "b", "c", "d"}  # nothing late here: the tiers are the only difference

    # The step's output changed under the handoff: the live phase refuses to start.
    spark.createDataFrame([("e", "big")], "key string, tier string").write.format("delta").mode("append").save(
        f"{root}/tiers"
    )
    with pytest.raises(PhaseStateError, match="not the version"):
        LiveRunner.from_manifest(spark, p)
    with pytest.raises(PhaseStateError, match="catch-up increment is not available"):
        BacklogRunner(spark, p).run_increment()
    assert handoff.source_version == 2


def test_full_partition_operators_are_rejected_where_the_live_phase_would_run_them():
    with pytest.raises(DefinitionError, match=r"steps\[1\] \(sort_partition\) is a full-partition operator"):
        make_pipeline("s", "r", steps=[Filter(condition="value > 0"), SortPartition(by=["value"])])
    with pytest.raises(DefinitionError, match="must be the step's last operator"):
        EndOfStreamStep(
            name="x",
            operators=[AggregatePartition(aggregations=[Aggregation(name="n", kind="count")]), SortPartition(by=["n"])],
            output=DeltaSink(path="o"),
        )
    with pytest.raises(DefinitionError, match="exactly one of 'by'"):
        SortPartition(by=["a"], key="m:f")
    with pytest.raises(DefinitionError, match="is not an end_of_stream step"):
        make_pipeline("s", "r", enrich=Enrichment(step="nope", on=["key"], columns=["x"]))
    with pytest.raises(DefinitionError, match="import path"):
        MapPartition(function="not a path", output_schema="a int")


def test_a_pipeline_with_an_enrichment_has_no_single_streaming_job_form(spark, tmp_path):
    step = EndOfStreamStep(name="t", operators=[SortPartition(by=["key"])], output=DeltaSink(path=str(tmp_path / "t")))
    create_source(spark, str(tmp_path / "s"))
    p = make_pipeline(
        str(tmp_path / "s"),
        str(tmp_path / "r"),
        end_of_stream=[step],
        enrich=Enrichment(step="t", on=["key"], columns=["ts"]),
    )
    with pytest.raises(PhaseStateError, match="no single-streaming-job form"):
        LiveRunner.streaming_only(spark, p)
    assert timedelta(0) == p.checkpoint_interval_during_backlog
