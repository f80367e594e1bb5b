"""Daily slices of the backlog, for partitioned, scheduled backfills.

A slice is the set of source versions **committed** on one UTC day (the first slice also takes every
version committed before it), so slices are disjoint, cover the source without gaps, and never change
once their day is over (the source is append-only). Each slice's run writes, idempotently:

1. its quarantine rows (``replaceWhere`` on its version range);
2. its partial per-key state (``replaceWhere`` on its slice id in the ``slices`` table);
3. last, a row in the slice log: the "finished" mark.

A crash before 3 leaves the slice unfinished; running it again replaces 1 and 2. Re-running a range of
slices skips the finished ones (``run_range``), like Flink's batch job recovery (FLIP-383) re-executes
only unfinished vertices. :meth:`SliceRunner.combine` merges the finished slices of versions 0..V (the
aggregations are monoids) into the handoff state and writes the manifest, as a whole backlog run would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pydantic import BaseModel, ConfigDict
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import spark_internals
from phases._internal.backlog import progress, refusals
from phases._internal.backlog.partials import version_range_partial
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Pipeline
from phases._internal.errors import PhaseStateError
from phases._internal.handoff.manifest import HandoffManifest
from phases._internal.placement import Placement
from phases._internal.records import split_invalid
from phases._internal.storage import fs, quarantine, tables

SLICE = "_slice"

LOG_SCHEMA = T.StructType(
    [
        T.StructField("pipeline", T.StringType(), False),
        T.StructField("fingerprint", T.StringType(), False),
        T.StructField("slice", T.StringType(), False),
        T.StructField("first_version", T.LongType(), True),
        T.StructField("last_version", T.LongType(), True),
        T.StructField("keys", T.LongType(), False),
        T.StructField("aggregated_rows", T.LongType(), False),
        T.StructField("quarantined_rows", T.LongType(), False),
        T.StructField("max_event_time_us", T.LongType(), True),
        T.StructField("seconds", T.DoubleType(), False),
        T.StructField("created_at_us", T.LongType(), False),
    ]
)


class SliceRecord(BaseModel):
    """A finished slice (one row of the slice log)."""

    model_config = ConfigDict(frozen=True)

    pipeline: str
    fingerprint: str
    slice: str
    first_version: int | None  # None: no version was committed that day
    last_version: int | None
    keys: int
    aggregated_rows: int
    quarantined_rows: int
    max_event_time_us: int | None
    seconds: float
    created_at_us: int


@dataclass(frozen=True)
class RangeResult:
    executed: list[str]
    recovered: list[str]  # finished by an earlier run, not executed again
    records: dict[str, SliceRecord]


def day_id(day: date) -> str:
    return day.isoformat()


class SliceRunner:
    def __init__(self, spark: SparkSession, pipeline: Pipeline, start_date: date, *, take_over: bool = False):
        """``take_over``: take the backlog lease over from a run whose process is gone (see
        :mod:`phases._internal.coordination.leases`). The definition runs as declared, as the generation that serves
        it; a pipeline placed elsewhere: :meth:`at`."""
        self._start(spark, BacklogRunner(spark, pipeline, take_over=take_over), start_date)

    @classmethod
    def at(cls, spark: SparkSession, where: Placement, start_date: date, *, take_over: bool = False) -> SliceRunner:
        """The slices of ``where.definition`` where ``where`` places it."""
        runner = cls.__new__(cls)
        runner._start(spark, BacklogRunner.at(spark, where, take_over=take_over), start_date)
        return runner

    def _start(self, spark: SparkSession, backlog: BacklogRunner, start_date: date) -> None:
        self.spark = spark
        self.backlog = backlog
        self.placement = backlog.placement  # the generation that serves
        self.pipeline = backlog.pipeline
        self.start_date = start_date
        self.partials_path = self.placement.slices("partials")
        self.log_path = self.placement.slices("log")

    # --- which versions a day holds ----------------------------------------------------------------
    def day_versions(self, day: date, commit_times: list[tuple[int, datetime]] | None = None) -> tuple[int, int] | None:
        """(first, last) version committed on ``day`` (UTC); the first day also takes earlier versions."""
        if day < self.start_date:
            raise PhaseStateError(f"slice {day} is before the pipeline's first slice {self.start_date}")
        begin = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
        end = begin + timedelta(days=1)
        times = commit_times if commit_times is not None else self.backlog.source.commit_times()
        versions = [v for v, at in times if at < end and (day == self.start_date or at >= begin)]
        return (min(versions), max(versions)) if versions else None

    # --- the slice log -------------------------------------------------------------------------------
    def finished(self) -> dict[str, SliceRecord]:
        """The latest log row of each finished slice made by this pipeline definition."""
        if not tables.exists(self.spark, self.log_path):
            return {}
        rows = (
            self.spark.read.format("delta")
            .load(self.log_path)
            .filter((F.col("pipeline") == self.pipeline.name) & F.col("fingerprint").isin(*self.placement.fingerprints))
            .collect()
        )
        out: dict[str, SliceRecord] = {}
        for r in sorted(rows, key=lambda r: r["created_at_us"]):
            out[r["slice"]] = SliceRecord(**r.asDict())
        return out

    # --- running -------------------------------------------------------------------------------------
    def run_slice(
        self,
        day: date,
        *,
        now: datetime | None = None,
        commit_times: list[tuple[int, datetime]] | None = None,
    ) -> SliceRecord:
        """Computes and commits the slice of ``day`` (which must be over), replacing any earlier attempt."""
        with self.backlog.lease():
            return self._run_slice(day, now, commit_times)

    def _run_slice(
        self, day: date, now: datetime | None, commit_times: list[tuple[int, datetime]] | None
    ) -> SliceRecord:
        now = now or datetime.now(UTC)
        end = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(days=1)
        if now < end:
            raise PhaseStateError(
                f"slice {day} of pipeline {self.pipeline.name!r} is not over until {end.isoformat()}; "
                "a slice runs once its day has ended, so that it never changes afterwards"
            )
        self.backlog.refuse_after_switch(reset=False)
        refusals.refuse_pieces(self.pipeline, self.backlog.kind, "a daily slice")
        started = time.perf_counter()
        p, spark = self.pipeline, self.spark
        logic = self.backlog.logic()
        pieces = self.backlog.kind.pieces(logic)
        versions = self.day_versions(day, commit_times)
        sid = day_id(day)
        keys = rows = quarantined = 0
        range_max: int | None = None
        schema = T.StructType([T.StructField(SLICE, T.StringType()), *pieces.schema.fields])
        tables.ensure(spark, self.partials_path, schema)
        if versions is None:
            empty = spark_internals.empty_frame(spark, schema)
            self._replace_partial(empty, sid)
        else:
            with progress.step(spark, p.name, "backlog", f"slice {sid}"):
                part = version_range_partial(
                    spark, self.placement, self.backlog.source, pieces, versions, self._prior_max(versions[0])
                )
                q = part.quarantine.persist()
                try:
                    quarantined = q.count()
                    quarantine.replace_backlog(spark, self.placement.quarantine, p.name, q, versions, rows=quarantined)
                finally:
                    q.unpersist()
                self._replace_partial(part.buffers.select(F.lit(sid).alias(SLICE), *part.buffers.columns), sid)
            stats = (
                spark.read.format("delta")
                .load(self.partials_path)
                .filter(F.col(SLICE) == sid)
                .agg(F.count(F.lit(1)).alias("keys"), pieces.rows.alias("rows"))
                .collect()[0]
            )
            keys, rows, range_max = int(stats["keys"]), int(stats["rows"] or 0), part.range_max_us
        record = SliceRecord(
            pipeline=p.name,
            fingerprint=p.fingerprint(),
            slice=sid,
            first_version=versions[0] if versions else None,
            last_version=versions[1] if versions else None,
            keys=keys,
            aggregated_rows=rows,
            quarantined_rows=quarantined,
            max_event_time_us=range_max,
            seconds=time.perf_counter() - started,
            created_at_us=time.time_ns() // 1000,
        )
        tables.append_row(spark, self.log_path, LOG_SCHEMA, record.model_dump())
        return record

    def run_range(self, days: list[date], *, now: datetime | None = None, on_done=None) -> RangeResult:
        """Runs the slices of ``days`` that are not finished yet; ``on_done(record)`` after each one."""
        with self.backlog.lease():
            return self._run_range(days, now, on_done)

    def _run_range(self, days: list[date], now: datetime | None, on_done) -> RangeResult:
        done = self.finished()
        times = self.backlog.source.commit_times()
        executed, recovered = [], []
        for day in sorted(days):
            sid = day_id(day)
            prior = done.get(sid)
            versions = self.day_versions(day, times)
            if prior is not None and (prior.first_version, prior.last_version) == (versions or (None, None)):
                recovered.append(sid)
                continue
            done[sid] = self.run_slice(day, now=now, commit_times=times)
            executed.append(sid)
            if on_done is not None:
                on_done(done[sid])
        return RangeResult(executed, recovered, {d: done[d] for d in [*executed, *recovered]})

    def _replace_partial(self, df, sid: str) -> None:
        fs.sweep_orphan_checksums(self.partials_path)
        df.write.format("delta").mode("overwrite").option("replaceWhere", f"{SLICE} = '{sid}'").save(self.partials_path)

    def _prior_max(self, first_version: int) -> int | None:
        """Max event time of the valid records committed before ``first_version`` (continues W(v))."""
        if first_version == 0:
            return None
        valid, _ = split_invalid(self.backlog.source.read_backlog(first_version - 1, 0), self.pipeline)
        row = valid.agg(F.max(F.unix_micros(F.col(self.pipeline.event_time))).alias("m")).collect()[0]
        return None if row["m"] is None else int(row["m"])

    # --- combining -----------------------------------------------------------------------------------
    def combine(self) -> HandoffManifest:
        """Merges the finished slices covering versions 0..V without a gap into the handoff state."""
        with self.backlog.lease():
            return self._combine()

    def _combine(self) -> HandoffManifest:
        self.backlog.refuse_after_switch(reset=False)
        started = time.perf_counter()
        done = self.finished()
        chain = sorted((r for r in done.values() if r.first_version is not None), key=lambda r: r.first_version)  # pyright: ignore[reportArgumentType,reportCallIssue]
        if not chain:
            raise PhaseStateError(
                f"pipeline {self.pipeline.name!r} has no finished slice holding source versions; "
                "materialize the backlog slices first"
            )
        expected = 0
        for r in chain:
            if r.first_version != expected:
                missing = f"versions {expected}..{r.first_version - 1}" if r.first_version > expected else "overlap"
                raise PhaseStateError(
                    f"the finished slices of pipeline {self.pipeline.name!r} do not cover the source without a gap "
                    f"before slice {r.slice} (first version {r.first_version}): {missing}; "
                    f"finished slices: {sorted(done)}. Run the missing days' slices first."
                )
            expected = r.last_version + 1
        version = chain[-1].last_version
        ids = [r.slice for r in chain]
        logic = self.backlog.logic()
        partials = self.spark.read.format("delta").load(self.partials_path).filter(F.col(SLICE).isin(ids)).drop(SLICE)
        maxima = [r.max_event_time_us for r in chain if r.max_event_time_us is not None]
        return self.backlog.hand_off(
            self.backlog.kind.pieces(logic).merge(partials),
            logic,
            version,
            max(maxima, default=None),
            started=started,
            kind="slices",
        )
