"""The intent of a catch-up increment: what an increment of a handoff will write, recorded before it writes anything
(``<root>/increments/<B>.json``, put-if-absent), and removed once its manifest is written. While an intent is open,
a live phase from that handoff is refused (:func:`refuse_open`): the sink may already hold the increment's rows,
which the live phase would append again. The increment itself is :mod:`phases._internal.backlog.increments` (and, for
mergeable aggregates, :meth:`phases._internal.backlog.runner.BacklogRunner.run_increment`)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from pyspark.sql import SparkSession

from phases._internal.errors import PhaseStateError
from phases._internal.placement import Placement
from phases._internal.storage import fs


def write_run_name(manifest_id: str) -> str:
    """The live-write run name of the increment that writes ``manifest_id`` (never a live run's: its writes must not
    be taken for the live phase's micro-batch 0)."""
    return f"increment-{manifest_id}"


@dataclass(frozen=True)
class Intent:
    """What an increment of ``base_id`` will write: the new manifest's id, each input's last version and each topic
    input's chunk plan (its offsets)."""

    base_id: str
    manifest_id: str
    ends: dict[str, int]
    plans: dict[str, str]

    @staticmethod
    def fix(spark: SparkSession, where: Placement, base_id: str, ends: dict[str, int], plans: dict[str, str]) -> Intent:
        """The intent of an increment of ``base_id``: a new one with ``ends`` and ``plans``, or the one an earlier
        attempt recorded (whose range it then finishes)."""
        path = where.increment_intent(base_id)
        fresh = {"manifest_id": uuid.uuid4().hex, "ends": dict(ends), "plans": dict(plans)}
        fs.create_once(spark, path, json.dumps(fresh))
        data = json.loads(fs.read_text(spark, path))
        return Intent(base_id, data["manifest_id"], {k: int(v) for k, v in data["ends"].items()}, data["plans"])

    def close(self, spark: SparkSession, where: Placement) -> None:
        """Removes the intent once its manifest is written."""
        fs.delete_file(spark, where.increment_intent(self.base_id))


def open_intent(spark: SparkSession, where: Placement, base_id: str) -> dict | None:
    """The recorded intent of an unfinished increment of ``base_id`` (None: none)."""
    path = where.increment_intent(base_id)
    return json.loads(fs.read_text(spark, path)) if fs.exists(spark, path) else None


def refuse_open(spark: SparkSession, where: Placement, base_id: str) -> None:
    """Raises PhaseStateError when an increment of handoff ``base_id`` was cut short: its writes may be in the sink,
    and a live phase from ``base_id`` would write them again."""
    intent = open_intent(spark, where, base_id)
    if intent is None:
        return
    raise PhaseStateError(
        f"pipeline {where.name!r}: a catch-up increment from handoff {base_id} (to handoff "
        f"{intent['manifest_id']}) was cut short, and the sink may already hold part of it; a live phase from "
        f"{base_id} would write that again. Finish the increment first: BacklogRunner(spark, pipeline)"
        ".run_increment() (the switch sensor's catch-up runs it), then start the live phase from its handoff"
    )
