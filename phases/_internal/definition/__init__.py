"""The pipeline definition: one declaration that both phases run, in six parts:

* :mod:`~phases._internal.definition.operators`: the stream operator, one model per kind;
* :mod:`~phases._internal.definition.steps`: record steps and end-of-stream steps around it;
* :mod:`~phases._internal.definition.sources`: where records come from;
* :mod:`~phases._internal.definition.sinks`: where results go;
* :mod:`~phases._internal.definition.pipeline`: the pipeline itself, its inputs, another pipeline's results as a
  source;
* :mod:`~phases._internal.definition.locations`: where the engine keeps its tables, and their maintenance.

Every name is re-exported here. Validated at construction; messages name the field and the valid values
(shared rules: :mod:`~phases._internal.definition.fields`).
"""

from phases._internal.definition.fields import RESERVED_PREFIX
from phases._internal.definition.locations import Locations, Maintenance
from phases._internal.definition.operators import (
    MAX_BUCKETS_PER_ROW,
    OPERATOR_MODELS,
    OPERATOR_VERSION,
    WINDOW_END,
    WINDOW_START,
    AggKind,
    Aggregation,
    CoGroup,
    IntervalJoin,
    KeyedAggregate,
    Operator,
    OperatorModel,
    ProcessOperator,
    SessionAggregate,
    Window,
    WindowedAggregate,
    sql_expression_problem,
)
from phases._internal.definition.pipeline import (
    DEFAULT_MAX_FUTURE,
    RIGHT_LABEL,
    SOURCE_LABEL,
    STATE_SCHEMA_VERSION,
    Input,
    Inputs,
    Pipeline,
    PipelineSource,
    fingerprint_of,
)
from phases._internal.definition.registry import SchemaRegistry
from phases._internal.definition.sinks import DeltaSink, KafkaSink
from phases._internal.definition.sources import (
    DeltaSource,
    FileArchive,
    FileFormat,
    HybridSource,
    KafkaHandoff,
    KafkaSource,
    ValueFormat,
    ddl_field_names,
)
from phases._internal.definition.steps import (
    FULL_PARTITION_KINDS,
    AggregatePartition,
    Derive,
    EndOfStreamStep,
    Enrichment,
    Filter,
    MapPartition,
    PartitionOperator,
    ReducePartition,
    SortPartition,
)

__all__ = [
    "SchemaRegistry",
    "fingerprint_of",
    "DEFAULT_MAX_FUTURE",
    "FULL_PARTITION_KINDS",
    "MAX_BUCKETS_PER_ROW",
    "OPERATOR_MODELS",
    "OPERATOR_VERSION",
    "RESERVED_PREFIX",
    "RIGHT_LABEL",
    "SOURCE_LABEL",
    "STATE_SCHEMA_VERSION",
    "WINDOW_END",
    "WINDOW_START",
    "AggKind",
    "AggregatePartition",
    "Aggregation",
    "CoGroup",
    "DeltaSink",
    "DeltaSource",
    "Derive",
    "EndOfStreamStep",
    "Enrichment",
    "FileArchive",
    "FileFormat",
    "Filter",
    "HybridSource",
    "Input",
    "Inputs",
    "IntervalJoin",
    "KafkaHandoff",
    "KafkaSink",
    "KafkaSource",
    "KeyedAggregate",
    "Locations",
    "Maintenance",
    "MapPartition",
    "Operator",
    "OperatorModel",
    "PartitionOperator",
    "Pipeline",
    "PipelineSource",
    "ProcessOperator",
    "ReducePartition",
    "SessionAggregate",
    "SortPartition",
    "ValueFormat",
    "Window",
    "WindowedAggregate",
    "ddl_field_names",
    "sql_expression_problem",
]
