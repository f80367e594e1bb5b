"""The backlog phase: a bounded, blocking Spark batch job over the source snapshot at version V.

Records are validated, tagged late by the version watermark (:mod:`phases.lateness`), repartitioned by
key and sorted by key and event time, lifted into aggregation buffers and merged per key. No streaming
checkpoint is taken (FLIP-327 with ``checkpoint_interval_during_backlog == 0``). Writes, in order:

1. the per-key state to a fresh Delta table ``state/<manifest_id>`` (one commit);
2. the results to the sink (overwrite: a re-run replaces, never duplicates);
3. the quarantined records (replacing this pipeline's earlier backlog rows);
4. last, the handoff manifest (one atomic Delta append).

A crash before step 4 leaves no manifest; the live phase cannot start, and a re-run starts over
idempotently. An orphaned ``state/<id>`` table of a crashed run is never referenced.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from pathlib import PurePosixPath

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from phases import fs, lateness, manifest, quarantine, tables
from phases.definition import OPERATOR_VERSION, STATE_SCHEMA_VERSION, Pipeline
from phases.delta_source import DeltaTableSource
from phases.errors import ManifestError, PhaseStateError, SourceError
from phases.keyed_aggregate import ROWS, KeyedAggregationLogic
from phases.records import split_invalid


def live_checkpoint_root(pipeline: Pipeline, run_name: str) -> str:
    return str(PurePosixPath(pipeline.locations.checkpoints) / run_name)


def live_started(spark: SparkSession, pipeline: Pipeline, manifest_id: str) -> bool:
    """True once the live phase of ``manifest_id`` has committed its first checkpoint."""
    return fs.exists(spark, f"{live_checkpoint_root(pipeline, manifest_id)}/aggregate/commits/0")


class BacklogRunner:
    def __init__(self, spark: SparkSession, pipeline: Pipeline):
        self.spark = spark
        self.pipeline = pipeline
        self.source = DeltaTableSource(spark, pipeline.source)
        self.timings: dict[str, float] = {}

    def _refuse_after_switch(self, reset: bool) -> None:
        p = self.pipeline
        try:
            current = manifest.latest(self.spark, p.locations.manifests, p.name)
        except ManifestError:
            return
        if not live_started(self.spark, p, current.manifest_id):
            return
        if not reset:
            raise PhaseStateError(
                f"pipeline {p.name!r} already switched to live from manifest {current.manifest_id} "
                f"(checkpoint {live_checkpoint_root(p, current.manifest_id)}); running the backlog again "
                "would rewrite the sink under a running live phase. Stop the live phase and pass reset=True "
                "to start over from a new backlog."
            )
        if tables.exists(self.spark, p.locations.quarantine):
            self.spark.sql(
                f"DELETE FROM delta.`{p.locations.quarantine}` WHERE pipeline = '{p.name}' AND phase = 'live'"
            )

    def run(self, end_version: int | None = None, *, reset: bool = False) -> manifest.HandoffManifest:
        """Runs the backlog over versions 0..end_version (default: the head now) and hands off."""
        p = self.pipeline
        if p.checkpoint_interval_during_backlog != timedelta(0):
            raise PhaseStateError(
                f"checkpoint_interval_during_backlog = {p.checkpoint_interval_during_backlog.total_seconds()}s "
                "asks for a checkpointed (stream-mode) backlog; this runner implements the batch backlog "
                "(checkpoint_interval_during_backlog = 0). Set it to 0, or run the pipeline with the live "
                "runner from the first version (LiveRunner.streaming_only)."
            )
        started = time.perf_counter()
        self._refuse_after_switch(reset)
        head = self.source.head_version()
        v = head if end_version is None else end_version
        if not 0 <= v <= head:
            raise SourceError(f"end_version {end_version} is outside the source's versions 0..{head}")
        logic = KeyedAggregationLogic(p, self.source.schema())
        manifest_id = uuid.uuid4().hex
        state_path = str(PurePosixPath(p.locations.state_root) / manifest_id)

        changes = self.source.read_backlog(v)
        valid, invalid = split_invalid(changes, p)

        t = time.perf_counter()
        maxima = lateness.version_maxima(valid, p.event_time)
        marks, max_us = lateness.version_watermarks(maxima, None, p.delay_us)
        on_time, late = lateness.split_late(self.spark, valid, marks, p.event_time)
        self.timings["watermarks_s"] = time.perf_counter() - t

        t = time.perf_counter()
        state = logic.merge(logic.lift(sorted_backlog_input(self.spark, p, on_time)))
        state.write.format("delta").mode("errorifexists").save(state_path)
        self.timings["state_s"] = time.perf_counter() - t

        t = time.perf_counter()
        state_table = self.spark.read.format("delta").load(state_path)
        stats = state_table.agg(F.count(F.lit(1)).alias("keys"), F.sum(ROWS).alias("rows")).collect()[0]
        logic.finalize(state_table).write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(
            p.sink.path
        )
        self.timings["sink_s"] = time.perf_counter() - t

        t = time.perf_counter()
        q_rows = quarantine.invalid_and_late(
            invalid, late, pipeline=p.name, phase="backlog", event_time=p.event_time, batch_id=None
        )
        quarantine.replace_backlog(self.spark, p.locations.quarantine, p.name, q_rows)
        q_stats = (
            self.spark.read.format("delta")
            .load(p.locations.quarantine)
            .filter((F.col("pipeline") == p.name) & (F.col("phase") == "backlog"))
            .agg(
                F.count(F.lit(1)).alias("all"),
                F.count(F.when(F.col("reason") == quarantine.LATE_REASON, 1)).alias("late"),
            )
            .collect()[0]
        )
        self.timings["quarantine_s"] = time.perf_counter() - t

        aggregated = int(stats["rows"] or 0)
        handoff = manifest.HandoffManifest(
            manifest_id=manifest_id,
            pipeline=p.name,
            fingerprint=p.fingerprint(),
            state_spec=json.dumps(p.state_spec(), sort_keys=True),
            state_schema_version=STATE_SCHEMA_VERSION,
            operator_version=OPERATOR_VERSION,
            source_path=p.source.path,
            source_version=v,
            backlog_max_event_time_us=max_us,
            final_watermark_us=None if max_us is None else max_us - p.delay_us,
            state_path=state_path,
            state_table_version=tables.version(self.spark, state_path),
            state_rows=int(stats["keys"]),
            input_rows=aggregated + int(q_stats["all"]),
            aggregated_rows=aggregated,
            late_rows=int(q_stats["late"]),
            invalid_rows=int(q_stats["all"]) - int(q_stats["late"]),
            sink_version=tables.version(self.spark, p.sink.path),
            backlog_seconds=time.perf_counter() - started,
            created_at_us=time.time_ns() // 1000,
        )
        manifest.write(self.spark, p.locations.manifests, handoff)
        self.timings["total_s"] = time.perf_counter() - started
        return handoff


def sorted_backlog_input(spark: SparkSession, pipeline: Pipeline, on_time: DataFrame) -> DataFrame:
    """The backlog's input layout: hash-partitioned by key, sorted by key then event time."""
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    return on_time.repartition(partitions, *pipeline.key_columns).sortWithinPartitions(
        *pipeline.key_columns, pipeline.event_time
    )
