"""End-to-end demo through Dagster on embedded defaults (local Spark, local Delta tables, a local Dagster
instance with its webserver and daemon on 127.0.0.1).

Generates a synthetic keyed event table (or, with ``--source kafka``, a topic on a Kafka broker the demo starts
on 127.0.0.1 from the setup's Maven jars; with ``--source kafka-avro`` or ``--source kafka-protobuf``, Avro or Protobuf
values in the Confluent wire format and a schema registry started beside the broker), starts ``dagster dev``,
materializes the backlog asset over GraphQL (backlog phase + blocking checks), lets the switch sensor launch the live
run, appends live data while it runs, waits for the sink to show it, terminates the live run, and checks the sink
against a reference computed independently with pandas (no Spark aggregation, no engine code).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import functions as F

from assets.pipelines import DEMO, DEMO_DAILY, DEMO_KAFKA, DEMO_KAFKA_AVRO, DEMO_KAFKA_PROTOBUF, DEMO_REVISED
from phases import Pipeline, SchemaRegistry
from phases._internal.deployment import place
from phases._internal.live.runner import LiveRunner
from phases._internal.placement import Placement
from phases._internal.runtime.session import SparkSettings, build_session
from phases._internal.sources import synthetic
from phases._internal.storage import quarantine
from phases.local import LocalKafka, LocalRegistry
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Names
from scripts.browser import BrowserError, screenshot
from scripts.dagster_stack import LOCATION, DagsterStack, DeployedLocation


def pandas_reference(changes: pd.DataFrame, delay_us: int) -> tuple[pd.DataFrame, int]:
    """Per-key results and the late count, by the version-watermark rule, in plain pandas."""
    df = changes
    vmax = df.groupby("_commit_version")["ts_us"].max().sort_index()
    prior = vmax.cummax().shift(1)  # max over earlier versions
    df["wm"] = df["_commit_version"].map(prior - delay_us)
    late = df["wm"].notna() & (df["ts_us"] <= df["wm"])
    ok = df[~late]
    g = ok.groupby("key")["value"]
    out = pd.DataFrame(
        {
            "events": g.size(),
            "total": g.sum(),
            "smallest": g.min(),
            "largest": g.max(),
            "mean": g.mean(),
            "checksum": g.agg(lambda s: np.bitwise_xor.reduce(s.to_numpy())),
            "valued": g.count(),  # the revised pipeline's (DEMO_REVISED) count of non-null values
        }
    )
    return out.sort_index(), int(late.sum())


class DeltaFeed:
    """The demo's input as a Delta table: one appended batch = one source version."""

    def __init__(self, spark, p: Placement):
        self.spark, self.p = spark, p

    def create(self) -> None:
        synthetic.create_source(self.spark, self.p.source_path(self.p.definition.source))

    def append(self, batch) -> None:
        synthetic.append(self.spark, self.p.source_path(self.p.definition.source), batch)

    def changes(self) -> pd.DataFrame:
        """Every record with its arrival (commit version), for the reference."""
        return (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", 0)
            .load(self.p.source_path(self.p.definition.source))
            .select("key", F.unix_micros("ts").alias("ts_us"), "value", "_commit_version")
            .toPandas()
        )

    def stop(self) -> None:
        pass


# The Avro demo's value schema, registered by the demo before its first record (as a producer's serializer does).
AVRO_SCHEMA = {
    "type": "record",
    "name": "DemoEvent",
    "namespace": "demo",
    "fields": [
        {"name": "key", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "value", "type": ["null", "long"], "default": None},
    ],
}

# The Protobuf demo's value schema (a .proto text), registered the same way; its records are encoded by Protobuf's
# Python runtime in Spark's Python workers and decoded the same way for the reference (never by the engine's decoder).
PROTO_SCHEMA = """syntax = "proto3";
package demo;
import "google/protobuf/timestamp.proto";
message DemoEvent {
  string key = 1;
  google.protobuf.Timestamp ts = 2;
  optional int64 value = 3;
}
"""


