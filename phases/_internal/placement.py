"""Where a pipeline runs: the :class:`Placement`, a value of its own beside the user's definition.

A :class:`phases.Pipeline` is what the user declared and nothing else; the engine never copies or changes it. Where it
runs is decided once, at each entry point (a runner, a redeploy, an orchestrator's resource, the pytest kit), and held
by a :class:`Placement`:

* ``root``: the storage root the definition's relative paths resolve under (None: as declared);
* ``brokers``: the environment's Kafka brokers for every topic the definition reads or writes (None: as declared);
* ``generation`` and ``serving``: which generation's tables it reads and writes
  (:mod:`phases._internal.deployment.generations`), and whether it writes the table consumers read;
* the redeploy log as read when placed.

Every path, table, topic and lease name the engine uses is a method of the placement, derived from the declaration.
The engine's functions take the placement where they need a place and the :class:`Pipeline` where they need the
declaration only; the two are distinct types. The fingerprint is the declaration's, wherever it runs.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from phases._internal import uris
from phases._internal.definition import (
    DeltaSource,
    EndOfStreamStep,
    FileArchive,
    HybridSource,
    KafkaSink,
    KafkaSource,
    Pipeline,
    PipelineSource,
    fingerprint_of,
)
from phases._internal.definition.locations import (
    CHECKPOINTS_FOLDER,
    LIVE_FOLDER,
    MANIFESTS_FOLDER,
    QUARANTINE_FOLDER,
    STATE_FOLDER,
)

__all__ = ["Generations", "LogRow", "Placement", "generation_root", "own_sink", "under"]

SourceSpec = DeltaSource | KafkaSource | HybridSource | FileArchive


def under(root: str, path: str) -> str:
    """``path`` itself when absolute or a URI, else ``root/path``."""
    if path.startswith("/") or uris.scheme(path) is not None:
        return path
    return uris.join(root, path)


def generation_root(root: str, n: int) -> str:
    """Where generation ``n`` keeps its tables, for a pipeline whose ``locations.root`` is ``root``."""
    return root if n == 0 else uris.join(root, "generations", str(n))


def own_sink(root: str, n: int) -> str:
    """Generation ``n``'s own sink: where it writes while it does not serve (and where a swap keeps its results)."""
    return uris.join(root, "generations", str(n), "sink")


# The redeploy log's column that holds a row's kind. Logs written before 2026-12 name it ``step``: they are read as
# they are and appended to under that name (a rename would need Delta's column mapping, a protocol upgrade older
# readers refuse).
KIND_COLUMN, LEGACY_KIND_COLUMN = "kind", "step"


@dataclass(frozen=True)
class LogRow:
    """One row of the redeploy log."""

    pipeline: str
    redeploy_id: str
    kind: str  # one of ROW_KINDS (logs written before 2026-12 name the column ``step``)
    generation: int
    from_generation: int | None
    fingerprint: str | None
    state_spec: str | None
    manifest_id: str | None
    consumer_version: int | None
    reason: str | None
    detail: str | None
    at_us: int

    @classmethod
    def of(cls, found: dict) -> LogRow:
        """A row as read from the log, whichever name its kind column has (``step`` in logs written before
        2026-12)."""
        values: dict[str, Any] = {name: found.get(name) for name in cls.__dataclass_fields__}
        if values[KIND_COLUMN] is None:
            values[KIND_COLUMN] = found.get(LEGACY_KIND_COLUMN)
        return cls(**values)


