"""Deterministic lateness, defined by arrival order of source versions.

Arrival order is the source's commit order. The watermark in force while the records of version ``v``
are processed is::

    W(v) = max(event time of every valid record in versions < v) - watermark_delay

(undefined, i.e. nothing is late, before the first valid record). A record of version ``v`` is **late**
iff its event time ``<= W(v)``; late records are quarantined with the reason and the watermark, never
aggregated and never silently dropped. "Valid" means the record passed validation (non-null key and
event time, an insert); late records are valid, but being older than ``W(v)`` they can never raise the
maximum.

The definition does not depend on how versions are grouped: the backlog sees versions 0..V in one batch
job, the live phase sees V+1.. in micro-batches of any size, a single streaming job sees them one by one,
and all three tag exactly the same records. ``W(V+1)`` is the *final backlog watermark* handed to the
live phase. The rule matches Spark's (``ts <= watermark`` is late), so Spark's own per-micro-batch
watermark, which never exceeds ``W(v)``, drops nothing that this rule lets through.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

VERSION = "_commit_version"
WATERMARK_US = "_watermark_us"


def watermark_after(max_us: int | None, delay_us: int) -> int | None:
    """The watermark once records up to the event time ``max_us`` (µs) were seen: ``max_us - delay_us``; None
    (nothing is late yet) before the first valid record."""
    return None if max_us is None else max_us - delay_us


def version_maxima(valid: DataFrame, event_time: str) -> list[tuple[int, int]]:
    """(version, max event time in microseconds) for each version present in ``valid``, in order."""
    rows = valid.groupBy(VERSION).agg(F.max(F.unix_micros(F.col(event_time))).alias("m")).orderBy(VERSION).collect()
    return [(int(r[VERSION]), int(r["m"])) for r in rows if r["m"] is not None]


@dataclass(frozen=True)
class VersionStats:
    """What one pass over a range of change-feed rows tells about each version: the max and min event time
    of its valid records (None when it has none) and how many of its rows are invalid."""

    version: int
    max_us: int | None
    min_us: int | None
    invalid: int


def version_stats(changes: DataFrame, valid: Column, event_time: str) -> list[VersionStats]:
    """Per-version statistics of ``changes`` in one aggregation (``valid`` marks the valid rows), in order.

    The maxima give the version watermarks; the minima and invalid counts tell which versions can hold a
    late or an invalid record at all, so the quarantine pass reads only those (none, usually)."""
    us = F.unix_micros(F.col(event_time))
    rows = (
        changes.groupBy(VERSION)
        .agg(
            F.max(F.when(valid, us)).alias("max"),
            F.min(F.when(valid, us)).alias("min"),
            F.count(F.when(~valid, 1)).alias("invalid"),
        )
        .collect()  # one row per version: ordered here, not by another shuffle
    )
    return sorted(
        (
            VersionStats(int(r[VERSION]), None if r["max"] is None else int(r["max"]), r["min"], int(r["invalid"]))
            for r in rows
        ),
        key=lambda s: s.version,
    )


def late_candidates(stats: list[VersionStats], marks: dict[int, int]) -> list[int]:
    """Versions whose earliest valid record is at or before their watermark: only they hold late records."""
    return [s.version for s in stats if s.min_us is not None and s.version in marks and s.min_us <= marks[s.version]]


def version_watermarks(
    maxima: list[tuple[int, int]], prior_max_us: int | None, delay_us: int
) -> tuple[dict[int, int], int | None]:
    """W(v) for every version in ``maxima`` given the max event time of all earlier versions.

    Returns the watermarks (versions with no watermark yet are absent) and the new running maximum.
    """
    running = prior_max_us
    marks: dict[int, int] = {}
    for version, max_us in sorted(maxima):
        if running is not None:
            marks[version] = watermark_after(running, delay_us)  # pyright: ignore[reportArgumentType]
        running = max_us if running is None else max(running, max_us)
    return marks, running


def split_late(
    spark: SparkSession, valid: DataFrame, marks: dict[int, int], event_time: str
) -> tuple[DataFrame, DataFrame]:
    """(on-time records, late records), both with ``_watermark_us`` = W(v) of their version (null before
    the first watermark), of ``valid`` under ``marks``."""
    tagged = with_watermarks(spark, valid, marks)
    late_cond = F.col(WATERMARK_US).isNotNull() & (F.unix_micros(F.col(event_time)) <= F.col(WATERMARK_US))
    on_time = tagged.filter(~late_cond)
    late = tagged.filter(late_cond)
    return on_time, late


MARKS_AS_EXPRESSION = 64  # up to this many versions, W(v) is a CASE expression, not a broadcast join


def with_watermarks(spark: SparkSession, rows: DataFrame, marks: dict[int, int]) -> DataFrame:
    """``rows`` with ``_watermark_us`` = W(v) of their version (null before the first watermark). A few versions
    (a live micro-batch's): a CASE over the version, no join and no job to broadcast; more: a broadcast join."""
    if len(marks) <= MARKS_AS_EXPRESSION:
        mark: Column = F.lit(None).cast("long")
        if marks:
            branches = sorted(marks.items())
            mark = F.when(F.col(VERSION) == F.lit(branches[0][0]), F.lit(branches[0][1]))
            for version, us in branches[1:]:
                mark = mark.when(F.col(VERSION) == F.lit(version), F.lit(us))
        return rows.withColumn(WATERMARK_US, mark.cast("long"))
    schema = T.StructType(
        [T.StructField(VERSION, T.LongType(), False), T.StructField(WATERMARK_US, T.LongType(), False)]
    )
    table = spark.createDataFrame(sorted(marks.items()), schema)
    joined = rows.join(F.broadcast(table), on=VERSION, how="left")
    return joined.select(*[F.col(f"`{c}`") for c in rows.columns], WATERMARK_US)  # the columns as above