def _proto_encoder(schema_id: int):
    """A mapInArrow function: (key, ts, value) rows as Protobuf values in the Confluent wire format."""
    import pyarrow as pa

    from scripts.protobuf_messages import message_class, wire

    def encode(batches):
        event = message_class(PROTO_SCHEMA, "demo.DemoEvent")
        for batch in batches:
            keys, values = batch.column("key").to_pylist(), batch.column("value").to_pylist()
            micros = batch.column("ts").cast(pa.int64()).to_pylist()
            out = []
            for key, us, value in zip(keys, micros, values, strict=True):
                message = event(key=key, value=value)
                message.ts.FromMicroseconds(us)
                out.append(wire(schema_id, message))
            yield pa.RecordBatch.from_arrays([pa.array(keys), pa.array(out, pa.binary())], ["key", "value"])

    return encode


def _proto_decoder(batches):
    """A mapInArrow function: the topic's records with their Protobuf values decoded (Protobuf's Python runtime)."""
    import pyarrow as pa

    from scripts.protobuf_messages import message_class

    event = message_class(PROTO_SCHEMA, "demo.DemoEvent")
    for batch in batches:
        keys, micros, values = [], [], []
        for raw in batch.column("value").to_pylist():
            message = event.FromString(raw[6:])  # magic byte, schema id, message index 0
            keys.append(message.key)
            micros.append(message.ts.ToMicroseconds())
            values.append(message.value if message.HasField("value") else None)
        yield pa.RecordBatch.from_arrays(
            [batch.column("partition"), batch.column("offset"), pa.array(keys), pa.array(micros), pa.array(values)],
            ["partition", "offset", "key", "ts_us", "value"],
        )


class KafkaFeed:
    """The demo's input as a Kafka topic (3 partitions) on a broker started here: JSON values, or Avro or Protobuf
    values in the Confluent wire format with ``registry`` (their schema registered there first)."""

    def __init__(self, spark, p: Placement, broker: LocalKafka, registry: LocalRegistry | None = None):
        self.spark, self.p, self.broker, self.registry = spark, p, broker, registry
        self.schema_id: int | None = None
        self.protobuf = p.definition.source.value_format == "protobuf"

    def create(self) -> None:
        self.broker.create_topic(self.p.definition.source.topic, 3)
        if self.registry is not None:
            subject = f"{self.p.definition.source.topic}-value"
            if self.protobuf:
                self.schema_id = self.registry.register(subject, PROTO_SCHEMA, schema_type="PROTOBUF")
            else:
                self.schema_id = self.registry.register(subject, AVRO_SCHEMA)

    def _value(self):
        if self.schema_id is None:
            return F.to_json(F.struct("key", "ts", "value"))
        from pyspark.sql.avro.functions import to_avro

        header = b"\x00" + self.schema_id.to_bytes(4, "big")
        return F.concat(F.lit(header), to_avro(F.struct("key", "ts", "value"), json.dumps(AVRO_SCHEMA)))

    def _decoded(self):
        if self.schema_id is None:
            return F.from_json(F.col("value").cast("string"), self.p.definition.source.value_schema)
        from pyspark.sql.avro.functions import from_avro

        return from_avro(F.expr("substring(value, 6)"), json.dumps(AVRO_SCHEMA))

    def append(self, batch) -> None:
        if self.protobuf:
            assert self.schema_id is not None
            records = batch.mapInArrow(_proto_encoder(self.schema_id), "key string, value binary")
        else:
            records = batch.select(F.col("key"), self._value().alias("value"))
        (
            records.write.format("kafka")
            .option("kafka.bootstrap.servers", self.broker.bootstrap_servers)
            .option("topic", self.p.definition.source.topic)
            .save()
        )

    def changes(self) -> pd.DataFrame:
        """Every record with its arrival chunk (the backlog's chunk plan and the live micro-batches, as the run
        recorded them), for the reference."""
        chunks = LiveRunner.at(self.spark, serving(self.spark, self.p)).arrival_chunks()
        spans = self.spark.createDataFrame(
            [(c, p, lo, hi) for c, parts in chunks.items() for p, (lo, hi) in parts.items()],
            "_commit_version long, part int, lo long, hi long",
        )
        topic = (
            self.spark.read.format("kafka")
            .option("kafka.bootstrap.servers", self.broker.bootstrap_servers)
            .option("subscribe", self.p.definition.source.topic)
            .load()
        )
        if self.protobuf:
            decoded = topic.select("partition", "offset", "value").mapInArrow(
                _proto_decoder, "partition int, offset long, key string, ts_us long, value long"
            )
            records = decoded.select(
                "partition", "offset", F.struct("key", F.timestamp_micros("ts_us").alias("ts"), "value").alias("r")
            )
        else:
            records = topic.select("partition", "offset", self._decoded().alias("r"))
        inside = (
            (records["partition"] == spans["part"])
            & (records["offset"] >= spans["lo"])
            & (records["offset"] < spans["hi"])
        )
        return (
            records.join(F.broadcast(spans), inside, "left")
            .select("r.key", F.unix_micros("r.ts").alias("ts_us"), "r.value", "_commit_version")
            .toPandas()
        )

    def stop(self) -> None:
        if self.registry is not None:
            self.registry.stop()
        self.broker.stop()