@dataclass(frozen=True)
class Generations:
    """What the redeploy log says of a pipeline's generations."""

    rows: tuple[LogRow, ...] = ()
    serving: int = 0
    swap_under_way: LogRow | None = None  # a ``swapping`` row not followed by its ``swapped`` row
    fingerprints: dict[int, str] = field(default_factory=dict)  # generation -> its definition's fingerprint
    specs: dict[int, str] = field(default_factory=dict)  # generation -> its state spec (JSON)
    gone: frozenset[int] = frozenset()  # abandoned or removed generations
    amended: frozenset[tuple[str, str]] = frozenset()  # (manifest id, fingerprint) accepted for a handoff
    previous: dict[int, int] = field(default_factory=dict)  # generation -> the one it replaced at its last swap

    @classmethod
    def of(cls, rows: list[LogRow]) -> Generations:
        ordered = tuple(sorted(rows, key=lambda s: s.at_us))
        serving, under_way, previous = 0, None, {}
        fingerprints, specs, gone, amended = {}, {}, set(), set()
        for s in ordered:
            if s.kind == "started":
                fingerprints[s.generation] = s.fingerprint
                specs[s.generation] = s.state_spec
                gone.discard(s.generation)
            elif s.kind == "amended":
                amended.add((s.manifest_id, s.fingerprint))
                fingerprints[s.generation] = s.fingerprint
                specs[s.generation] = s.state_spec
            elif s.kind == "swapping":
                under_way = s
            elif s.kind == "swapped":
                serving, under_way = s.generation, None
                if s.from_generation is not None:
                    previous[s.generation] = s.from_generation
            elif s.kind in ("abandoned", "removed"):
                gone.add(s.generation)
        return cls(ordered, serving, under_way, fingerprints, specs, frozenset(gone), frozenset(amended), previous)

    @property
    def numbers(self) -> list[int]:
        """Every generation the log knows (0 included), oldest first."""
        return sorted({0, *self.fingerprints, *(s.generation for s in self.rows)})

    def served(self, n: int) -> bool:
        """Whether generation ``n`` has served (generation 0 served first; another after a swap to it)."""
        return n == 0 or any(s.kind == "swapped" and s.generation == n for s in self.rows)

    def retained(self) -> list[int]:
        """The generations whose tables are kept, serving or not (not abandoned or removed)."""
        return [n for n in self.numbers if n not in self.gone]


