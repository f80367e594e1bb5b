"""Record validation shared by both phases: what is not a valid record is quarantined with a reason."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from phases.definition import Pipeline

REASON = "_reason"


def rejection_reason(pipeline: Pipeline) -> Column:
    """A column holding why a change-feed row is not a valid record, or null when it is valid."""
    reason = F.when(
        F.col("_change_type") != "insert",
        F.concat(
            F.lit("non-append change '"),
            F.col("_change_type"),
            F.lit("': the source must be append-only (updates and deletes are not replayed)"),
        ),
    )
    for key in pipeline.key_columns:
        reason = reason.when(F.col(key).isNull(), F.lit(f"null key column '{key}'"))
    return reason.when(F.col(pipeline.event_time).isNull(), F.lit(f"null event time column '{pipeline.event_time}'"))


def with_reason(changes: DataFrame, pipeline: Pipeline) -> DataFrame:
    """``changes`` with ``_reason`` (null for a valid record)."""
    return changes.withColumn(REASON, rejection_reason(pipeline))


def split_invalid(changes: DataFrame, pipeline: Pipeline) -> tuple[DataFrame, DataFrame]:
    """(valid records, invalid records with ``_reason``)."""
    tagged = with_reason(changes, pipeline)
    return tagged.filter(F.col(REASON).isNull()).drop(REASON), tagged.filter(F.col(REASON).isNotNull())
