"""The results a generation served, kept for a rollback once a swap replaced them.

A swap overwrites the consumer-facing table with the new generation's rows in one commit
(:mod:`phases._internal.redeploy.swap`); the table's version just before that commit holds what the previous
generation served. A copy of that version into the previous generation's own sink (its place when it does not
serve) is what a rollback swaps back. The copy is not made inside the time without fresh results: the new
generation's live start makes it once its first micro-batch is recorded (:meth:`LiveRunner.start`), and whatever
comes first of a redeploy (a rollback above all) and the maintenance makes it when it is still missing. Until then
Delta's history holds that version: the maintenance makes the copy before it vacuums the consumer-facing table.

The copy carries the ``phases_kept`` mark (the generation, the redeploy whose swap replaced it, the consumer-facing
table's version it copies), by which the generation's later live start recognises it and by which a copy already
made is never made twice. The copy is made under the pipeline's redeploy lease: two makers never overwrite each
other's.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from pyspark.sql import SparkSession

from phases._internal.coordination import leases
from phases._internal.deployment import generations
from phases._internal.errors import LeaseHeld
from phases._internal.placement import LogRow, Placement
from phases._internal.runtime.session import background_jobs
from phases._internal.storage import fs, table_stats, tables

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kept:
    """A copy made: generation ``generation``'s results as the swap of ``redeploy_id`` replaced them (the
    consumer-facing table at ``consumer_version``), in ``seconds``."""

    generation: int
    redeploy_id: str
    consumer_version: int
    seconds: float


def write_mark_of(spark: SparkSession, path: str, version: int | None = None) -> dict | None:
    """The write mark (``{"app": ..., "batch": ...}``) of the table's newest commit that changed rows (up to
    ``version``), if it has one."""
    commit = table_stats.newest_row_commit(spark, path, at_or_before=version)
    mark = table_stats.commit_metadata(commit).get(table_stats.WRITE_MARK)
    return mark if isinstance(mark, dict) else None


def copy_sink(
    spark: SparkSession,
    source: str,
    target: str,
    *,
    swap: dict | None = None,
    kept: dict | None = None,
    version: int | None = None,
) -> int:
    """Overwrites ``target`` with the rows of ``source`` (at ``version``, default its newest; its schema too) in one
    commit that carries ``source``'s newest write mark up to then and, when given, the ``swap`` mark (the swap's
    copy) or the ``kept`` mark (the copy of a generation's results as it stopped serving). Returns ``target``'s new
    version."""
    metadata: dict = {}
    mark = write_mark_of(spark, source, version)
    if mark is not None:
        metadata[table_stats.WRITE_MARK] = mark
    if swap is not None:
        metadata[generations.SWAP_MARK] = swap
    if kept is not None:
        metadata[generations.KEPT_MARK] = kept
    fs.sweep_orphan_checksums(target)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    writer = reader.load(source).write.format("delta").mode("overwrite")
    writer = writer.option("overwriteSchema", "true")
    if metadata:
        writer = writer.option("userMetadata", json.dumps(metadata, separators=(",", ":")))
    writer.save(target)
    return tables.version(spark, target)


def pending(spark: SparkSession, where: Placement, gens: generations.Generations) -> LogRow | None:
    """The newest swap (its ``swapped`` row) whose previous generation's results are not kept yet; None when there
    is none, or that generation is gone (abandoned, removed)."""
    swapped = [row for row in gens.rows if row.kind == "swapped"]
    if not swapped:
        return None
    row = max(swapped, key=lambda r: r.at_us)
    old = row.from_generation
    if old is None or row.consumer_version is None or old not in gens.retained():
        return None
    return None if _kept_for(spark, where.own_sink(old), row.redeploy_id) else row


def _kept_for(spark: SparkSession, own_sink: str, redeploy_id: str) -> bool:
    """Whether the generation's own sink holds the copy of its results that the swap of ``redeploy_id`` replaced:
    its newest commit with a kept mark (live writes of a rollback's catch-up may follow it) names that redeploy."""
    for commit in table_stats.commits_newest_first(spark, own_sink) or ():
        mark = table_stats.commit_metadata(commit).get(generations.KEPT_MARK)
        if isinstance(mark, dict):
            return mark.get("redeploy") == redeploy_id
    return False


def keep_previous(
    spark: SparkSession, where: Placement, holder: str, gens: generations.Generations | None = None
) -> Kept | None:
    """Makes the pending copy (:func:`pending`) under the pipeline's redeploy lease, taken as ``holder`` (re-entrant:
    a redeploy that holds it makes the copy within). Returns what was made; None when nothing was pending, or when
    another holder has the lease (a redeploy under way makes the copy itself before it plans). ``gens``: the log as
    the caller just read it; with nothing pending there, neither the lease nor the log is touched again."""
    base = where.at(0, serving=True)  # generation 0's place holds the redeploy log and the redeploy lease
    if gens is not None and pending(spark, base, gens) is None:
        return None
    try:
        with leases.hold(spark, base, "redeploy", holder):
            gens = generations.read(spark, base)
            row = pending(spark, base, gens)
            if row is None:
                return None
            assert row.from_generation is not None and row.consumer_version is not None, "pending() checked both"
            version = row.consumer_version - 1
            t = time.perf_counter()
            copy_sink(
                spark,
                base.consumer_sink,
                base.own_sink(row.from_generation),
                version=version,
                kept={"generation": row.from_generation, "redeploy": row.redeploy_id, "consumer_version": version},
            )
            made = Kept(row.from_generation, row.redeploy_id, version, time.perf_counter() - t)
    except LeaseHeld as exc:
        log.info("pipeline %s: the copy kept for a rollback is left to the redeploy under way (%s)", where.name, exc)
        return None
    log.info(
        "pipeline %s: generation %s's results (the sink at version %s) kept for a rollback in %.2f s",
        where.name,
        made.generation,
        made.consumer_version,
        made.seconds,
    )
    return made


def keep_after_start(
    spark: SparkSession, where: Placement, holder: str, gens: generations.Generations | None
) -> Kept | None:
    """:func:`keep_previous` for a live start whose query already runs: a failed copy does not fail the start (the
    live phase serves either way). It is logged and the copy stays pending: the next live start, redeploy or
    maintenance makes it, and a redeploy or the maintenance fails loudly if it cannot."""
    try:
        # In the background pool: the copy yields the cores to the micro-batches of the query that already runs.
        with background_jobs(spark):
            return keep_previous(spark, where, holder, gens)
    except Exception as exc:  # noqa: BLE001 - logged; the copy stays pending (the table's history holds it)
        said = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        log.warning("pipeline %s: the copy kept for a rollback was not made, still pending: %s", where.name, said)
        return None
