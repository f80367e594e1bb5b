"""Lateness tagging, shared by both phases: change-feed rows of complete versions validated and tagged with the
version watermark W(v) (the rule: :mod:`phases._internal.lateness`), on-time records prepared as the operator sees them,
the others turned into quarantine rows with their reason. The backlog, catch-up increments, daily slices and
every live micro-batch tag through :func:`tag_changes`; a backlog range whose source log proves every record on
time skips the statistics scan (:func:`tag_version_range`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from phases._internal import spark_internals
from phases._internal.lateness import (
    VERSION,
    late_candidates,
    split_late,
    version_stats,
    version_watermarks,
    with_watermarks,
)
from phases._internal.placement import Placement
from phases._internal.records import REASON, with_reason
from phases._internal.sources import version_bounds
from phases._internal.sources.reader import SourceReader
from phases._internal.steps.end_of_stream import prepare
from phases._internal.storage import quarantine


@dataclass(frozen=True)
class TaggedRange:
    """Versions lo..hi validated and tagged: on-time records as the operator sees them (with their
    version and its watermark W(v)), quarantine rows, event-time maxima, and whether there is anything
    on time or to quarantine at all (from the per-version statistics, without another pass)."""

    prepared: DataFrame
    quarantine: DataFrame
    range_max_us: int | None
    running_max_us: int | None
    has_on_time: bool = True
    has_quarantine: bool = True
    from_log: bool = False  # tagged without the statistics scan: the source's log proved every record on time


def tag_version_range(
    spark: SparkSession,
    where: Placement,
    source: SourceReader,
    versions: tuple[int, int],
    prior_max_us: int | None,
    timings: dict[str, float] | None = None,
    *,
    per_record_watermarks: bool = True,
) -> TaggedRange:
    """Versions lo..hi of ``source`` validated and tagged. An operator that needs no per-record W(v)
    (``per_record_watermarks=False``: the aggregation kinds) skips the statistics scan when the source's log
    proves that no record of the range is late or invalid (:mod:`phases._internal.sources.version_bounds`)."""
    lo, hi = versions
    if not per_record_watermarks:
        t = time.perf_counter()
        proved = _tag_proved_on_time(spark, where, source, versions, prior_max_us)
        if timings is not None:
            timings["watermarks_s"] = timings.get("watermarks_s", 0.0) + time.perf_counter() - t
        if proved is not None:
            return proved
    try:
        return tag_changes(spark, where, source.read_backlog(hi, lo), prior_max_us, timings, phase="backlog")
    except Exception as exc:  # the first action on the change feed: a vacuumed version fails here
        error = source.missing_file_error(exc, versions)
        if error is not None:
            raise error from exc
        raise


def tag_changes(
    spark: SparkSession,
    where: Placement,
    changes: DataFrame,
    prior_max_us: int | None,
    timings: dict[str, float] | None = None,
    *,
    phase: str,
    batch_id: int | None = None,
) -> TaggedRange:
    """Validates and tags change-feed rows of *complete* versions under the version watermark W(v),
    continuing from ``prior_max_us`` (the max valid event time of every earlier version). The backlog,
    catch-up increments, slices and every live micro-batch tag through here."""
    pipeline = where.definition
    timings = {} if timings is None else timings
    tagged = with_reason(changes, pipeline)
    is_valid = F.col(REASON).isNull()
    valid, invalid = tagged.filter(is_valid).drop(REASON), tagged.filter(~is_valid)
    t = time.perf_counter()
    stats = version_stats(tagged, is_valid, pipeline.event_time)
    maxima = [(s.version, s.max_us) for s in stats if s.max_us is not None]
    marks, running = version_watermarks(maxima, prior_max_us, pipeline.delay_us)
    if pipeline.reads_changes:  # a change corrects the upstream's current table: never late
        marks = {}
    on_time, late = split_late(spark, valid, marks, pipeline.event_time)
    timings["watermarks_s"] = timings.get("watermarks_s", 0.0) + time.perf_counter() - t
    # The quarantine reads only the versions that can hold such rows (a literal false prunes the scan).
    late_versions = late_candidates(stats, marks)
    invalid_versions = [s.version for s in stats if s.invalid]
    if late_versions or invalid_versions:
        late = late.filter(_in_versions(late_versions))
        # Invalid rows carry the watermark in force for their version too.
        invalid = with_watermarks(spark, invalid.filter(_in_versions(invalid_versions)), marks)
        q_rows = quarantine.invalid_and_late(
            invalid, late, pipeline=pipeline.name, phase=phase, event_time=pipeline.event_time, batch_id=batch_id
        )
    else:  # nothing to quarantine (the statistics say so): no rows to build
        q_rows = spark_internals.empty_frame(spark, quarantine.SCHEMA)
    range_max = max((m for _, m in maxima), default=None)
    # A version holds an on-time record iff its greatest valid event time is above its watermark.
    has_on_time = any(s.max_us is not None and (s.version not in marks or s.max_us > marks[s.version]) for s in stats)
    return TaggedRange(
        prepare(on_time, where, spark),
        q_rows,
        range_max,
        running,
        has_on_time=has_on_time,
        has_quarantine=bool(late_versions or invalid_versions),
    )


def _tag_proved_on_time(
    spark: SparkSession, where: Placement, source: SourceReader, versions: tuple[int, int], prior_max_us: int | None
) -> TaggedRange | None:
    """The range tagged without the statistics scan, or None when the log cannot prove every record on time
    and valid. The records then carry no ``_watermark_us``; the exact maximum event time (the watermark the
    handoff carries) is read from the rows at the top millisecond of the versions that can hold it."""
    pipeline = where.definition
    log_bounds = getattr(source, "log_bounds", None)
    if log_bounds is None:
        return None
    lo, hi = versions
    bounds = log_bounds(lo, hi, pipeline.event_time, list(pipeline.key_columns))
    if bounds is None or not version_bounds.proves_all_on_time(bounds, prior_max_us, pipeline.delay_us):
        return None
    filled = [b for b in bounds if b.max_floor_us is not None]
    if pipeline.min_event_time_us is not None and any(b.min_floor_us < pipeline.min_event_time_us for b in filled):
        return None
    if pipeline.max_future_us is not None and filled:
        commits = {v: int(t.timestamp() * 1_000_000) for v, t in source.log_commit_times(lo).items()}  # pyright: ignore[reportAttributeAccessIssue]
        slack = 60_000_000  # the log's commit time and the change feed's may differ by the commit's duration
        if any(
            b.version not in commits or b.max_ceil_us > commits[b.version] + pipeline.max_future_us - slack
            for b in filled
        ):
            return None
    if any(b.rows and b.min_floor_us is None for b in bounds):
        return None
    # The log shows versions lo..hi appended only: from version 0, the table's snapshot at hi holds the same records
    # (columnar, faster than the change feed). Without record steps or enrichment only: the operator then reads just
    # its own columns, none of the change feed's.
    read_appended = getattr(source, "read_appended", None)
    if lo == 0 and read_appended is not None and not pipeline.steps and pipeline.enrich is None:
        changes = read_appended(hi)
    else:
        changes = source.read_backlog(hi, lo)
    if not filled:
        range_max = None
    else:
        top = max(b.max_floor_us for b in filled)
        reaching = [b for b in filled if b.max_ceil_us >= top]
        tops = [b.version for b in reaching]
        # The files that can hold it, read off Spark (a job and its planning were 0.1-0.2 s of every backlog).
        log_max_us = getattr(source, "log_max_us", None)
        range_max = None if log_max_us is None else log_max_us(hi, reaching, top, pipeline.event_time)
        if range_max is None:
            at_top = source.read_backlog(max(tops), min(tops)).filter(
                F.col(VERSION).isin(tops) & (F.unix_micros(F.col(pipeline.event_time)) >= F.lit(top))
            )
            range_max = at_top.agg(F.max(F.unix_micros(F.col(pipeline.event_time)))).collect()[0][0]
        if range_max is None:  # the log and the rows disagree: let the scan decide
            return None
        range_max = int(range_max)
    running = max((m for m in (prior_max_us, range_max) if m is not None), default=None)
    q_rows = spark_internals.empty_frame(spark, quarantine.SCHEMA)
    return TaggedRange(
        prepare(changes, where, spark),
        q_rows,
        range_max,
        running,
        has_on_time=any(b.rows for b in bounds),
        has_quarantine=False,
        from_log=True,
    )


def _in_versions(versions: list[int]) -> Column:
    return F.col(VERSION).isin(versions) if versions else F.lit(False)
