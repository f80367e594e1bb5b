"""Record validation shared by both phases: what is not a valid record is quarantined with a reason."""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from phases._internal.definition import Pipeline
from phases._internal.errors import SourceError

REASON = "_reason"
COMMIT_TIME = "_commit_timestamp"  # the change feed's commit time of the record's source version
FUTURE, PAST = "future", "past"  # the reasons' first words
CHANGE_TYPE = "_change_type"  # the change feed's kind of change: insert, update_preimage, update_postimage, delete
CHANGE_KINDS = ("insert", "update_preimage", "update_postimage", "delete")
TAKEN_BACK = ("update_preimage", "delete")  # the kinds that take a row back (a changes source: -1)
DECODE_ERROR = "_decode_error"  # a source that decodes its records (Kafka) says here why one could not be


def rejection_reason(pipeline: Pipeline, columns: list[str] | None = None) -> Column:
    """A column holding why a change-feed row is not a valid record, or null when it is valid: undecodable
    (a source's ``_decode_error``, when ``columns`` has it), not an insert (over a keyed aggregation's results read as
    changes: not a change), a null key or event time, an event
    time more than ``max_future`` after its version's commit, or before ``min_event_time``. Invalid records
    are quarantined and never move the watermark. A key column or the event time that ``columns`` lacks is a
    SourceError naming it."""
    if columns is not None:
        needed = [*pipeline.key_columns, pipeline.event_time]
        missing = [c for c in needed if c not in columns]
        if missing:
            held = sorted(c for c in columns if not c.startswith("_"))
            raise SourceError(
                f"pipeline {pipeline.name!r}: the key and event-time columns {missing} are not in its source's "
                f"records (key_columns {list(pipeline.key_columns)}, event_time {pipeline.event_time!r}); the "
                f"records' columns: {held}. Nothing was written. Name columns the source has (they are checked "
                "before the record steps run), or add the column to the source table"
            )
    reason = F.when(F.lit(False), F.lit(None).cast("string"))
    if columns is not None and DECODE_ERROR in columns:
        reason = reason.when(F.col(DECODE_ERROR).isNotNull(), F.col(DECODE_ERROR))
    # Over a keyed aggregation's results every change is a record: an update's or a delete's old row is taken back.
    kinds = CHANGE_KINDS if pipeline.reads_changes else ("insert",)
    reason = reason.when(
        ~F.col("_change_type").isin(*kinds),
        F.concat(
            F.lit("non-append change '"),
            F.col("_change_type"),
            F.lit("': the source must be append-only (updates and deletes are not replayed)"),
        ),
    )
    for key in pipeline.key_columns:
        reason = reason.when(F.col(key).isNull(), F.lit(f"null key column '{key}'"))
    event_time = F.col(pipeline.event_time)
    reason = reason.when(event_time.isNull(), F.lit(f"null event time column '{pipeline.event_time}'"))
    if pipeline.max_future_us is not None and not pipeline.reads_changes:
        # Against the version's commit time, not the wall clock: both phases and a single streaming job
        # quarantine the same records.
        after = F.unix_micros(F.col(COMMIT_TIME)) + F.lit(pipeline.max_future_us)
        reason = reason.when(F.unix_micros(event_time) > after, F.lit(future_reason(pipeline.max_future)))  # pyright: ignore[reportArgumentType]
    if pipeline.min_event_time_us is not None:
        reason = reason.when(
            F.unix_micros(event_time) < F.lit(pipeline.min_event_time_us),
            F.lit(past_reason(pipeline.min_event_time)),  # pyright: ignore[reportArgumentType]
        )
    return reason


def duration_text(span: timedelta) -> str:
    """A duration as a person writes it: "1 day", "2 hours 30 minutes", "90 seconds", "0.5 seconds"."""
    total = span.total_seconds()
    if total < 60 and total != int(total):
        return f"{total:g} seconds"
    seconds = int(total)
    parts = []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}{'s' if count != 1 else ''}")
    return " ".join(parts) or "0 seconds"


def future_reason(max_future: timedelta) -> str:
    return f"future: event time more than {duration_text(max_future)} after its version's commit (max_future)"


def past_reason(min_event_time: datetime) -> str:
    return f"past: event time before {min_event_time.isoformat()} (min_event_time)"


def with_reason(changes: DataFrame, pipeline: Pipeline) -> DataFrame:
    """``changes`` with ``_reason`` (null for a valid record)."""
    return changes.withColumn(REASON, rejection_reason(pipeline, changes.columns))


def split_invalid(changes: DataFrame, pipeline: Pipeline) -> tuple[DataFrame, DataFrame]:
    """(valid records, invalid records with ``_reason``)."""
    tagged = with_reason(changes, pipeline)
    return tagged.filter(F.col(REASON).isNull()).drop(REASON), tagged.filter(F.col(REASON).isNotNull())
