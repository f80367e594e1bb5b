"""``make bench-peers``: the keyed-reduce workload through Apache Flink beside this framework, in one run on the
same data files. Flink SQL runs in batch mode and in streaming mode with heap (``hashmap``) and RocksDB state,
parallelism 2 (the machine's cores), reading the Parquet files of the benchmark's Delta source; each result is
checked equal to Spark's plain batch job's before its time counts. The rows are merged into
``benchmarks/results/results.json`` under the keyed reduce workload (``peers``) and the reports are rewritten.

Flink runs in its own venv (``.venv-peers``, ``apache-flink`` pinned in ``benchmarks/peers-requirements.txt``):
its pyarrow and pandas pins conflict with pyspark's. Its Parquet format jar comes from Maven Central (the
``flink-peers`` jar bundle); the Hadoop client it needs is pyspark's own."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

import pyspark
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks import data, report, variants
from phases._internal.errors import SetupError
from phases._internal.runtime import jvm_deps
from phases._internal.runtime.session import SparkSettings, build_session

ROOT = Path(__file__).resolve().parent.parent
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
RUNS = (("batch", "hashmap"), ("streaming", "hashmap"), ("streaming", "rocksdb"))


def _hadoop_jars() -> list[str]:
    jars = sorted(str(p) for p in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-*.jar"))
    if not jars:
        raise SetupError("pyspark's hadoop-client jars were not found: Flink's Parquet format needs them")
    return jars


def _flink_output(spark: SparkSession, out: str, mode: str):
    if mode == "batch":
        return spark.read.parquet(out).select("key", "n", "total")
    # A changelog: per key, its newest row is the one with the largest count (a count only grows).
    log = spark.read.schema("after struct<key string, n long, total long>, op string").json(out)
    rows = log.filter(F.col("op") == "c").select("after.*")
    return rows.groupBy("key").agg(F.max_by(F.struct("n", "total"), F.col("n")).alias("m")).select("key", "m.*")


def run_flink(
    spark: SparkSession, source: str, plain: str, work: Path, mode: str, backend: str, jars: list[str]
) -> dict:
    out = work / f"flink_{mode}_{backend}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        str(PEERS_PYTHON), str(ROOT / "benchmarks" / "flink_job.py"), "--mode", mode, "--state-backend", backend,
        "--source", source, "--out", str(out), "--jars", ";".join(jars),
    ]  # fmt: skip
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    line = next((x for x in done.stdout.splitlines() if x.startswith("FLINK_RESULT ")), None)
    if line is None:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SystemExit(f"Flink {mode} ({backend}) failed (exit {done.returncode}):\n{tail}")
    result = json.loads(line.removeprefix("FLINK_RESULT "))
    result["process_s"] = round(wall, 2)
    result["equal"] = variants.same_results(spark, plain, _flink_output(spark, str(out), mode))
    print(f"[peers] Flink {mode} ({backend}): {result}", flush=True)
    if not result["equal"]:
        raise SystemExit(f"Flink {mode} ({backend}) results differ from Spark's plain batch job's")
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    if not PEERS_PYTHON.exists():
        raise SystemExit(f"{PEERS_PYTHON} is missing: run `make bench-peers` (it creates the peers venv)")
    work = ROOT / ".data" / "bench" / "peers"
    shutil.rmtree(work, ignore_errors=True)
    spark = build_session(SparkSettings(shuffle_partitions=8, driver_memory="4g"))
    try:
        source = str(work / "source")
        data.write_source(spark, source, data.keyed_reduce_batch, args.rows, args.keys, args.versions)
        files = int(DeltaTable.forPath(spark, source).detail().collect()[0]["numFiles"])
        plain = variants.plain_batch(spark, source, str(work / "plain"))
        two, p = variants.two_phase(spark, source, str(work / "two_phase"))
        if not variants.same_results(spark, str(work / "plain"), p.sink.path):
            raise SystemExit("two-phase results differ from the plain batch job's")
        ours = {
            "plain batch (Spark)": round(plain.seconds, 2),
            "two-phase": round(two.seconds, 2),
            "backlog": two.detail["backlog_s"],
        }
        print(f"[peers] ours: {ours}", flush=True)
        jars = [*jvm_deps.fetch(bundle=jvm_deps.FLINK_PEERS), *_hadoop_jars()]
        flink = [run_flink(spark, source, str(work / "plain"), work, mode, backend, jars) for mode, backend in RUNS]
    finally:
        spark.stop()
    out = Path(args.out)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"workloads": {}}
    results.setdefault("machine", report.machine())
    results.setdefault("started", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    results["peers"] = {
        "rows": args.rows, "keys": args.keys, "versions": args.versions, "files": files, "ours": ours,
        "flink": flink, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    js, md, png = report.write(results, out)
    print("\n".join(report.peer_lines(results["peers"])))
    print(f"written: {js}, {md}, {png}")


if __name__ == "__main__":
    main()
