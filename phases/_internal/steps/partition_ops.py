"""Full-partition operators (FLIP-380) over each partition of non-keyed records, and the record steps
(filter, derive) that run before the stream operator in both phases.

Full-partition operators see a partition only once its input ended, so they exist only in end-of-stream
steps (the pipeline definition rejects them elsewhere). Python functions run once per partition over all
its records (pandas), never once per record.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from phases._internal.definition import (
    AggKind,
    AggregatePartition,
    Aggregation,
    Derive,
    EndOfStreamStep,
    Filter,
    MapPartition,
    ReducePartition,
    SortPartition,
)
from phases._internal.errors import DefinitionError
from phases._internal.reduce_fold import fold
from phases._internal.runtime.user_code import load_function

PARTITION = "partition"


def apply_record_steps(df: DataFrame, steps: list, exempt: Column | None = None) -> DataFrame:
    """Filter / derive steps, in order (the same in the backlog batch and in the live stream).

    ``exempt``: rows for which it holds pass every filter (engine rows riding along a stream). Referencing
    the event-time column in it also keeps Spark from pushing the filter below the watermark.
    """
    for step in steps:
        if isinstance(step, Filter):
            df = df.filter(F.expr(step.condition) if exempt is None else (F.expr(step.condition) | exempt))
        elif isinstance(step, Derive):
            df = df.withColumn(step.name, F.expr(step.expression))
    return df


def _whole_partition(batches: Iterator[pd.DataFrame]) -> pd.DataFrame | None:
    frames = list(batches)
    return pd.concat(frames, ignore_index=True) if frames else None


def _map_partition(df: DataFrame, op: MapPartition) -> DataFrame:
    fn = load_function(op.function)

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        whole = _whole_partition(batches)
        if whole is not None:
            yield fn(whole)

    return df.mapInPandas(run, op.output_schema)


def _sort_partition(df: DataFrame, op: SortPartition) -> DataFrame:
    if op.by is not None:
        missing = sorted(set(op.by) - set(df.columns))
        if missing:
            raise DefinitionError(f"sort_partition by {missing}: no such columns; columns: {df.columns}")
        return df.sortWithinPartitions(*[F.col(c).desc() if op.descending else F.col(c).asc() for c in op.by])
    key = load_function(op.key)  # pyright: ignore[reportArgumentType]
    descending = op.descending

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        whole = _whole_partition(batches)
        if whole is not None:
            keys = [key(row) for row in whole.to_dict("records")]
            order = sorted(range(len(keys)), key=keys.__getitem__, reverse=descending)
            yield whole.iloc[order].reset_index(drop=True)

    return df.mapInPandas(run, df.schema)


def _aggregate_column(agg: Aggregation, df: DataFrame) -> Column:
    if agg.column is not None and agg.column not in df.columns:
        raise DefinitionError(f"aggregation {agg.name!r}: no column {agg.column!r}; columns: {df.columns}")
    col = F.col(agg.column) if agg.column else None
    if agg.kind is AggKind.COUNT:
        return (F.count(F.lit(1)) if col is None else F.count(col)).alias(agg.name)
    if agg.kind is AggKind.REDUCE:
        return fold(agg.column, df.schema[agg.column].dataType, agg.reduce).alias(agg.name)  # pyright: ignore[reportArgumentType]
    fn = {AggKind.SUM: F.sum, AggKind.MIN: F.min, AggKind.MAX: F.max, AggKind.AVG: F.avg}[agg.kind]
    return fn(col).alias(agg.name)  # pyright: ignore[reportArgumentType]


def _aggregate_partition(df: DataFrame, aggregations: list[Aggregation]) -> DataFrame:
    cols = [_aggregate_column(a, df) for a in aggregations]
    return df.withColumn(PARTITION, F.spark_partition_id()).groupBy(PARTITION).agg(*cols)


def run_end_of_stream_step(df: DataFrame, step: EndOfStreamStep) -> DataFrame:
    """The step's operators over each of its partitions (hash of ``partition_by``, default all columns)."""
    by = step.partition_by or [c for c in df.columns if not c.startswith("_")]
    missing = sorted(set(by) - set(df.columns))
    if missing:
        raise DefinitionError(f"end_of_stream step {step.name!r}: partition_by {missing} are not columns of its input")
    out = df.repartition(step.partitions, *by)
    for op in step.operators:
        if isinstance(op, MapPartition):
            out = _map_partition(out, op)
        elif isinstance(op, SortPartition):
            out = _sort_partition(out, op)
        elif isinstance(op, AggregatePartition):
            out = _aggregate_partition(out, op.aggregations)
        elif isinstance(op, ReducePartition):
            out = _aggregate_partition(out, [op.as_aggregation()])
    return out
