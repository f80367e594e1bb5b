"""One Flink SQL run of the keyed-reduce workload, executed by ``make bench-peers`` in the peers venv
(``apache-flink``; it pins a pyarrow and pandas that pyspark does not take, hence a venv of its own). Reads the
Parquet data files of the benchmark's Delta source (append-only: its data files are its rows; Flink's file
source skips ``_delta_log``), counts and sums per key, and writes the result: Parquet in batch mode, a
Debezium-JSON changelog in streaming mode (Flink's file sink takes updates only through a changelog format).
Prints ``FLINK_RESULT {json}``. Imports nothing of this project."""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mode", choices=["batch", "streaming"], required=True)
    ap.add_argument("--state-backend", choices=["hashmap", "rocksdb"], default="hashmap")
    ap.add_argument("--source", required=True, help="the Delta table's folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jars", required=True, help="';'-separated jar paths (Parquet format, Hadoop client)")
    ap.add_argument("--parallelism", type=int, default=2)
    args = ap.parse_args()

    from pyflink.table import EnvironmentSettings, TableEnvironment

    t0 = time.perf_counter()
    batch = args.mode == "batch"
    env = TableEnvironment.create(
        EnvironmentSettings.in_batch_mode() if batch else EnvironmentSettings.in_streaming_mode()
    )
    conf = env.get_config()
    conf.set("parallelism.default", str(args.parallelism))
    conf.set("pipeline.jars", ";".join(f"file://{jar}" for jar in args.jars.split(";")))
    if not batch:
        conf.set("state.backend.type", args.state_backend)
    env.execute_sql(
        "CREATE TABLE events (key STRING, `value` BIGINT) WITH ("
        f"'connector' = 'filesystem', 'path' = 'file://{args.source}', 'format' = 'parquet')"
    )
    sink_format = "parquet" if batch else "debezium-json"
    env.execute_sql(
        "CREATE TABLE totals (key STRING, n BIGINT, total BIGINT) WITH ("
        f"'connector' = 'filesystem', 'path' = 'file://{args.out}', 'format' = '{sink_format}')"
    )
    started = time.perf_counter()
    env.execute_sql(
        "INSERT INTO totals SELECT key, COUNT(*) AS n, SUM(`value`) AS total FROM events GROUP BY key"
    ).wait()
    done = time.perf_counter()
    result = {
        "mode": args.mode,
        "state_backend": None if batch else args.state_backend,
        "job_s": round(done - started, 2),
        "with_startup_s": round(done - t0, 2),
        "output_format": sink_format,
    }
    print("FLINK_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
