"""Steps around the stream operator: record steps (filter, derive) that run in both phases, and end-of-stream
steps (FLIP-331's blocking batch steps, FLIP-380's full-partition operators) that run over the backlog only, with
the enrichment that joins their output to the records."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from phases._internal.definition.fields import FunctionImportPath, _Model, name, user_column
from phases._internal.definition.operators import AggKind, Aggregation, _unique_names
from phases._internal.definition.sinks import DeltaSink


class Filter(_Model):
    """Keeps the records for which a Spark SQL condition holds (runs in both phases)."""

    kind: Literal["filter"] = "filter"
    condition: str = Field(min_length=1)


class Derive(_Model):
    """Adds (or replaces) a column computed by a Spark SQL expression over the record (both phases)."""

    kind: Literal["derive"] = "derive"
    name: str
    expression: str = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return user_column(v, "derived column")


class MapPartition(_Model):
    """FLIP-380 ``mapPartition``: a function over all records of a partition at once (a pandas DataFrame in,
    a DataFrame with ``output_schema`` out), called once per partition after its input ended."""

    kind: Literal["map_partition"] = "map_partition"
    function: FunctionImportPath = Field(description="Import path 'package.module:function'.")
    output_schema: str = Field(description="Spark DDL of the output, e.g. 'key string, n long'.")


class SortPartition(_Model):
    """FLIP-380 ``sortPartition``: sorts each partition by columns or by a key function (one of the two)."""

    kind: Literal["sort_partition"] = "sort_partition"
    by: list[str] | None = None
    key: str | None = Field(default=None, description="Import path of a function row(dict) -> sort key.")
    descending: bool = False

    @model_validator(mode="after")
    def _one_of(self) -> SortPartition:
        if (self.by is None) == (self.key is None):
            raise ValueError("sort_partition needs exactly one of 'by' (columns) and 'key' (a key function)")
        if self.by is not None and not self.by:
            raise ValueError("sort_partition 'by' needs at least one column")
        return self


class AggregatePartition(_Model):
    """FLIP-380 ``aggregate``: the aggregations over each whole partition: one row per partition."""

    kind: Literal["aggregate_partition"] = "aggregate_partition"
    aggregations: list[Aggregation] = Field(min_length=1)

    @field_validator("aggregations")
    @classmethod
    def _names(cls, v: list[Aggregation]) -> list[Aggregation]:
        return _unique_names(v)


class ReducePartition(_Model):
    """FLIP-380 ``reduce``: folds one column of each partition with an associative, commutative expression."""

    kind: Literal["reduce_partition"] = "reduce_partition"
    name: str
    column: str
    reduce: str

    def as_aggregation(self) -> Aggregation:
        return Aggregation(name=self.name, kind=AggKind.REDUCE, column=self.column, reduce=self.reduce)


PartitionOperator = MapPartition | SortPartition | AggregatePartition | ReducePartition
FULL_PARTITION_KINDS = ("map_partition", "sort_partition", "aggregate_partition", "reduce_partition")


class EndOfStreamStep(_Model):
    """An end-of-stream ("full dam", FLIP-331) step: emits only after its input ended, so it runs as a
    blocking batch step over the backlog (versions 0..V) and writes a Delta table. Its operators run over
    each of ``partitions`` partitions of the valid backlog records (hash of ``partition_by``, default all
    columns), in order (FLIP-380 full-partition processing)."""

    name: str
    operators: list[PartitionOperator] = Field(min_length=1)
    partitions: int = Field(default=1, ge=1, le=10_000)
    partition_by: list[str] | None = None
    output: DeltaSink

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return name(v, "step name")

    @field_validator("operators")
    @classmethod
    def _aggregate_last(cls, v: list) -> list:
        for i, op in enumerate(v[:-1]):
            if op.kind in ("aggregate_partition", "reduce_partition"):
                raise ValueError(
                    f"operator {i} ({op.kind}) reduces each partition to one row; it must be the step's last operator"
                )
        return v


class Enrichment(_Model):
    """Joins every record the stream operator sees (backlog and live) with an end-of-stream step's output
    on ``on`` (left join), adding ``columns``. The live phase starts only after that step finished at the
    handoff's source version."""

    step: str
    on: list[str] = Field(min_length=1)
    columns: list[str] = Field(min_length=1)