@dataclass(frozen=True)
class Placement:
    """A pipeline definition and where it runs (see the module's text). Immutable; :meth:`at` gives the same place as
    another generation.

    ``source_path``, ``engine_root``, ``sink_path`` and ``sink_topic`` put the pipeline's own source, its engine
    tables, its consumer-facing sink and its result topic somewhere else than the declaration says (the pytest kit
    runs a user's definition on versions of its own, under a folder of the test's). Each is a place, not a change of
    the definition: its fingerprint stays the declared one."""

    definition: Pipeline
    root: str | None = None
    brokers: str | None = None
    generation: int = 0
    serving: bool = True
    redeploys: Generations = dataclasses.field(default_factory=Generations)
    source_path_at: str | None = None
    engine_root_at: str | None = None
    sink_path_at: str | None = None
    sink_topic_at: str | None = None

    # --- who -------------------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.definition.name

    def fingerprint(self) -> str:
        """The declared definition's fingerprint (the same wherever it runs)."""
        return self.definition.fingerprint()

    def placed_fingerprint(self) -> str:
        """The fingerprint of the definition with its paths where it runs, as the engine took it before the
        placement was a value of its own (its source paths, a right source's and end-of-stream outputs'
        resolved): a handoff or redeploy log row written then still names it. Accepted with the declared one
        (:meth:`is_fingerprint`), so that existing handoffs keep working."""
        d = self.definition
        spec = d.state_spec()

        def placed(source_spec: dict, source) -> dict:
            if isinstance(source, HybridSource):
                return {**source_spec, "backlog": placed(source_spec["backlog"], source.backlog)}
            if isinstance(source, DeltaSource | FileArchive):
                return {**source_spec, "path": self.source_path(source)}
            return source_spec

        spec["source"] = placed(spec["source"], d.source)
        right = d.right_source
        if right is not None:
            spec["operator"] = {**spec["operator"], "right": placed(spec["operator"]["right"], right)}
        if "end_of_stream" in spec:
            spec["end_of_stream"] = [
                {**s, "output": {**s["output"], "path": self.end_of_stream_output(step)}}
                for s, step in zip(spec["end_of_stream"], d.end_of_stream, strict=True)
            ]
        return fingerprint_of(spec)

    @property
    def fingerprints(self) -> tuple[str, ...]:
        """The fingerprints that name this definition in a handoff or the redeploy log: the declared one first."""
        return tuple(dict.fromkeys((self.fingerprint(), self.placed_fingerprint())))

    def is_fingerprint(self, fingerprint: str | None) -> bool:
        """Whether ``fingerprint`` (a handoff's, a log row's) names this definition (:attr:`fingerprints`)."""
        return fingerprint in self.fingerprints

    @property
    def redeployed(self) -> bool:
        """Whether a redeploy ever ran for the pipeline (its log has rows)."""
        return bool(self.redeploys.rows)

    def at(self, generation: int, *, serving: bool, redeploys: Generations | None = None) -> Placement:
        """The same place as ``generation``: its engine tables under the generation's folder, its sink the
        consumer-facing table when ``serving``, else the generation's own sink. Reads nothing."""
        return dataclasses.replace(self, generation=generation, serving=serving, redeploys=redeploys or Generations())

    # --- paths -----------------------------------------------------------------------------------------------------

    def resolve(self, path: str) -> str:
        """A declared path where it runs: under ``root`` when relative; without a root, under the process's working
        directory (Spark's SQL takes ``delta.`path``` for an absolute path only, and the JVM's working directory is
        not the process's once it changed)."""
        return under(self.root if self.root is not None else os.getcwd(), path)

    @property
    def base_root(self) -> str:
        """Generation 0's folder (the declared ``locations.root`` where it runs): it holds the redeploy log and every
        generation's folder."""
        return self.engine_root_at or self.resolve(self.definition.locations.root)

    @property
    def engine_root(self) -> str:
        """This generation's folder: its state, manifests, quarantine, checkpoints, live runs and leases."""
        return generation_root(self.base_root, self.generation)

    def _sub(self, name: str) -> str:
        return uris.join(self.engine_root, name)

    @property
    def state_root(self) -> str:
        return self._sub(STATE_FOLDER)

    @property
    def manifests(self) -> str:
        return self._sub(MANIFESTS_FOLDER)

    @property
    def quarantine(self) -> str:
        return self._sub(QUARANTINE_FOLDER)

    @property
    def checkpoints(self) -> str:
        return self._sub(CHECKPOINTS_FOLDER)

    @property
    def live_root(self) -> str:
        """The folder of the live phase's runs (one per handoff)."""
        return self._sub(LIVE_FOLDER)

    def live_run(self, run_name: str) -> str:
        """The live phase's own tables of one run (its progress and the held-back part of a split version)."""
        return uris.join(self.live_root, run_name)

    def live_checkpoint(self, run_name: str) -> str:
        """The streaming checkpoints of one live run (one folder per query generation under it)."""
        return uris.join(self.checkpoints, run_name)

    def state_store(self, run_name: str) -> str:
        """One live run's state stores (a folder per state layout, :mod:`phases._internal.state.keyed_store`): the
        backlog writes the handoff's version 1 there before the manifest names the run."""
        return f"{self.live_run(run_name)}/state-store"

    def increment_intent(self, base_id: str) -> str:
        """The intent file of a catch-up increment of handoff ``base_id`` (:mod:`phases._internal.handoff.intents`)."""
        return f"{self.engine_root.rstrip('/')}/increments/{base_id}.json"

    @property
    def end_of_stream_log(self) -> str:
        """The log of the end-of-stream steps' runs."""
        return f"{self.engine_root.rstrip('/')}/end_of_stream_log"

    def slices(self, table: str) -> str:
        """A table of the daily slices (``partials``, ``log``)."""
        return uris.join(self.engine_root, "slices", table)

    def lease(self, role: str) -> str:
        """The lease file of the pipeline's ``role`` (backlog, live, redeploy) in this generation."""
        return f"{self.engine_root.rstrip('/')}/leases/{self.name}.{role}.json"

    @property
    def redeploy_log(self) -> str:
        """The redeploy log (one per pipeline, in generation 0's folder)."""
        return uris.join(self.base_root, "redeploys")

    @property
    def consumer_sink(self) -> str:
        """The table consumers read (the declared ``sink.path`` where it runs): the serving generation writes it."""
        return self.sink_path_at or self.resolve(self.definition.sink.path)

    def own_sink(self, generation: int | None = None) -> str:
        """Generation ``generation``'s own sink (default: this one's): where it writes while it does not serve."""
        return own_sink(self.base_root, self.generation if generation is None else generation)

    @property
    def sink_path(self) -> str:
        """The table this placement writes: the consumers' when serving, else the generation's own."""
        return self.consumer_sink if self.serving else self.own_sink()

    @property
    def sink_current(self) -> str:
        """A changelog sink's compacted table (latest row per key) beside :attr:`sink_path`."""
        declared = self.definition.sink.current_path
        if self.serving and declared and self.sink_path_at is None:
            return self.resolve(declared)
        return f"{self.sink_path.rstrip('/')}_current"

    def end_of_stream_output(self, step: EndOfStreamStep) -> str:
        """Where an end-of-stream step's output table is: as declared for generation 0, under the generation's folder
        for one a redeploy builds."""
        if self.generation > 0:
            return uris.join(self.engine_root, "end_of_stream", step.name)
        return self.resolve(step.output.path)

    def source_path(self, spec: DeltaSource | FileArchive) -> str:
        """Where a Delta source or a file archive of the definition is read."""
        if self.source_path_at is not None and spec is self.definition.source:
            return self.source_path_at
        if isinstance(spec, PipelineSource):
            return self.upstream(spec).consumer_sink
        return self.resolve(spec.path)

    def upstream(self, spec: PipelineSource) -> Placement:
        """Where the upstream pipeline of ``spec`` runs: the same storage root and brokers as this one, its generation 0
        (:func:`phases._internal.deployment.settle` finds the one that serves). The downstream reads its
        consumer-facing sink, which is :meth:`source_path` of ``spec``."""
        return Placement(spec.upstream, root=self.root, brokers=self.brokers)

    def location(self, spec: SourceSpec) -> str:
        """How messages name a source where it runs (a table's or a folder's path, a topic and its brokers)."""
        if isinstance(spec, KafkaSource):
            return f"kafka topic {spec.topic!r} at {self.source_brokers(spec)}"
        if isinstance(spec, HybridSource):
            return f"{self.location(spec.backlog)}, then {self.location(spec.live)}"
        if isinstance(spec, FileArchive):
            return f"{spec.format.value} files in {self.source_path(spec)}"
        if isinstance(spec, PipelineSource):
            return f"the results of pipeline {spec.upstream.name!r} ({self.source_path(spec)})"
        return self.source_path(spec)

    # --- brokers and topics ----------------------------------------------------------------------------------------

    def source_brokers(self, spec: KafkaSource) -> str:
        """The brokers a topic source reads from: the environment's when placed with brokers, else as declared."""
        return self.brokers or spec.bootstrap_servers

    @property
    def sink_brokers(self) -> str:
        """A topic sink's brokers (the environment's when placed with brokers)."""
        sink = self.definition.sink
        assert isinstance(sink, KafkaSink)
        return self.brokers or sink.bootstrap_servers

    @property
    def declared_topic(self) -> str:
        """A topic sink's topic as consumers know it (generation 0's)."""
        sink = self.definition.sink
        assert isinstance(sink, KafkaSink)
        return self.sink_topic_at or sink.topic

    def topic(self) -> str:
        """The result topic: the declared one, whichever generation serves (a generation a redeploy builds publishes
        nothing until its swap, which publishes its whole result there: :mod:`phases._internal.topics.swap_publish`)."""
        return self.declared_topic
