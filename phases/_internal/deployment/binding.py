"""A definition placed where it runs, once: :func:`place`.

A :class:`phases.Pipeline` is the user's definition and nothing else. Where it runs is decided once, at each entry
point (a runner's constructor, an orchestrator's resource), by :func:`place`: the storage root its relative paths
resolve under, the environment's brokers, and its **generation** (:mod:`phases._internal.deployment.generations`):
the redeploy log is read once and names the generation that serves the table consumers read.

The result, a :class:`phases._internal.deployment.placement.Placement`, is immutable; the runners, sensors and checks
take it and never place again. A redeploy places the generation it builds with :meth:`Placement.at` (its own sink,
not the consumers').

A running phase checks again at its start that its generation still serves (:func:`require_serving`): a runner
built before a swap and started after it is refused, rather than writing the old definition's results into the new
generation's table.
"""

from __future__ import annotations

import time

from pyspark.sql import SparkSession

from phases._internal.definition import Pipeline
from phases._internal.deployment import generations
from phases._internal.deployment.kept import keep_previous
from phases._internal.errors import PhaseStateError
from phases._internal.placement import Placement
from phases._internal.storage import maintenance

__all__ = ["Placement", "maintain", "maintain_placed", "place", "require_serving", "settle", "under_way_error"]


def place(
    spark: SparkSession | None,
    pipeline: Pipeline,
    *,
    root: str | None = None,
    kafka_bootstrap_servers: str | None = None,
    strict: bool = True,
) -> Placement:
    """Where ``pipeline`` runs: its relative paths under ``root`` (absolute paths and URIs stay) and its topics at
    ``kafka_bootstrap_servers`` when given, as the generation that serves it. Reads the redeploy log once (``spark``
    None: with delta-rs).

    While a swap is under way the consumer-facing table is between two generations: ``strict`` refuses
    (:class:`phases._internal.errors.PhaseStateError`, naming the redeploy that finishes it); not ``strict`` (what a
    sensor, a check or a catalog shows) gives the generation the swap started from, which served until then."""
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"place() takes a phases.Pipeline, not {type(pipeline).__name__}")
    return settle(spark, Placement(pipeline, root=root or None, brokers=kafka_bootstrap_servers or None), strict=strict)


def settle(spark: SparkSession | None, where: Placement, *, strict: bool = True) -> Placement:
    """``where`` as the generation that serves it now (the redeploy log read once); see :func:`place`."""
    gens = generations.read(spark, where)
    under_way = gens.swap_under_way
    if under_way is not None and strict:
        raise under_way_error(where, under_way)
    serving = gens.serving if under_way is None or under_way.from_generation is None else under_way.from_generation
    return where.at(serving, serving=True, redeploys=gens)


def require_serving(spark: SparkSession | None, placed: Placement) -> generations.Generations:
    """At a start that writes the consumer-facing table: refuses (PhaseStateError) unless the placement's
    generation serves now, naming the serving generation and the way (a rollback, or a redeploy). Reads the redeploy
    log again (a swap may have happened since it was placed); returns it. A log behind the table is found by
    the live start's check of the table's history (:mod:`phases._internal.live.start_checks`)."""
    gens = generations.read(spark, placed)
    if not placed.serving:
        return gens
    name, bound = placed.name, placed.generation
    under_way = gens.swap_under_way
    if under_way is not None:
        raise under_way_error(placed, under_way)
    if gens.serving != bound:
        swapped = [s for s in gens.rows if s.kind == "swapped" and s.generation == gens.serving]
        by = f" (swapped in by redeploy {swapped[-1].redeploy_id})" if swapped else ""
        raise PhaseStateError(
            f"pipeline {name!r}: generation {gens.serving} serves the table consumers read"
            f"{by}, not generation {bound}, which this runner was built for (before the swap). Nothing was started. "
            f"To run this definition again, roll back: Redeploy(spark, pipeline).run() with it (its generation is "
            f"kept: no backlog); to go on with generation {gens.serving}, build the runner again from the definition "
            "it runs (LiveRunner.from_manifest(spark, pipeline))."
        )
    return gens


def under_way_error(placed: Placement, under_way: generations.LogRow) -> PhaseStateError:
    return PhaseStateError(
        f"pipeline {placed.name!r}: a swap of its sink from generation {under_way.from_generation} to generation "
        f"{under_way.generation} is under way (redeploy {under_way.redeploy_id}), or was cut short: no live phase "
        "that writes the sink starts until it is finished. Run the redeploy again "
        "(Redeploy(spark, pipeline).run()): it finishes the swap, or makes it again."
    )


def maintain(spark: SparkSession, pipeline: Pipeline) -> dict[str, dict]:
    """Compacts the append-only engine tables and vacuums every engine table and the sink with the pipeline's
    retention (:func:`phases._internal.storage.maintenance.maintain_tables`). First removes the generations a redeploy
    retired longer than that ago (:func:`phases._internal.deployment.generations.remove_retired`; under the key
    ``retired_generations``), then maintains the generation that serves. Returns, per table, the files ``OPTIMIZE``
    removed and whether it was vacuumed. Where the pipeline runs elsewhere than declared: :func:`maintain_placed`."""
    return maintain_placed(spark, Placement(pipeline))


def maintain_placed(spark: SparkSession, where: Placement) -> dict[str, dict]:
    """:func:`maintain` of a pipeline where ``where`` places it."""
    removed = generations.remove_retired(spark, where)
    # The previous generation's results, if no live start kept them yet: before the vacuum removes their files.
    kept = keep_previous(spark, where, f"maintenance {time.time_ns() // 1000}")
    report = maintenance.maintain_tables(spark, settle(spark, where, strict=False))
    if kept is not None:
        report["kept_for_rollback"] = {"generation": kept.generation, "consumer_version": kept.consumer_version}
    if removed:
        report["retired_generations"] = {"removed": removed}
    return report
