"""Where a live run resumes: its checkpoint, its progress log and its tables' transactions reconciled.

A live run keeps three records of how far it got:

- Spark's checkpoint of its query (``offsets/N`` is written before micro-batch N runs, ``commits/N`` after);
- its progress log (:mod:`phases._internal.coordination.progress_log`): what micro-batch N applied, as source positions;
- the idempotent-write ids its tables keep (``txnAppId`` / ``txnVersion``, or a marked write's commit metadata, =
  the progress-log batch id: :mod:`phases._internal.storage.live_writes`).

Operators lose files: a wrong clean-up job, a restore of only the tables, a moved bucket. A new query on a lost
checkpoint numbers its micro-batches from 0 again, and writes tagged with numbers the tables have already seen are
skipped by Delta: the data is lost with no error. So the number a write carries is the **progress-log batch id**,
which never restarts: a query is a *generation* that begins at a base (its micro-batch 0 is the log's batch
``base``), in its own checkpoint folder (``increment`` for base 0, ``increment-from-<base>`` after). The progress
record says which generation wrote it.

At each start, before the query runs, :func:`plan` picks the one generation that continues exactly, or refuses:

1. the generation of the newest whole record L, when its checkpoint planned exactly up to L (or L + 1: a
   micro-batch in flight, which Spark replays with its recorded offsets). When the checkpoint committed L + 1 but
   its record is missing or damaged, the commit is removed so that Spark replays L + 1: its writes are skipped as
   applied, and it writes the record again;
2. else a new generation at base L + 1, reading from record L's source positions (a version held in part is read
   again whole), when no table holds a write after L (read from the tables' logs with delta-rs);
3. else :class:`phases._internal.errors.LiveResumeError`, naming what is missing and the way out.

An empty progress log is its switch record (batch -1), which is rebuilt from the handoff.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession

from phases._internal import spark_internals
from phases._internal.coordination.progress_log import ProgressLog
from phases._internal.errors import LiveResumeError, ProgressRecordDamaged

QUERY = "increment"  # the first generation's checkpoint sub-folder
log = logging.getLogger(__name__)


def way_out(pipeline: str, checkpoints: str, progress_log: str) -> str:
    """The end of a refusal's message: what the operator can do."""
    return (
        f"To proceed: restore the checkpoint folder {checkpoints} and the progress log {progress_log} together, from "
        f"one backup; or start over: stop the live phase and run BacklogRunner(spark, pipeline).run(reset=True) for "
        f"pipeline {pipeline!r} (a new backlog over every version, then a new switch)"
    )


def generation_folder(checkpoints: str, base: int) -> str:
    """The checkpoint folder of the query generation whose micro-batch 0 is the log's batch ``base``."""
    return f"{checkpoints}/{QUERY}" if base == 0 else f"{checkpoints}/{QUERY}-from-{base}"


@dataclass(frozen=True)
class Resume:
    """How the next query runs: in ``folder``, its micro-batch N being the log's batch ``base + N``; a new query
    reads from ``record``'s source positions (Spark ignores them for a checkpoint that has offsets)."""

    base: int
    folder: str
    latest_id: int  # the newest whole record's batch id (-1: the switch's)
    record: dict  # that record
    write_record: bool  # the record is the switch's, rebuilt: write it before the query starts


def plan(
    spark: SparkSession,
    progress: ProgressLog,
    checkpoints: str,
    switch_record: dict,
    applied: Callable[[], dict[str, int]],
    way_out: str,
) -> Resume:
    """The generation that continues exactly (module docstring), with the files it needs put right; or
    :class:`LiveResumeError`. ``applied()`` gives the newest write id per table (read only when needed);
    ``way_out`` ends a refusal's message."""
    actions: list[str] = []
    damaged: list[int] = []
    latest: tuple[int, dict] | None = None
    for batch_id in reversed(progress.batch_ids()):
        try:
            record = progress.read(batch_id)
        except ProgressRecordDamaged:
            damaged.append(batch_id)
            continue
        if record is not None:
            latest = (batch_id, record)
            break
    rebuilt = latest is None
    if rebuilt:
        latest = (int(switch_record["batch_id"]), switch_record)
    newest, record = latest
    written_by = int(record.get("query_base", 0))
    problems: list[str] = []
    if damaged:
        problems.append(f"progress records {sorted(damaged)} in {progress.root} are damaged")
    for base in dict.fromkeys([written_by, newest + 1]):
        folder = generation_folder(checkpoints, base)
        offsets = spark_internals.checkpoint_batch_ids(spark, folder, spark_internals.OFFSETS)
        commits = spark_internals.checkpoint_batch_ids(spark, folder, spark_internals.COMMITS)
        planned = base + offsets[-1] if offsets else base - 1  # the newest log batch this checkpoint planned
        if planned not in (newest, newest + 1):
            if offsets:
                problems.append(
                    f"checkpoint {folder} planned up to micro-batch {planned}, the progress log ends at {newest}"
                )
            elif base == written_by and newest >= base:
                problems.append(f"checkpoint {folder} is missing (the progress log ends at micro-batch {newest})")
            continue
        trusted = base == written_by and not rebuilt and not damaged
        if not trusted:
            ahead = {table: batch for table, batch in applied().items() if batch > planned}
            if ahead:
                problems.append(
                    "the tables hold writes the progress log does not describe: "
                    + ", ".join(f"{t} (micro-batch {b})" for t, b in sorted(ahead.items()))
                )
                break
        for batch_id in damaged:
            actions.append(f"set the damaged record aside as {progress.set_aside(batch_id)}")
        if planned == newest + 1 and commits and commits[-1] == offsets[-1]:
            # Committed, but its record is gone: Spark replays the micro-batch once its commit is removed.
            removed = spark_internals.remove_commit(spark, folder, commits[-1])
            actions.append(f"removed {removed} to replay micro-batch {planned}")
        if base != written_by:
            actions.append(f"started a new checkpoint {folder} from progress record {newest}")
        for action in actions:
            log.warning("live run %s: %s", progress.root, action)
        return Resume(base, folder, newest, record, rebuilt)
    raise LiveResumeError(
        "the live phase cannot resume exactly: "
        + "; ".join(problems or [f"its checkpoint under {checkpoints} and the progress log {progress.root} disagree"])
        + f". Nothing was started. {way_out}"
    )
