"""Smoke run of the benchmark harness on tiny data: every measuring function of the harness runs once (each variant
of a workload, checked equal to the plain batch job, the one-micro-batch stream of one workload; one sink mode, one
plain-Spark peer and one two-input kind of the live runs, whose other settings run the same code), the spill run
reports, and the JSON / Markdown / PNG reports are written (timings are not asserted). `make bench` runs every
setting at full size."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from benchmarks import data, kafka_backlog, live, live_kinds, live_peers, process_pass, report
from benchmarks.run import (
    run_join_workload,
    run_low_cardinality_join,
    run_process_workload,
    run_spill,
    run_workload,
)
from tests.helpers import SHORT_LIVED_JVM_OPTIONS

# Not in `make test`: `make bench-smoke` runs this module (the harness is not the product; its run on tiny data takes
# about six minutes of the two-core machine). The engine's own start costs stay in the suite: test_start_costs.py.
pytestmark = pytest.mark.bench_smoke

# One kind of two inputs (a kind of one input runs the same harness code less its second source); the kinds' live
# paths are tested in their own modules.
KINDS = ("interval_join",)


def test_benchmark_harness_runs_every_variant_and_writes_its_reports(spark, tmp_path, monkeypatch):
    results = {"started": "test", "machine": report.machine(), "workloads": {}}
    # Stream modes in 2 micro-batches (20 in `make bench`): enough to run the multi-batch path; the plain batch job and
    # the framework once each (twice in `make bench`, the faster counting: the same code path).
    results["workloads"]["keyed reduce"] = run_workload(
        spark, "keyed_reduce", data.keyed_reduce_batch, 20_000, 2_000, 4, tmp_path, True, stream_batches=2, repeats=1
    )
    # ~2 rows a key over 6 versions (a minute each): some keys go idle for 3 minutes and their timers fire (over 4
    # versions none does); the stream in one batch a version
    results["workloads"]["keyed process"] = run_process_workload(spark, 4_000, 2_000, 6, tmp_path)
    results["workloads"]["interval join"] = run_join_workload(
        spark, 2_000, 200, 4, tmp_path, stream_batches=2, one_batch_stream=False
    )
    results["workloads"]["low-cardinality join"] = run_low_cardinality_join(
        spark, 4_000, 3, 4, tmp_path, stream_rows=[500, 1_000], stream_batches=2
    )
    results["live"] = [
        live.measure(
            spark, tmp_path, state_keys=200, rates=(100,), versions=2, batches=2, batch_rows=50, drain_rows=300,
            drain_versions=2, sink_mode="changelog",
        )
    ]  # fmt: skip
    results["live_peers"] = [
        live_peers.measure(
            spark, tmp_path, mode="merge", state_keys=200, rates=(2_000,), versions=2, batches=2, batch_rows=50,
            drain_rows=300, drain_versions=2,
        )
    ]  # fmt: skip
    # A trigger every half second (5 s by default): each micro-batch waits less for its trigger, costs the same.
    results["live_kinds"] = live_kinds.measure(
        spark, tmp_path, kinds=KINDS, keys=200, batches=2, rows=50, interval=timedelta(milliseconds=500)
    )
    results["kafka_backlog"] = kafka_backlog.measure(
        spark, tmp_path, 3_000, 300, versions=3, runs=1, version_chunks=False
    )
    results["process_pass"] = process_pass.measure(spark, 2_000, 200, 4, runs=1)
    # The spill run's own JVM lives for one small backlog here: C1 only, as the suite's other short-lived JVMs.
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", SHORT_LIVED_JVM_OPTIONS)
    results["spill"] = run_spill(spark, str(tmp_path / "keyed_process" / "source"), tmp_path, "1g")
    js, md, png = report.write(results, tmp_path / "out")
    loaded = json.loads(js.read_text())
    timings = loaded["workloads"]["keyed reduce"]["timings"]
    assert set(timings) == {"plain batch", "stream", "stream, one batch", "two-phase"}
    assert all(t["equal"] for w in loaded["workloads"].values() for t in w["timings"].values())
    assert timings["stream"]["detail"]["micro_batches"] >= 2
    assert loaded["workloads"]["keyed reduce"]["seeding"]["keys"] > 1_900  # ~2,000 keys drawn by 20,000 rows
    process = loaded["workloads"]["keyed process"]
    assert set(process["timings"]) == {"plain batch", "stream", "two-phase"} and process["outputs"] > 0
    assert process["timings"]["stream"]["detail"]["micro_batches"] == 6  # one a version
    low = loaded["workloads"]["low-cardinality join"]
    assert set(low["timings"]) == {"plain batch", "two-phase", "stream"} and low["outputs"] > 0
    assert (
        low["timings"]["stream"]["extrapolated"]
        and "1,000 rows a side" in low["timings"]["stream"]["detail"]["measured"]
    )
    assert low["timings"]["two-phase"]["detail"]["bucket_s"] == 2.0
    join = loaded["workloads"]["interval join"]
    assert set(join["timings"]) == set(timings) - {"stream, one batch"} and join["outputs"] > 0
    assert join["timings"]["stream"]["detail"]["micro_batches"] >= 2
    assert all(t["memory"]["jvm_peak_mib"] > 0 for t in timings.values())
    assert [r["sink_mode"] for r in loaded["live"]] == ["changelog"]
    run = loaded["live"][0]
    # The changelog sink's background compaction, by its default interval; the reports name it.
    assert run["compact_every_s"] == 60 and "changelog, compaction every 60 s" in md.read_text()
    assert report.sink_label({"sink_mode": "changelog", "compact_every_s": 0.0}) == "changelog, compaction off"
    assert report.sink_label({"sink_mode": "upsert"}) == "upsert"
    assert run["backlog_timings"]["live_state_s"] > 0  # the store's version 1, written by the backlog
    assert run["state_keys"] == 200 and run["switch_s"] > 0 and len(run["batch"]["seconds"]) == 2
    assert [lat["versions"] for lat in run["latency"]] == [2] and run["latency"][0]["p50_s"] > 0
    assert run["drain"]["rows"] == 300 and run["drain"]["rows_per_s"] > 0
    # The drain's store update: its profile from the store's tasks (each touched key put once).
    profile = run["drain"]["store_update"]
    assert profile["tasks"] >= 1 and profile["rows_ms"] >= 0 and 0 < profile["puts"] <= 300
    peers = loaded["live_peers"]
    assert [p["peer"] for p in peers] == ["plain Spark, merge sink"]
    assert all(p["latency"][0]["p50_s"] > 0 and p["drain"]["rows"] == 300 for p in peers)
    # Each peer's sink holds what the plain query computed: per key, the count of its records in the source.
    merged = spark.read.format("delta").load(str(tmp_path / "live_plain_merge_200" / "sink"))
    expected = spark.read.format("delta").load(str(tmp_path / "live_plain_merge_200" / "source")).groupBy("key").count()
    assert merged.join(expected, "key").filter("n != count").count() == 0 and merged.count() == expected.count()
    assert "live phase beside plain Spark" in md.read_text()
    kinds = loaded["live_kinds"]
    assert [k["kind"] for k in kinds] == list(KINDS)
    assert all(k["micro_batch_s"] > 0 and len(k["micro_batches_s"]) == 2 for k in kinds)
    assert "live phase per operator kind" in md.read_text()
    assert loaded["spill"]["equal"] is True, loaded["spill"]
    kb = loaded["kafka_backlog"]
    assert kb["delta"][0]["input_rows"] == kb["kafka"][0]["input_rows"] == 3_000
    assert kb["ratio"] > 0
    # The plain Spark job over the same topic: equal to the framework's sink plus its quarantine, its shares measured.
    assert kb["plain_equal"] is True and kb["plain_ratio"] > 0
    assert all(r["fetch_s"] > 0 and r["seconds"] > 0 for r in kb["plain"])
    assert "plain Spark batch job over the topic" in md.read_text()
    assert "backlog from Kafka beside Delta" in md.read_text()
    passes = loaded["process_pass"]
    assert set(passes["seconds"]) == {"Spark alone", "do-nothing function", "IdleTotals"}
    assert set(passes["us_per_record"]) == {"do-nothing function", "IdleTotals"}
    assert "the process pass's own cost" in md.read_text()
    assert "| two-phase |" in md.read_text() and "p99" in md.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_topic_rows_publish_the_handoff_beside_a_batch_write_and_measure_both_live_paths(spark, kafka, tmp_path):
    from benchmarks import live_topics

    result = live_topics.measure(
        spark, tmp_path, state_keys=200, rates=(100,), versions=2, batches=2, batch_rows=50,
        servers=kafka.bootstrap_servers,
    )  # fmt: skip
    handoff = result["handoff_write"]
    assert handoff["results"] == handoff["records"] == handoff["plain_batch_write"]["records"] == 200
    assert handoff["topic_s"] > 0 and handoff["plain_batch_write"]["seconds"] > 0
    for path in (result["framework"], result["plain"]):
        assert len(path["batch"]["seconds"]) == 2, path
        [latency] = path["latency"]
        assert latency["versions"] == 2 and latency["p50_s"] > 0, path
    md = "\n".join(live_topics.lines(result))
    assert "results into a Kafka topic" in md and "p50 of the topic sink against Spark's Kafka sink" in md


def test_the_redeploy_rows_measure_the_time_without_fresh_results_while_data_arrives(spark, tmp_path):
    from benchmarks import redeploy

    # One catch-up round (5 in `make bench`): versions keep arriving, so the rounds rarely end early.
    result = redeploy.measure(
        spark, tmp_path, keys=300, rate=100, interval_s=1.0, before_s=2.0, after_s=3.0, live_rounds=1
    )
    assert result["equal"] is True and result["generation"] == 1
    assert result["not_fresh_s"] > 0 and result["stop_to_swap_s"] > 0
    assert result["timings"]["swap_commit_s"] > 0 and result["kept_s"] > 0  # the kept copy: by the new live start
    assert result["probes"] >= 5 and result["worst_latency_s"] > 0
    # The new live phase's later micro-batches (3 s of a version a second after its start): the floor's part.
    assert (
        result["warm_micro_batches"] >= 1
        and 0 < result["warm_micro_batch_min_s"] <= result["warm_micro_batch_median_s"]
    )
    md = "\n".join(redeploy.lines(result))
    assert "redeploy while data arrives" in md and "the swap's copy of 300 rows" in md
    assert (
        f"the fastest warm micro-batch | {result['timings']['swap_commit_s'] + result['warm_micro_batch_min_s']:.2f}"
        in md
    )


def test_growth_curve_runs_each_size_and_extrapolates_a_stream_too_long_to_run_whole(spark, tmp_path):
    from benchmarks import growth

    rows = growth.measure(spark, tmp_path, [4_000, 2_000], stream_whole_max_rows=2_000, partial_batches=2, versions=4)
    assert [r["rows"] for r in rows] == [2_000, 4_000]
    small, large = rows
    assert not small["stream_extrapolated"] and large["stream_extrapolated"]
    assert large["stream_measured"]["batches"] == 2 < large["stream_batches"]
    assert large["stream_s"] > large["stream_measured"]["seconds"]
    assert all(r["memory"]["two-phase"]["python_driver_peak_mib"] > 0 for r in rows)
    md = "\n".join(growth.lines(rows))
    assert "| 4,000 |" in md and "(extrapolated)" in md
    growth.chart(rows, tmp_path / "growth.png")
    assert (tmp_path / "growth.png").read_bytes()[:4] == b"\x89PNG"


def test_the_avro_backlog_runs_beside_a_plain_from_avro_job_over_the_same_topic(spark, tmp_path):
    from benchmarks import kafka_avro

    result = kafka_avro.measure(spark, tmp_path, 2_000, 200, versions=2, runs=1)
    assert result["plain_equal"] is True and result["ratio"] > 0
    assert result["framework"][0]["input_rows"] == 2_000
    md = "\n".join(kafka_avro.lines(result))
    assert "backlog from a topic of Avro values" in md and "plain Spark job with from_avro" in md


def test_the_protobuf_backlog_runs_beside_a_plain_job_decoding_in_python_over_the_same_topic(spark, tmp_path):
    from benchmarks import kafka_protobuf

    result = kafka_protobuf.measure(spark, tmp_path, 2_000, 200, versions=2, runs=1)
    assert result["plain_equal"] is True and result["ratio"] > 0
    assert result["framework"][0]["input_rows"] == 2_000
    md = "\n".join(kafka_protobuf.lines(result))
    assert "backlog from a topic of Protobuf values" in md and "decoding in mapInPandas" in md


def test_the_backlog_job_listing_names_each_step_and_the_driver_time_it_leaves(tmp_path):
    import subprocess
    import sys

    from benchmarks.run import ROOT

    command = [sys.executable, "-m", "benchmarks.backlog_jobs", "delta", "--rows", "20000", "--keys", "2000"]
    command += ["--runs", "2", "--work", str(tmp_path)]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True).stdout
    assert out.count("plain batch run") == 2 and out.count("backlog run") == 2, out
    assert "backlog: state" in out and "backlog: sink" in out, out  # jobs named by the backlog's steps
    assert "the jobs' wall time" in out, out