def registry_demo(pipeline: Pipeline, url: str) -> Pipeline:
    """The Avro or Protobuf demo pipeline as the code location builds it with the registry at ``url`` (the registry
    is not part of its fingerprint: the same pipeline)."""
    source = pipeline.source.model_copy(update={"registry": SchemaRegistry(url=url)})
    return pipeline.model_copy(update={"source": source})


def daily_source(spark, data: Path, days: int = 3, rows: int = 2000) -> Path:
    """The daily-partitioned demo pipeline's source: one version committed on each of the last ``days`` days
    (commit times set the way a table written over days has them), so that its partitions can be backfilled from
    the UI."""
    path = Path(StorageResource(root=str(data)).placement(DEMO_DAILY).source_path(DEMO_DAILY.source))
    synthetic.create_source(spark, str(path))
    today = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    for i in range(days):
        synthetic.append(spark, str(path), synthetic.event_batch(spark, rows=rows, keys=rows // 4, batch_index=i))
    # Delta keeps commit times increasing (a commit older than the one before it counts as just after it), so the
    # table's creation (version 0) must be dated first: left at today, it made every later version count as today.
    for version in range(days + 1):
        stamp = (today - timedelta(days=days - version + 1, hours=1 if version == 0 else 0)).timestamp()
        os.utime(path / "_delta_log" / f"{version:020d}.json", (stamp, stamp))
    return path


def _when(value) -> str:
    """A timestamp metadata value (seconds since the epoch) as ISO text; text values as they are."""
    return datetime.fromtimestamp(value, UTC).isoformat() if isinstance(value, int | float) else str(value)


def _line(label: str, value: str) -> None:
    print(f"{label:>22}: {value}", flush=True)


def serving(spark, where: Placement) -> Placement:
    """``where`` as the generation that serves it now (the redeploy log read again)."""
    return place(spark, where.definition, root=where.root, kafka_bootstrap_servers=where.brokers, strict=False)


def accounted(spark, where: Placement) -> tuple[int, int]:
    """(events counted in the sink, records quarantined) by the generation that serves ``where``'s pipeline now."""
    bound = serving(spark, where)
    counted = spark.read.format("delta").load(bound.sink_path).agg(F.sum("events")).collect()[0][0] or 0
    return int(counted), quarantine.count(spark, bound.quarantine, where.name)


def wait_accounted(spark, pipeline: Placement, want: int, timeout_s: float = 1800) -> None:
    """Waits until every one of ``want`` records is counted in the sink or quarantined."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and sum(accounted(spark, pipeline)) != want:
        time.sleep(2)


def same_as_reference(spark, where: Placement, feed, want: int) -> bool:
    """Whether the sink of the generation serving ``where``'s pipeline equals the pandas reference of its definition."""
    wait_accounted(spark, where, want)
    pipeline = where.definition
    bound = serving(spark, where)
    expected, expected_late = pandas_reference(feed.changes(), pipeline.delay_us)
    actual = spark.read.format("delta").load(bound.sink_path).toPandas().set_index("key").sort_index()
    late = spark.read.format("delta").load(bound.quarantine).filter(F.col("reason").startswith("late")).count()
    columns = [a.name for a in pipeline.operator.aggregations if a.name != "mean"]
    return (
        actual.index.equals(expected.index)
        and all((actual[c] == expected[c]).all() for c in columns)
        and np.allclose(actual["mean"], expected["mean"])
        and late == expected_late
    )


def redeploy_walkthrough(stack, spark, data: Path, feed, location, args, want: int, figures: dict) -> tuple[str, int]:
    """Deploys the pipeline's second revision (DEMO_REVISED) and runs the redeploy job while data keeps arriving,
    then deploys the first again and rolls back; checks each against its pandas reference and reports the seconds
    the live results were not fresh. Returns the run whose live phase serves at the end, and the records written."""
    names = Names(DEMO)
    storage = StorageResource(root=str(data))
    # The batches arriving during both runs continue one clock: the rollback's on time too (a batch index that
    # restarted made all of them late, and the rollback's freshness figure measured nothing).
    index = 1000
    for pipeline, reason, label in (
        (DEMO_REVISED, "a five-minute watermark and a count of values", "redeploy"),
        (DEMO, "roll back to the first revision", "rollback"),
    ):
        location.deploy("DEMO_REVISED" if pipeline is DEMO_REVISED else "DEMO")
        stack.reload()
        config = {"reason": reason}
        t = time.perf_counter()
        run = stack.launch(
            names.redeploy_job,
            {"ops": {names.next_generation: {"config": config}, names.live_asset: {"config": config}}},
        )
        _line(label, f"{names.redeploy_job} run {run}: {reason}")
        batches = 0
        while "live phase running" not in " ".join(stack.messages(run)[-200:]):  # data keeps arriving meanwhile
            if stack.run_status(run) in {"FAILURE", "CANCELED"}:
                raise SystemExit(f"the {label} run failed:\n" + "\n".join(stack.messages(run)[-15:]))
            feed.append(
                synthetic.event_batch(spark, rows=args.live_rows // 10, keys=args.keys, batch_index=index, seed=13)
            )
            want += args.live_rows // 10
            batches += 1
            index += 1
            time.sleep(3)
        swapped = stack.latest_materialization(names.swap)
        started = next(
            m for m in stack.observations(names.live_asset, 100) if m.get("event") == "started" and m["run_id"] == run
        )
        gap = started["first_batch_at"] - swapped["serving_live_stopped_at"]
        built = stack.latest_materialization(names.next_generation)
        same = same_as_reference(spark, Placement(pipeline, root=storage.root), feed, want)
        backlog = f", its backlog {built['backlog_s']:.1f} s" if "backlog_s" in built else ", no backlog (kept)"
        figures[label] = (
            f"{time.perf_counter() - t:.1f} s to the new live phase (generation {swapped['from_generation']} -> "
            f"{swapped['generation']}{backlog}); results not fresh for {gap:.1f} s (the old live phase's stop -> "
            f"the new one's first micro-batch; the swap's commit {swapped['seconds_from_stop_to_swap']:.1f} s of it); "
            f"{batches} batches arrived meanwhile; equals reference: {same}"
        )
        _line(label, figures[label])
        if not same:
            raise SystemExit(f"after the {label}, the sink differs from the reference of its definition")
    return run, want


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--source",
        choices=["delta", "kafka", "kafka-avro", "kafka-protobuf"],
        default="delta",
        help="the input: a Delta table, a Kafka topic of JSON values, or of Avro or Protobuf values with a schema "
        "registry",
    )
    ap.add_argument("--rows", type=int, default=3_000_000, help="backlog records")
    ap.add_argument("--keys", type=int, default=1_000_000, help="distinct keys")
    ap.add_argument("--backlog-versions", type=int, default=12)
    ap.add_argument("--live-versions", type=int, default=3)
    ap.add_argument("--live-rows", type=int, default=50_000, help="records per live version")
    ap.add_argument("--root", default=".data/demo", help="wiped and rebuilt: Delta tables + Dagster instance")
    ap.add_argument("--port", type=int, default=None, help="webserver port (default: a free one)")
    ap.add_argument("--keep-ui", action="store_true", help="leave the Dagster UI running at the end (Ctrl-C stops)")
    ap.add_argument(
        "--redeploy",
        action="store_true",
        help="then deploy the pipeline's second revision beside the live one and swap it in (the redeploy job), "
        "then roll back; reports how long the live results were not fresh",
    )
    args = ap.parse_args()

    root = Path(args.root).resolve()
    shutil.rmtree(root, ignore_errors=True)
    data, home = root / "tables", root / "dagster_home"
    spark = build_session(SparkSettings())
    figures: dict[str, str] = {}
    if args.source.startswith("kafka"):
        t = time.perf_counter()
        broker = LocalKafka(root / "kafka", heap="512m").start()
        os.environ["PHASES_KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap_servers  # dagster dev serves DEMO_KAFKA
        _line("kafka broker", f"{broker.bootstrap_servers} (KRaft, started in {time.perf_counter() - t:.1f} s)")
        registry = None
        if args.source in ("kafka-avro", "kafka-protobuf"):
            t = time.perf_counter()
            registry = LocalRegistry(root / "registry").start()
            # The code location (dagster dev, started below) reads it when it builds DEMO_KAFKA_AVRO and its twin.
            os.environ["PHASES_SCHEMA_REGISTRY_URL"] = registry.url
            _line("schema registry", f"{registry.url} (Apicurio, started in {time.perf_counter() - t:.1f} s)")
        pipeline = DEMO_KAFKA
        if registry is not None:
            pipeline = registry_demo(
                DEMO_KAFKA_PROTOBUF if args.source == "kafka-protobuf" else DEMO_KAFKA_AVRO, registry.url
            )
        p = Placement(pipeline, root=str(data), brokers=broker.bootstrap_servers)
        feed = KafkaFeed(spark, p, broker, registry)
    else:
        pipeline = DEMO
        p = Placement(pipeline, root=str(data))
        feed = DeltaFeed(spark, p)
    names = Names(pipeline)

    t = time.perf_counter()
    feed.create()
    per_version = args.rows // args.backlog_versions
    for i in range(args.backlog_versions):
        feed.append(synthetic.event_batch(spark, rows=per_version, keys=args.keys, batch_index=i))
    figures["generate backlog"] = f"{time.perf_counter() - t:.1f} s ({per_version * args.backlog_versions:,} rows)"
    _line(
        "generated", f"{per_version * args.backlog_versions:,} rows in {args.backlog_versions} batches ({args.source})"
    )

    if args.source == "delta":
        daily_source(spark, data)
        _line("daily pipeline", f"{DEMO_DAILY.name}: one version on each of the last 3 days (backfill it from the UI)")

    if args.redeploy and args.source != "delta":
        raise SystemExit("--redeploy runs on the Delta demo (--source delta)")
    location = DeployedLocation(root / "code", "DEMO") if args.redeploy else None
    workspace = location.workspace if location is not None else None
    stack = DagsterStack(home, data, port=args.port, sensor_interval_s=2, workspace=workspace)
    loaded = stack.start()
    _line("dagster dev", f"{stack.url} (DAGSTER_HOME={home}; loaded in {loaded:.1f} s)")
    try:
        t = time.perf_counter()
        backlog_run = stack.launch(names.backlog_job)
        _line("launched", f"{names.backlog_job} run {backlog_run} over GraphQL")
        stack.wait_run(backlog_run, {"SUCCESS"}, timeout_s=3600)
        backlog_done = time.perf_counter()
        figures["backlog run"] = f"{backlog_done - t:.1f} s (Dagster run incl. its JVM start + 5 blocking checks)"
        meta = stack.latest_materialization(names.backlog)
        figures["backlog phase"] = (
            f"{meta['duration_s']:.1f} s ({meta['rows_per_s']:,.0f} rows/s; "
            + ", ".join(f"{k[len('timing_') :]} {v:.1f}" for k, v in meta.items() if k.startswith("timing_"))
            + ")"
        )
        _line(
            "materialized",
            f"{names.backlog}: V={meta['source_version']} keys={meta['keys']:,} input={meta['input_rows']:,} "
            f"late={meta['late_rows']:,} invalid={meta['invalid_rows']:,} "
            f"final watermark {_when(meta['final_watermark'])}",
        )
        checks = stack.check_results(backlog_run)
        _line("checks", ", ".join(f"{k} {'passed' if v else 'FAILED'}" for k, v in checks.items()))

        live = stack.wait_for_run_of(names.live_job, timeout_s=120)
        tags = {tag["key"]: tag["value"] for tag in live["tags"]}
        _line("sensor", f"{names.switch} launched {names.live_job} run {live['runId']} ({tags.get('dagster/run_key')})")
        stack.wait_for_message(live["runId"], "live phase running", timeout_s=1800)
        started = next(m for m in stack.observations(names.live_asset, 100) if m.get("event") == "started")
        figures["switch"] = (
            f"{time.perf_counter() - backlog_done:.1f} s (backlog run done -> sensor tick -> live run's first "
            f"checkpoint, {meta['keys']:,} keys; queries start -> checkpoint {started['start_s']:.1f} s)"
        )
        _line("live", "running; the state replay is checkpointed")

        t = time.perf_counter()
        for i in range(args.live_versions):
            batch = synthetic.event_batch(
                spark, rows=args.live_rows, keys=args.keys, batch_index=args.backlog_versions + i, seed=11
            )
            feed.append(batch)
        _line("appended", f"{args.live_versions} batches x {args.live_rows:,} rows while the live run runs")
        want = args.live_versions * args.live_rows + per_version * args.backlog_versions
        deadline = time.monotonic() + 1800
        got = None
        while time.monotonic() < deadline:  # every record either in the sink or quarantined
            got = spark.read.format("delta").load(p.consumer_sink).agg(F.sum("events")).collect()[0][0]
            quarantined = quarantine.count(spark, p.quarantine, p.name)
            if (got or 0) + quarantined == want:
                break
            time.sleep(2)
        changes = feed.changes()
        expected, expected_late = pandas_reference(changes, pipeline.delay_us)
        figures["live catch-up"] = (
            f"{time.perf_counter() - t:.1f} s ({args.live_versions * args.live_rows:,} rows appended -> in the sink; "
            "includes the pandas reference)"
        )
        reports = [m for m in stack.observations(names.live_asset, 100) if "rows_in_per_s" in m]
        if reports:
            last = reports[0]
            keys = ("lag_s", "lag_to_head_versions", "lag_to_head_records", "rows_processed_per_s", "applied_position")
            _line("live report", ", ".join(f"{k}={last[k]}" for k in keys if k in last))

        serving_run = live["runId"]
        if location is not None:  # the first revision's result, then a redeploy and a rollback while data arrives
            if not same_as_reference(spark, p, feed, want):
                raise SystemExit("the two-phase result differs from the reference before the redeploy")
            serving_run, want = redeploy_walkthrough(stack, spark, data, feed, location, args, want, figures)
            changes = feed.changes()
            expected, expected_late = pandas_reference(changes, pipeline.delay_us)
            got = accounted(spark, p)[0]

        t = time.perf_counter()
        stack.terminate(serving_run)
        status = stack.wait_run(serving_run, {"CANCELED", "SUCCESS"}, timeout_s=300)
        _line("terminated", f"live run {status.lower()} in {time.perf_counter() - t:.1f} s (queries stopped)")

        actual = spark.read.format("delta").load(p.consumer_sink).toPandas().set_index("key").sort_index()
        late = spark.read.format("delta").load(p.quarantine).filter(F.col("reason").startswith("late")).count()
        same = (
            got == int(expected["events"].sum())
            and actual.index.equals(expected.index)
            and all((actual[c] == expected[c]).all() for c in ["events", "total", "smallest", "largest", "checksum"])
            and np.allclose(actual["mean"], expected["mean"])
            and late == expected_late
        )
        shot: Path | str = root / "asset_graph.png"
        try:  # the pipeline's group: its tables and the live phase, in a real (headless) browser
            screenshot(
                f"{stack.url}/locations/{LOCATION}/asset-groups/{names.group}",
                shot,
                wait_for=(names.source, names.backlog, names.sink, names.live_asset),
            )
        except (BrowserError, OSError) as exc:
            shot = f"not taken ({exc})"

        print("\n=== two-phase demo through Dagster ===")
        for k, v in figures.items():
            _line(k, v)
        _line("rows", f"source {len(changes):,}, sink keys {len(actual):,}, late quarantined {late:,}")
        _line("equals reference", str(same))
        _line("asset graph", str(shot))
        if args.keep_ui:
            print(f"Dagster UI at {stack.url} (Ctrl-C to stop)", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    finally:
        stack.stop()
        spark.stop()
        feed.stop()
    if not same:
        raise SystemExit("the two-phase result differs from the reference")


if __name__ == "__main__":
    main()
