"""Two-phase (backlog -> live) pipelines on Spark: the engine. No Dagster imports here.

The public API: declare a :class:`Pipeline`, run its backlog with :class:`BacklogRunner` and its live phase with
:class:`LiveRunner` on a session from :func:`build_session`; every error the engine raises on purpose is a
:class:`PhasesError`. Everything is importable from ``phases``::

    from phases import Aggregation, BacklogRunner, DeltaSink, DeltaSource, KeyedAggregate, LiveRunner, Pipeline

What an orchestrator reads of a pipeline without running it (its handoff, how far its live phase got, what waits
in its sources, figures of its tables) is in :mod:`phases.inspect`; the Dagster layer uses nothing else.

The names load on first use (PEP 562), so that a light entry point (a sensor, a watchdog, a Spark worker) that
imports one module of the engine does not load all of it.

The other public modules: :mod:`phases.testing` and :mod:`phases.pytest_plugin` (testing your own pipelines),
:mod:`phases.feed` (a demo source table), :mod:`phases.setup` (the jars, the JVM helper and the class archive, once
per machine), :mod:`phases.local` (a Kafka broker on loopback for a trial or your own tests). Everything else is
private, under ``phases/_internal/`` (no API; it changes without notice), in wings, one folder each:

* ``definition/``: the pipeline model (operators, steps, sources, the pipeline), validated at construction;
* ``sources/``: the Delta, Kafka, hybrid and file readers behind one reader protocol, heads, lag, log bounds;
* ``operators/``: one module per operator kind, each owning its logic, backlog pass, handoff and live step;
* ``steps/``: record steps and end-of-stream steps that run before the operator;
* ``lateness.py`` (the W(v) rule) and ``tagging.py`` (records tagged by it, in both phases);
* ``backlog/`` and ``live/``: the two phases' drivers; ``redeploy/``: a changed definition built beside the serving
  one and swapped in;
* ``placement.py``: where a definition runs (:class:`Placement`): every path, table, topic and lease name the engine
  uses is derived from it and the declared definition, which the engine never copies or changes;
* ``storage/``: Delta table and file I/O (tables, their figures, quarantine, the changelog sink, maintenance);
  ``coordination/``: leases and the live progress log; ``state/``: the state store; ``handoff/``: the manifest, the
  live run's folders and increments' intents, which both phases build on; ``deployment/``: a definition placed once
  at each entry point (:func:`place`), and its generations;
* ``runtime/``: the SparkSession, the JVM jars, shipping code to a cluster, the local broker and cluster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, ...]] = {
    "phases._internal.definition": (
        "Pipeline",
        "Aggregation",
        "KeyedAggregate",
        "Window",
        "WindowedAggregate",
        "SessionAggregate",
        "ProcessOperator",
        "IntervalJoin",
        "CoGroup",
        "Filter",
        "Derive",
        "MapPartition",
        "SortPartition",
        "AggregatePartition",
        "ReducePartition",
        "EndOfStreamStep",
        "Enrichment",
        "DeltaSource",
        "KafkaSource",
        "KafkaHandoff",
        "FileArchive",
        "HybridSource",
        "PipelineSource",
        "DeltaSink",
        "KafkaSink",
        "SchemaRegistry",
        "ValueFormat",
        "Locations",
        "Maintenance",
    ),
    "phases._internal.backlog.runner": ("BacklogRunner",),
    "phases._internal.backlog.slices": ("SliceRunner",),
    "phases._internal.live.runner": ("LiveRunner",),
    "phases._internal.live.report": ("LiveStart",),
    "phases._internal.redeploy.runner": ("Redeploy",),
    "phases._internal.redeploy.plan": ("RedeployPlan", "RedeployResult"),
    "phases._internal.definition.changes": ("DefinitionChanges",),
    "phases._internal.definition.model": ("SettingsModel",),
    "phases._internal.handoff.manifest": ("HandoffManifest",),
    "phases._internal.deployment": ("Placement", "place", "maintain"),
    "phases._internal.storage.changelog": ("Compaction", "compact_changelog", "read_current"),
    "phases._internal.live.republish": ("republish_topic",),
    "phases.inspect": ("read_topic",),
    "phases._internal.runtime.session": ("SparkSettings", "build_session"),
    "phases._internal.runtime.shipping": ("package_archive",),
    "phases._internal.sources.lag": ("InputLag",),
    "phases._internal.operators.process_function": ("KeyedProcessFunction", "ProcessContext"),
    "phases.testing": ("assert_equivalent", "event_versions", "run_streaming", "run_two_phase"),
    "phases._internal.errors": (
        "PhasesError",
        "SetupError",
        "SparkInternalsChanged",
        "DefinitionError",
        "SourceError",
        "ManifestError",
        "SinkError",
        "PhaseStateError",
        "LeaseHeld",
        "SchemaChangeError",
        "ProcessFunctionError",
        "LiveQueryStopped",
        "LiveResumeError",
        "StateStoreError",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "AggregatePartition",
    "Aggregation",
    "BacklogRunner",
    "CoGroup",
    "Compaction",
    "DefinitionChanges",
    "DefinitionError",
    "DeltaSink",
    "DeltaSource",
    "Derive",
    "EndOfStreamStep",
    "Enrichment",
    "FileArchive",
    "Filter",
    "HandoffManifest",
    "HybridSource",
    "InputLag",
    "IntervalJoin",
    "KafkaHandoff",
    "KafkaSink",
    "KafkaSource",
    "KeyedAggregate",
    "KeyedProcessFunction",
    "LeaseHeld",
    "LiveQueryStopped",
    "LiveResumeError",
    "LiveRunner",
    "LiveStart",
    "Locations",
    "Maintenance",
    "ManifestError",
    "MapPartition",
    "PhaseStateError",
    "PhasesError",
    "Pipeline",
    "PipelineSource",
    "Placement",
    "ProcessContext",
    "ProcessFunctionError",
    "ProcessOperator",
    "Redeploy",
    "RedeployPlan",
    "RedeployResult",
    "ReducePartition",
    "SchemaChangeError",
    "SchemaRegistry",
    "SessionAggregate",
    "SettingsModel",
    "SetupError",
    "SinkError",
    "SliceRunner",
    "SortPartition",
    "SourceError",
    "SparkInternalsChanged",
    "SparkSettings",
    "StateStoreError",
    "ValueFormat",
    "Window",
    "WindowedAggregate",
    "assert_equivalent",
    "build_session",
    "compact_changelog",
    "event_versions",
    "maintain",
    "package_archive",
    "place",
    "read_current",
    "read_topic",
    "republish_topic",
    "run_streaming",
    "run_two_phase",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'phases' has no attribute {name!r}; its public names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from phases._internal.backlog.runner import BacklogRunner
    from phases._internal.backlog.slices import SliceRunner
    from phases._internal.definition import (
        AggregatePartition,
        Aggregation,
        CoGroup,
        DeltaSink,
        DeltaSource,
        Derive,
        EndOfStreamStep,
        Enrichment,
        FileArchive,
        Filter,
        HybridSource,
        IntervalJoin,
        KafkaHandoff,
        KafkaSink,
        KafkaSource,
        KeyedAggregate,
        Locations,
        Maintenance,
        MapPartition,
        Pipeline,
        PipelineSource,
        ProcessOperator,
        ReducePartition,
        SchemaRegistry,
        SessionAggregate,
        SortPartition,
        ValueFormat,
        Window,
        WindowedAggregate,
    )
    from phases._internal.definition.changes import DefinitionChanges
    from phases._internal.definition.model import SettingsModel
    from phases._internal.deployment import Placement, maintain, place
    from phases._internal.errors import (
        DefinitionError,
        LeaseHeld,
        LiveQueryStopped,
        LiveResumeError,
        ManifestError,
        PhasesError,
        PhaseStateError,
        ProcessFunctionError,
        SchemaChangeError,
        SetupError,
        SinkError,
        SourceError,
        SparkInternalsChanged,
        StateStoreError,
    )
    from phases._internal.handoff.manifest import HandoffManifest
    from phases._internal.live.report import LiveStart
    from phases._internal.live.republish import republish_topic
    from phases._internal.live.runner import LiveRunner
    from phases._internal.operators.process_function import KeyedProcessFunction, ProcessContext
    from phases._internal.redeploy.plan import RedeployPlan, RedeployResult
    from phases._internal.redeploy.runner import Redeploy
    from phases._internal.runtime.session import SparkSettings, build_session
    from phases._internal.runtime.shipping import package_archive
    from phases._internal.sources.lag import InputLag
    from phases._internal.storage.changelog import Compaction, compact_changelog, read_current
    from phases.inspect import read_topic
    from phases.testing import assert_equivalent, event_versions, run_streaming, run_two_phase
