"""End-of-stream steps (FLIP-331 "full dam"): blocking batch steps over the backlog, run before the stream
operator, and the enrichment join that lets both phases use their output.

A step reads every valid record of source versions 0..V (late ones too: lateness is an event-time notion
of the stream operator, a full-dam step sees its whole bounded input), runs its full-partition operators
and overwrites its output table; a row in the step log records the version it ran at. The live phase
starts only after every step its enrichment uses finished at the handoff's version.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.definition import EndOfStreamStep
from phases._internal.errors import DefinitionError, PhaseStateError
from phases._internal.placement import Placement
from phases._internal.records import split_invalid
from phases._internal.sources.reader import open_source
from phases._internal.steps.partition_ops import apply_record_steps, run_end_of_stream_step
from phases._internal.storage import fs, tables

LOG_SCHEMA = T.StructType(
    [
        T.StructField("pipeline", T.StringType(), False),
        T.StructField("fingerprint", T.StringType(), False),
        T.StructField("step", T.StringType(), False),
        T.StructField("source_version", T.LongType(), False),
        T.StructField("rows", T.LongType(), False),
        T.StructField("output_version", T.LongType(), False),
        T.StructField("seconds", T.DoubleType(), False),
        T.StructField("created_at_us", T.LongType(), False),
    ]
)


class StepRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    pipeline: str
    fingerprint: str
    step: str
    source_version: int
    rows: int
    output_version: int
    seconds: float
    created_at_us: int


class EndOfStreamRunner:
    def __init__(self, spark: SparkSession, where: Placement):
        self.spark = spark
        self.placement = where
        self.pipeline = where.definition
        self.source = open_source(spark, where.definition.source, where)

    def run_all(self, version: int) -> list[StepRecord]:
        return [self.run(step, version) for step in self.pipeline.end_of_stream]

    def run(self, step: EndOfStreamStep, version: int) -> StepRecord:
        """Runs ``step`` over the valid records of versions 0..``version`` and overwrites its output."""
        started = time.perf_counter()
        valid, _ = split_invalid(self.source.read_backlog(version), self.pipeline)
        records = valid.select(*[c for c in valid.columns if not c.startswith("_")])
        out = run_end_of_stream_step(records, step)
        path = self.placement.end_of_stream_output(step)
        fs.sweep_orphan_checksums(path)
        out.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
        output = self.spark.read.format("delta").load(path)
        enrich = self.pipeline.enrich
        if enrich is not None and enrich.step == step.name:
            dupes = output.groupBy(*enrich.on).count().filter(F.col("count") > 1).limit(5).collect()
            if dupes:
                sample = [tuple(r[c] for c in enrich.on) for r in dupes]
                raise PhaseStateError(
                    f"end-of-stream step {step.name!r}: its output has more than one row for enrich.on "
                    f"{enrich.on} values {sample}; an enrichment lookup needs one row per value"
                )
        record = StepRecord(
            pipeline=self.pipeline.name,
            fingerprint=self.pipeline.fingerprint(),
            step=step.name,
            source_version=version,
            rows=output.count(),
            output_version=tables.version(self.spark, path),
            seconds=time.perf_counter() - started,
            created_at_us=time.time_ns() // 1000,
        )
        tables.append_row(self.spark, self.placement.end_of_stream_log, LOG_SCHEMA, record.model_dump())
        return record

    def latest(self, step: str, fingerprint: str | None = None) -> StepRecord | None:
        """The newest record of ``step`` made under ``fingerprint`` (default: the pipeline's, declared or as the
        engine took it before placements, :meth:`Placement.fingerprints`)."""
        path = self.placement.end_of_stream_log
        if not tables.exists(self.spark, path):
            return None
        rows = (
            self.spark.read.format("delta")
            .load(path)
            .filter(
                (F.col("pipeline") == self.pipeline.name)
                & (F.col("fingerprint").isin(*([fingerprint] if fingerprint else self.placement.fingerprints)))
                & (F.col("step") == step)
            )
            .orderBy(F.col("created_at_us").desc())
            .limit(1)
            .collect()
        )
        return StepRecord(**rows[0].asDict()) if rows else None

    def require_finished(self, version: int, fingerprint: str | None = None) -> None:
        """Raises PhaseStateError unless the enrichment's step finished at ``version`` (and its output is
        still the table version it wrote). ``fingerprint``: the handoff's, when the pipeline's definition is an
        amendment of it."""
        enrich = self.pipeline.enrich
        if enrich is None:
            return
        step = next(s for s in self.pipeline.end_of_stream if s.name == enrich.step)
        record = self.latest(step.name, fingerprint)
        if record is None or record.source_version != version:
            at = "never ran" if record is None else f"last finished at source version {record.source_version}"
            raise PhaseStateError(
                f"end-of-stream step {step.name!r} of pipeline {self.pipeline.name!r} {at}; the live phase "
                f"enriches with its output and starts only after it finished at the handoff's version {version}"
            )
        path = self.placement.end_of_stream_output(step)
        current = tables.version(self.spark, path) if tables.exists(self.spark, path) else -1
        if current != record.output_version:
            raise PhaseStateError(
                f"end-of-stream step {step.name!r}: its output {path} is at table version {current}, "
                f"not the version {record.output_version} the step wrote; run the backlog again"
            )


def prepare(df: DataFrame, where: Placement, spark: SparkSession, exempt: Column | None = None) -> DataFrame:
    """The enrichment join, then the record steps: what the stream operator sees, in both phases
    (``exempt``: see :func:`phases._internal.steps.partition_ops.apply_record_steps`)."""
    pipeline = where.definition
    enrich = pipeline.enrich
    if enrich is not None:
        step = next(s for s in pipeline.end_of_stream if s.name == enrich.step)
        table = spark.read.format("delta").load(where.end_of_stream_output(step))
        missing = sorted((set(enrich.on) | set(enrich.columns)) - set(table.columns))
        if missing:
            raise DefinitionError(
                f"enrich: columns {missing} are not in the output of step {step.name!r}; its columns: {table.columns}"
            )
        missing = sorted(set(enrich.on) - set(df.columns))
        if missing:
            raise DefinitionError(f"enrich.on {missing} are not columns of the records; columns: {df.columns}")
        lookup = table.select(*enrich.on, *enrich.columns)
        df = df.join(F.broadcast(lookup), on=enrich.on, how="left")
    return apply_record_steps(df, pipeline.steps, exempt)


def prepared_schema(spark: SparkSession, where: Placement, source_schema: T.StructType) -> T.StructType:
    return prepare(spark_internals.empty_frame(spark, source_schema), where, spark).schema
