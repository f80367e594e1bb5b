"""A pipeline's generations: where each version of its definition keeps its tables, and which one serves.

A pipeline starts as **generation 0**, whose tables are where they always were: under ``locations.root`` (state,
manifests, quarantine, checkpoints, live runs, leases) and the sink at ``sink.path``. A redeploy of a definition whose
state has another shape (:mod:`phases._internal.definition.changes`) builds **generation n** beside it, under
``<root>/generations/<n>/``: its own state, manifests, quarantine, live runs and leases, and its own sink
(``<root>/generations/<n>/sink``) while it is not the one consumers read. End-of-stream outputs of a generation n > 0
move under its folder as well.

``sink.path`` is the **consumer-facing** table: the serving generation's live phase writes it. A swap
(:mod:`phases._internal.redeploy.swap`) makes another generation the serving one with one commit on that table.

The **redeploy log** (``<root>/redeploys``, a Delta table, one row per event, its ``kind`` one of :data:`ROW_KINDS`)
says which generation serves: the newest ``swapped`` row's, else 0. A ``swapping`` row with no ``swapped`` row after it
is a swap under way (or cut short by a crash): no live phase of the pipeline starts until a rerun of the redeploy
finishes it. The log also keeps each generation's definition (``started``) and the changes applied to a handoff from now
on (``amended``).

:func:`phases._internal.deployment.place` places a definition as the generation that serves, once at each entry point,
so that a definition keeps working after a swap without naming a generation. The functions here take a placement and
use its generation 0's folder (:attr:`Placement.base_root`: it holds the log) and its consumer-facing sink.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from phases._internal import uris
from phases._internal.errors import PhaseStateError, SourceError
from phases._internal.placement import (
    KIND_COLUMN,
    LEGACY_KIND_COLUMN,
    Generations,
    LogRow,
    Placement,
    generation_root,
    own_sink,
)
from phases._internal.storage import table_stats, tables

__all__ = ["Generations", "LogRow", "generation_root", "own_sink"]  # and the log's reading and writing below

# The commit metadata a swap's copy carries on the consumer-facing table (which redeploy, from which generation to
# which, the handoff), and the one the copy of the table as it was before carries on the old generation's own sink.
SWAP_MARK = "phases_swap"
KEPT_MARK = "phases_kept"

ROW_KINDS = ("started", "amended", "swapping", "swapped", "abandoned", "removed")

SCHEMA = T.StructType(
    [
        T.StructField("pipeline", T.StringType(), False),
        T.StructField("redeploy_id", T.StringType(), False),
        T.StructField(KIND_COLUMN, T.StringType(), False),  # one of ROW_KINDS
        T.StructField("generation", T.LongType(), False),  # the generation the row is about (a swap's target)
        T.StructField("from_generation", T.LongType(), True),  # a swap's previous serving generation
        T.StructField("fingerprint", T.StringType(), True),  # the generation's definition (amended: the new one)
        T.StructField("state_spec", T.StringType(), True),  # its state spec, JSON (to show a later diff)
        T.StructField("manifest_id", T.StringType(), True),  # the handoff a row names (amended, swapped)
        T.StructField("consumer_version", T.LongType(), True),  # swapped: the consumer-facing table's version
        T.StructField("reason", T.StringType(), True),
        T.StructField("detail", T.StringType(), True),  # the diff, or what a swap measured (JSON)
        T.StructField("at_us", T.LongType(), False),
    ]
)


@dataclass(frozen=True)
class SwapCommit:
    """A swap's commit on the consumer-facing table, as its mark describes it."""

    version: int
    redeploy_id: str
    generation: int
    from_generation: int | None
    manifest_id: str | None


def swap_of(commit: dict | None) -> SwapCommit | None:
    """The swap a commit (its commit info) made, if it is a swap's copy."""
    mark = table_stats.commit_metadata(commit).get(SWAP_MARK)
    if not isinstance(mark, dict) or "redeploy" not in mark or "generation" not in mark:
        return None
    return SwapCommit(
        int(commit["version"]),
        str(mark["redeploy"]),
        int(mark["generation"]),
        None if mark.get("from_generation") is None else int(mark["from_generation"]),
        mark.get("manifest_id"),
    )


def kept_of(commit: dict | None) -> int | None:
    """The generation whose results a commit keeps, if it is a swap's copy of the table as it was before."""
    mark = table_stats.commit_metadata(commit).get(KEPT_MARK)
    return int(mark["generation"]) if isinstance(mark, dict) and "generation" in mark else None


