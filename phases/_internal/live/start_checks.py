"""What a live start checks of the tables it writes against the handoff it starts from, before anything runs.

The progress log describes the live phase's own writes, and
:meth:`phases._internal.live.micro_batch.IncrementalLive.prepare` checks every table against it. Before the first live
write of a table, the handoff is the only record of what the table must hold: the backlog's sink commit
(``sink_version`` in the manifest), or the swap's copy that made the generation serve, and the quarantine's rows of the
backlog (``quarantine_version``). A table missing, behind that, or changed since by a commit that is neither the
handoff's nor this run's (a ``RESTORE`` to an earlier backlog, a removal and re-creation, another generation's swap)
would stay wrong for good: later micro-batches only touch the keys they change. Such a start is refused with
:class:`phases._internal.errors.LiveResumeError` and the way out.

The same walk down the table's history finds a swap that the redeploy log does not record (the log is behind the
table): that start is refused with the redeploy that repairs the log.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from phases._internal.definition import Pipeline
from phases._internal.deployment import generations
from phases._internal.errors import LiveResumeError, ManifestError, PhasesError
from phases._internal.handoff.manifest import HandoffManifest
from phases._internal.live.plan import Progress
from phases._internal.placement import Placement
from phases._internal.storage import live_writes, table_stats, tables

# Commits a walk down the table's history reads at most past the first one it cannot explain, looking for a swap the
# redeploy log does not record (which names a better way out).
_LOOK_PAST = 64
# Operations on the quarantine (which other writers append to) that take rows out of it.
_REMOVES_ROWS = {"RESTORE", "DELETE", "TRUNCATE", "REPLACE TABLE", "CREATE OR REPLACE TABLE", "REPLACE TABLE AS SELECT"}


def way_out(pipeline: Pipeline) -> str:
    return (
        "Nothing was started. To proceed: restore the table to the version the handoff left it at (or later, with only "
        f"this live run's writes after it); or start over: BacklogRunner(spark, pipeline).run(reset=True) for pipeline "
        f"{pipeline.name!r} (a new backlog over every version, then a new switch)"
    )


def refuse_missing_tables(
    spark: SparkSession, where: Placement, handoff: HandoffManifest | None, writes: dict, targets: dict[str, str]
) -> None:
    """Before the run creates its tables: every table the progress log records a live write to must be there
    (``writes``: what -> micro-batch; ``targets``: what -> table); the sink must be there (the handoff wrote it, or a
    swap copied it); the quarantine must hold the backlog's rows until the live phase recorded a write of its own
    there."""
    pipeline = where.definition
    for what, path in sorted(targets.items()):
        if what in writes and not tables.exists(spark, path):
            raise LiveResumeError(
                f"the live phase of {pipeline.name!r} cannot start: {path} is missing, where the progress log records "
                f"its {what!r} write of micro-batch {writes[what]}. " + way_out(pipeline)
            )
    if handoff is None:
        return
    sink = where.sink_path
    if not tables.exists(spark, sink):
        raise LiveResumeError(
            f"the live phase of {pipeline.name!r} cannot start from handoff {handoff.manifest_id}: its sink {sink} is "
            f"missing (the handoff left it at version {handoff.sink_version}, {_rows(handoff.sink_rows)}). A new empty "
            "sink would hold only the keys the live phase changes. " + way_out(pipeline)
        )
    if handoff.quarantine_version is None or {"quarantine", "quarantine_right"} & set(writes):
        return
    if not handoff.quarantined_rows:
        return
    path = where.quarantine
    head = tables.version(spark, path) if tables.exists(spark, path) else None
    problem = None
    if head is None:
        problem = "is missing"
    elif head < handoff.quarantine_version:
        problem = f"is at version {head}, behind the handoff's version {handoff.quarantine_version}"
    else:
        for commit in table_stats.commits_newest_first(spark, path) or ():
            if int(commit["version"]) <= handoff.quarantine_version:
                break
            if commit.get("operation") in _REMOVES_ROWS:
                problem = f"has a {commit.get('operation')} commit (version {commit['version']}) after the handoff's"
                break
    if problem is not None:
        raise LiveResumeError(
            f"the live phase of {pipeline.name!r} cannot start from handoff {handoff.manifest_id}: its quarantine "
            f"{path} {problem}, where the backlog quarantined {handoff.quarantined_rows} rows. " + way_out(pipeline)
        )


def refuse_sink_not_as_handed_off(
    spark: SparkSession,
    where: Placement,
    handoff: HandoffManifest | None,
    run_name: str,
    writes: dict,
    gens: generations.Generations,
) -> None:
    """Walks the sink's history from its newest commit down to what this start may build on: this live run's newest
    write, the swap's copy that made this generation serve (or the copy of its kept results), or, before its first
    live write, the handoff's sink commit. A commit on the way that is none of these refuses the start; so does a
    swap the redeploy log does not record (:func:`phases._internal.deployment.generations.log_behind_error`)."""
    if handoff is None:
        return
    pipeline = where.definition
    path = where.sink_path
    generation = where.generation
    consumer = where.serving
    handoff_wrote_here = (generation == 0) == consumer  # generation 0's backlog writes the consumer-facing table
    first_write = not ({"sink", "upsert"} & set(writes))
    own = {live_writes.app_id(pipeline.name, run_name, what) for what in live_writes.LIVE_WRITES}
    unexplained: list[dict] = []
    head: int | None = None

    def _builds_on(commit: dict, swap: generations.SwapCommit | None, version: int) -> bool:
        """Whether this start may build on the table as this commit left it."""
        if swap is not None:  # the swap's copy that made this generation serve
            return consumer and swap.generation == generation
        mark = table_stats.write_mark(commit)
        if mark is not None and mark[0] in own:  # this live run's newest write
            return True
        return not consumer and generations.kept_of(commit) == generation  # its results, kept as it stopped serving

    for commit in table_stats.commits_newest_first(spark, path) or ():
        version = int(commit["version"])
        if (
            not handoff_wrote_here
            and first_write
            and not unexplained
            and version == handoff.sink_version
            and handoff.sink_commit_ms is not None
            and table_stats.commit_ms(commit) == handoff.sink_commit_ms
        ):
            # A catch-up increment made while this generation does not serve (a rollback's, of a generation whose
            # live phase never started) wrote its own sink: the handoff's write, by version and time.
            return
        if head is None:
            head = version
            if handoff_wrote_here and first_write and head < handoff.sink_version:
                raise LiveResumeError(
                    f"the live phase of {pipeline.name!r} cannot start from handoff {handoff.manifest_id}: its sink "
                    f"{path} is at version {head}, behind the version {handoff.sink_version} the handoff left it at "
                    f"({_rows(handoff.sink_rows)}): its newest commits were removed or it was restored from an older "
                    "backup. " + way_out(pipeline)
                )
        if handoff_wrote_here and first_write and not unexplained and version <= handoff.sink_version:
            # The handoff's own commit, or the table is not the one the handoff wrote.
            if version == handoff.sink_version and handoff.sink_commit_ms in (None, table_stats.commit_ms(commit)):
                return
            unexplained.append(commit)
            break
        if not table_stats.changes_rows(commit):
            continue
        swap = generations.swap_of(commit)
        if swap is not None and not generations.recorded(gens, swap):
            raise generations.log_behind_error(where, swap)
        if unexplained:
            if len(unexplained) >= _LOOK_PAST:
                break
            unexplained.append(commit)
            continue
        if _builds_on(commit, swap, version):
            return
        unexplained.append(commit)
    if head is None:
        return  # no table: refuse_missing_tables said so before the run created it
    if not first_write:
        return  # the progress log names this run's newest write: IncrementalLive.prepare refuses a table without it
    first = unexplained[0] if unexplained else None
    what = (
        f"its commit {first['version']} ({first.get('operation')}) is neither the handoff's write (version "
        f"{handoff.sink_version}), nor the swap that made generation {generation} serve, nor a write of this live run"
        if first is not None
        else "its history holds neither the handoff's write nor a write of this live run"
    )
    raise LiveResumeError(
        f"the live phase of {pipeline.name!r} cannot start from handoff {handoff.manifest_id}: its sink {path} is not "
        f"as the handoff or this run left it: {what} (a restore to an earlier backlog, a removal and re-creation, or "
        "another writer). The live phase would only add to it. " + way_out(pipeline)
    )


def _rows(n: int | None) -> str:
    return "its rows unknown" if n is None else f"{n} rows"


def after_a_swap(spark: SparkSession | None, where: Placement, exc: ManifestError) -> PhasesError:
    """A definition that does not match the serving generation's handoff: when a redeploy swapped another
    definition in, the refusal says so and names the rollback; when the table consumers read holds a swap the
    redeploy log lost, it names the redeploy that repairs the log."""
    declared, gens = where.definition, where.redeploys
    unrecorded = generations.unrecorded_swap(spark, where, gens)
    if unrecorded is not None:
        return generations.log_behind_error(where, unrecorded)
    swapped = [s for s in gens.rows if s.kind == "swapped"]
    if not swapped:
        return exc
    last = swapped[-1]
    kept = [n for n in gens.retained() if n != gens.serving and where.is_fingerprint(gens.fingerprints.get(n))]
    how = (
        f"its generation {kept[-1]} is kept, so a rollback needs no backlog"
        if kept
        else "a rollback builds it again as a new generation"
    )
    return ManifestError(
        f"{exc}; generation {gens.serving} serves pipeline {declared.name!r} since redeploy {last.redeploy_id} "
        f"swapped it in (from generation {last.from_generation}). To run this definition, roll back: "
        f"Redeploy(spark, pipeline).run() with it ({how}); to go on, start the live phase of the definition that "
        "serves."
    )


def refuse_tables_behind_the_log(
    spark: SparkSession,
    name: str,
    run_name: str,
    record: Progress,
    latest_id: int,
    targets: dict[str, str],
    folders: tuple[str, str],
) -> None:
    """Every start: each table the live phase writes must hold the newest write the progress log says it made
    (a table restored from an older backup, or whose newest commits were removed, would otherwise stay wrong
    for good: later micro-batches only add to it). One that does not is refused, naming what it holds. ``targets``:
    what -> the table the run writes it to; ``folders``: the run's checkpoint and progress log."""
    checkpoints, progress_root = folders
    behind = []
    for what, batch in sorted((record.writes or {}).items()):
        path = targets.get(what)
        if path is None:
            continue
        app = live_writes.app_id(name, run_name, what)
        holds = table_stats.applied_transactions(spark, path, [app]).get(app)
        if holds is None or holds < batch:
            held = f"micro-batch {holds}" if holds is not None else "none of this run's writes"
            behind.append(f"{path} holds {held} of its {what!r} writes, the progress log expects micro-batch {batch}")
    if behind:
        raise LiveResumeError(
            f"the live phase of {name!r} cannot resume exactly: tables are behind its progress log "
            f"(whose newest record is micro-batch {latest_id}): "
            + "; ".join(behind)
            + ". They were restored from an older backup, or their newest commits were removed; the live phase "
            "would never write those micro-batches again. Nothing was started. To proceed: restore each such "
            "table to its newest version; or restore the run's tables, its checkpoint "
            f"{checkpoints} and its progress log {progress_root} together, from one backup; or "
            "start over: BacklogRunner(spark, pipeline).run(reset=True)"
        )
