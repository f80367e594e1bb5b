"""A definition bound to where it runs, once: the :class:`Deployment`.

A :class:`phases.Pipeline` is the user's definition and nothing else. Where it runs is decided once, at each entry
point (a runner's constructor, an orchestrator's resource), by :func:`deploy`:

* its relative paths under the deployment's storage root, and its Kafka sources pointed at the environment's brokers
  (:func:`phases._internal.deployment.paths.resolve_paths`), when a root or brokers are given;
* its **generation** (:mod:`phases._internal.deployment.generations`): the redeploy log is read once and names the
generation that
  serves the table consumers read; the deployment's tables are that generation's (its folder under
  ``<root>/generations/<n>`` for n > 0) and it writes the consumer-facing sink.

The result is immutable; the runners, sensors and checks take it and never bind again. A redeploy binds the
generation it builds with :func:`bind` (its own sink, not the consumers').

A running phase checks again at its start that its generation still serves (:func:`require_serving`): a runner
built before a swap and started after it is refused, rather than writing the old definition's results into the new
generation's table.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession

from phases._internal import uris
from phases._internal.definition import Pipeline
from phases._internal.deployment import generations
from phases._internal.deployment.paths import resolve_paths
from phases._internal.errors import PhaseStateError
from phases._internal.storage import maintenance

__all__ = ["Deployment", "bind", "deploy", "maintain", "require_serving"]


@dataclass(frozen=True)
class Deployment:
    """A definition bound to where it runs.

    ``definition``: the user's pipeline, its paths where it runs (as declared: no generation in it). ``generation``:
    the generation whose tables this deployment reads and writes; ``serving``: whether it writes the table consumers
    read (``definition.sink.path``), else the generation's own sink. ``pipeline``: the definition with that
    generation's paths, which the engine's phases read and write. ``redeploys``: the redeploy log as read when bound.
    """

    definition: Pipeline
    generation: int
    serving: bool
    pipeline: Pipeline
    redeploys: generations.Generations = generations.Generations()

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def redeployed(self) -> bool:
        """Whether a redeploy ever ran for the pipeline (its log has rows)."""
        return bool(self.redeploys.rows)


def bind(
    definition: Pipeline, generation: int, *, serving: bool, redeploys: generations.Generations | None = None
) -> Deployment:
    """``definition`` (as declared, its paths where it runs) as ``generation``: its engine tables under the
    generation's folder, its sink the consumer-facing table when ``serving``, else the generation's own sink (a topic
    sink's topic stays as declared: each generation writes a topic of its own,
    :func:`phases._internal.topics.sink.generation_topic`). Reads nothing."""
    root = definition.locations.root
    update: dict = {
        "locations": definition.locations.model_copy(update={"root": generations.generation_root(root, generation)})
    }
    if not serving:
        sink = generations.own_sink(root, generation)
        sink_update: dict = {"path": sink}
        if definition.sink.mode == "changelog":
            sink_update["current_path"] = f"{sink}_current"
        update["sink"] = definition.sink.model_copy(update=sink_update)
    if generation > 0 and definition.end_of_stream:
        folder = uris.join(generations.generation_root(root, generation), "end_of_stream")
        update["end_of_stream"] = [
            s.model_copy(update={"output": s.output.model_copy(update={"path": uris.join(folder, s.name)})})
            for s in definition.end_of_stream
        ]
    pipeline = definition.model_copy(update=update)
    return Deployment(definition, generation, serving, pipeline, redeploys or generations.Generations())


def deploy(
    spark: SparkSession | None,
    pipeline: Pipeline | Deployment,
    *,
    root: str | None = None,
    kafka_bootstrap_servers: str | None = None,
    strict: bool = True,
) -> Deployment:
    """The deployment of ``pipeline``: its paths under ``root`` (relative ones; absolute paths and URIs stay) and its
    Kafka sources at ``kafka_bootstrap_servers`` when given, bound to the generation that serves it. Reads the
    redeploy log once (``spark`` None: with delta-rs). A :class:`Deployment` is returned as it is.

    While a swap is under way the consumer-facing table is between two generations: ``strict`` refuses
    (:class:`phases._internal.errors.PhaseStateError`, naming the redeploy that finishes it); not ``strict`` (what a
    sensor, a check or a catalog shows) gives the generation the swap started from, which served until then."""
    if isinstance(pipeline, Deployment):
        return pipeline
    definition = pipeline
    if root is not None or kafka_bootstrap_servers:
        definition = resolve_paths(pipeline, root or "", kafka_bootstrap_servers)
    gens = generations.read(spark, definition)
    under_way = gens.swap_under_way
    if under_way is not None and strict:
        raise under_way_error(definition, under_way)
    serving = under_way.from_generation if under_way is not None else gens.serving
    return bind(definition, serving, serving=True, redeploys=gens)


def require_serving(spark: SparkSession | None, deployment: Deployment) -> generations.Generations:
    """At a start that writes the consumer-facing table: refuses (PhaseStateError) unless the deployment's
    generation serves now, naming the serving generation and the way (a rollback, or a redeploy). Reads the redeploy
    log again (a swap may have happened since the deployment was bound); returns it. A log behind the table is found by
    the live start's check of the table's history (:mod:`phases._internal.live.start_checks`)."""
    gens = generations.read(spark, deployment.definition)
    if not deployment.serving:
        return gens
    name, bound = deployment.name, deployment.generation
    under_way = gens.swap_under_way
    if under_way is not None:
        raise under_way_error(deployment.definition, under_way)
    if gens.serving != bound:
        swapped = [s for s in gens.rows if s.step == "swapped" and s.generation == gens.serving]
        by = f" (swapped in by redeploy {swapped[-1].redeploy_id})" if swapped else ""
        raise PhaseStateError(
            f"pipeline {name!r}: generation {gens.serving} serves the table consumers read"
            f"{by}, not generation {bound}, which this runner was built for (before the swap). Nothing was started. "
            f"To run this definition again, roll back: Redeploy(spark, pipeline).run() with it (its generation is "
            f"kept: no backlog); to go on with generation {gens.serving}, build the runner again from the definition "
            "it runs (LiveRunner.from_manifest(spark, pipeline))."
        )
    return gens


def under_way_error(definition: Pipeline, under_way: generations.LogRow) -> PhaseStateError:
    return PhaseStateError(
        f"pipeline {definition.name!r}: a swap of its sink from generation {under_way.from_generation} to generation "
        f"{under_way.generation} is under way (redeploy {under_way.redeploy_id}), or was cut short: no live phase "
        "that writes the sink starts until it is finished. Run the redeploy again "
        "(Redeploy(spark, pipeline).run()): it finishes the swap, or makes it again."
    )


def maintain(spark: SparkSession, pipeline: Pipeline | Deployment) -> dict[str, dict]:
    """Compacts the append-only engine tables and vacuums every engine table and the sink with the pipeline's
    retention (:func:`phases._internal.storage.maintenance.maintain_tables`). For a definition, first removes the
    generations a redeploy retired longer than that ago (:func:`phases._internal.deployment.generations.remove_retired`;
    under the key
    ``retired_generations``), then binds it to the generation that serves; a :class:`Deployment` is maintained as
    bound (no generation removed). Returns, per table, the files ``OPTIMIZE`` removed and whether it was vacuumed."""
    removed = generations.remove_retired(spark, pipeline) if isinstance(pipeline, Pipeline) else []
    report = maintenance.maintain_tables(spark, deploy(spark, pipeline, strict=False).pipeline)
    if removed:
        report["retired_generations"] = {"removed": removed}
    return report