def recorded(gens: Generations, swap: SwapCommit) -> bool:
    """Whether the redeploy log records the swap's commit as made (its ``swapped`` row)."""
    return any(s.kind == "swapped" and s.redeploy_id == swap.redeploy_id for s in gens.rows)


def newest_swap(spark: SparkSession | None, path: str, *, redeploy_id: str | None = None) -> SwapCommit | None:
    """The newest swap's commit in the table's history (of redeploy ``redeploy_id``, when given), wherever it is: a
    live phase writes after it. Reads the history back to it (a redeploy, or a start that found the table's log
    ahead of the redeploy log, reads it; not every start)."""
    commits = table_stats.commits_newest_first(spark, path)
    for commit in commits or ():
        found = swap_of(commit)
        if found is not None and (redeploy_id is None or found.redeploy_id == redeploy_id):
            return found
    return None


def unrecorded_swap(spark: SparkSession | None, where: Placement, gens: Generations) -> SwapCommit | None:
    """The consumer-facing table's newest swap when the redeploy log does not record it (the log is behind the
    table: its newest commits were removed, or it was restored from an older backup); None when the log is whole.
    The table's history is read only when a redeploy ever ran (a log with rows, or a generation's folder)."""
    if not gens.rows and not _has_generations(spark, where.base_root):
        return None
    found = newest_swap(spark, where.consumer_sink)
    return found if found is not None and not recorded(gens, found) else None


def _has_generations(spark: SparkSession | None, root: str) -> bool:
    from phases._internal.storage import fs

    path = uris.join(root, "generations")
    if spark is None:
        import os

        return uris.is_local(path) and os.path.isdir(uris.local_path(path))
    return fs.exists(spark, path)


def log_behind_error(where: Placement, swap: SwapCommit) -> PhaseStateError:
    """The refusal of a start that found a swap on the consumer-facing table that the redeploy log does not
    record."""
    return PhaseStateError(
        f"pipeline {where.name!r}: the table consumers read ({where.consumer_sink}) holds, at version "
        f"{swap.version}, the swap of redeploy {swap.redeploy_id} from generation {swap.from_generation} to "
        f"generation {swap.generation}, which the redeploy log {where.redeploy_log} does not record: the log is "
        "behind the table (its newest commits were removed, or it was restored from an older backup). Nothing was "
        f"started. Run the redeploy again with the definition generation {swap.generation} runs "
        "(Redeploy(spark, pipeline).run()): it repairs the log from the table's history, copies nothing, and "
        f"generation {swap.generation} goes on serving; then start its live phase."
    )


def read(spark: SparkSession | None, where: Placement) -> Generations:
    """The pipeline's generations from its redeploy log (no log: generation 0 serves). Read with delta-rs (a few
    rows, no Spark job: every live start reads it), through Spark when delta-rs cannot read the log (store settings
    given to Spark only; without a ``spark`` session that is a SourceError)."""
    path, name = where.redeploy_log, where.name
    _refuse_gaps(path)
    try:
        found = table_stats.rows(path, where=("pipeline", name))
        if found is None:
            return Generations()
    except SourceError as exc:
        if spark is None:
            raise damaged_log_error(path, str(exc)) from exc
        if not tables.exists(spark, path):
            return Generations()
        try:
            found = [r.asDict() for r in spark.read.format("delta").load(path).where(f"pipeline = '{name}'").collect()]
        except Exception as err:  # noqa: BLE001 - Spark's own error, named with the way out
            raise damaged_log_error(path, str(err).splitlines()[0]) from err
    return Generations.of([LogRow.of(row) for row in found])


def _kind_column(spark: SparkSession, path: str) -> str:
    """The name of the kind column in the log at ``path``: ``kind``, or ``step`` in a log written before 2026-12."""
    try:
        columns = set(table_stats.column_types(path))
    except SourceError:  # a store delta-rs cannot read: ask Spark
        columns = set(spark.read.format("delta").load(path).columns) if tables.exists(spark, path) else set()
    return LEGACY_KIND_COLUMN if LEGACY_KIND_COLUMN in columns and KIND_COLUMN not in columns else KIND_COLUMN


def damaged_log_error(path: str, what: str) -> PhaseStateError:
    """The refusal of anything that reads a redeploy log it cannot read whole."""
    return PhaseStateError(
        f"the redeploy log {path} cannot be read whole: {what}. It says which generation serves the pipeline's sink, "
        "so nothing was run. To proceed: restore the log's missing or damaged commit files (its _delta_log folder) "
        "from a backup of that folder; the sink's history lets a rerun of the redeploy repair a log that is only "
        "behind it (Redeploy(spark, pipeline).run())."
    )


