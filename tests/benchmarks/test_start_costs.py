"""The engine's fixed costs of a backlog, a live start and one micro-batch on almost no data (the harness's start-cost
rows, :mod:`benchmarks.start_costs`, on one kind): counted in Spark jobs, and no process started by the local session's
file systems."""

from __future__ import annotations


def test_start_costs_count_the_jobs_of_each_step(spark, tmp_path):
    from benchmarks import start_costs

    results = start_costs.measure(spark, tmp_path, kinds=("keyed",), repeats=1)
    assert [r["step"] for r in results] == ["backlog", "live start", "live start + 1 micro-batch"]
    assert all(r["seconds"] > 0 and r["jobs"] > 0 for r in results), results
    # The local session's file systems start no chmod or readlink (Hadoop's own: dozens a step).
    assert all(r["processes"] == 0 and r["compiled_classes"] >= 0 for r in results), results
    assert "| keyed | backlog |" in "\n".join(start_costs.lines(results))