def _refuse_gaps(path: str) -> None:
    """A local log with a commit missing between others (removed by hand) is refused naming it; Delta would raise
    DELTA_VERSIONS_NOT_CONTIGUOUS from inside Spark."""
    import os

    if not uris.is_local(path):
        return
    folder = os.path.join(uris.local_path(path), "_delta_log")
    if not os.path.isdir(folder):
        return
    names = os.listdir(folder)
    versions = sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
    checkpoints = [int(n.split(".")[0]) for n in names if n.endswith(".checkpoint.parquet") and n[:1].isdigit()]
    first = max([c for c in checkpoints if c <= (versions[-1] if versions else -1)], default=None)
    needed = [v for v in versions if first is None or v > first]
    if not needed:
        return
    start = first + 1 if first is not None else needed[0]
    missing = sorted(set(range(start, needed[-1] + 1)) - set(needed))
    if missing or (first is None and needed[0] != 0):
        gone = missing or list(range(0, needed[0]))
        raise damaged_log_error(
            path, f"its commits are not contiguous: commit file(s) {', '.join(f'{v:020d}.json' for v in gone)} missing"
        )


def write(spark: SparkSession, where: Placement, kind: str, generation: int, redeploy_id: str, **values) -> LogRow:
    """Appends one row of ``kind`` (one of :data:`ROW_KINDS`) to the pipeline's redeploy log (one commit)."""
    if kind not in ROW_KINDS:
        raise PhaseStateError(f"a redeploy log row's kind {kind!r} is not one of {', '.join(ROW_KINDS)}")
    path = where.redeploy_log
    _refuse_gaps(path)
    row: dict[str, Any] = {f.name: None for f in SCHEMA.fields}
    row.update(values)
    row.update(pipeline=where.name, redeploy_id=redeploy_id, generation=generation, at_us=time.time_ns() // 1000)
    row[KIND_COLUMN] = kind
    column = _kind_column(spark, path)
    if column == KIND_COLUMN:
        tables.append_row(spark, path, SCHEMA, row)
    else:  # an existing log that names the column ``step``
        legacy = T.StructType(
            [T.StructField(column, f.dataType, f.nullable) if f.name == KIND_COLUMN else f for f in SCHEMA.fields]
        )
        tables.append_row(spark, path, legacy, {column if k == KIND_COLUMN else k: v for k, v in row.items()})
    return LogRow(**row)


def retired_since(gens: Generations, n: int) -> int | None:
    """When generation ``n`` last stopped serving (µs: the newest swap away from it); None while it serves, or when
    it never served and nothing replaced it."""
    if n == gens.serving or n in gens.gone:
        return None
    away = [s.at_us for s in gens.rows if s.kind == "swapped" and s.from_generation == n]
    if away:
        return max(away)
    newer = [s.at_us for s in gens.rows if s.kind == "started" and s.generation > n]  # built, never swapped in
    built = [s.at_us for s in gens.rows if s.kind == "started" and s.generation == n]
    return max(newer) if newer and built and max(newer) > max(built) else None


def _folders(where: Placement, n: int) -> list[str]:
    """The folders that hold generation ``n``'s tables (generation 0's: the ones under ``locations.root``)."""
    root = where.base_root
    if n > 0:
        return [generation_root(root, n)]
    zero = where.at(0, serving=True)
    folders = [zero.state_root, zero.manifests, zero.quarantine, zero.checkpoints, zero.live_root]
    return [*folders, uris.join(root, "generations", "0")]  # and its own sink


def remove_retired(spark: SparkSession, where: Placement, *, now_us: int | None = None) -> list[int]:
    """Removes the tables of the generations that stopped serving longer than ``maintenance.retain`` ago (a
    rollback to them then needs a backlog again); returns their numbers. Holds the pipeline's redeploy lease, so
    no redeploy runs meanwhile; a ``removed`` row goes into the redeploy log before the files go."""
    from phases._internal.coordination import leases
    from phases._internal.storage import fs

    retain = where.definition.maintenance.retain
    now_us = now_us if now_us is not None else time.time_ns() // 1000
    retain_us = int(retain.total_seconds() * 1e6)
    zero = where.at(0, serving=True)  # the redeploy lease is generation 0's
    with leases.hold(spark, zero, "redeploy", f"maintenance {now_us}"):
        gens = read(spark, where)
        if gens.swap_under_way is not None:
            return []
        removed = []
        for n in gens.retained():
            since = retired_since(gens, n)
            if since is None or now_us - since < retain_us:
                continue
            write(spark, where, "removed", n, "maintenance", reason=f"retired more than {retain}")
            for folder in _folders(where, n):
                fs.delete(spark, folder)
            removed.append(n)
        return removed
