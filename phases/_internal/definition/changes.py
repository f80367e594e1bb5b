"""What differs between two versions of a pipeline's definition, and what each difference needs.

Two definitions are compared through their state specs (:meth:`phases._internal.definition.Pipeline.state_spec`, the
part whose hash is the fingerprint; a handoff manifest keeps its definition's spec as JSON). A difference is one of:

* **shape**: it changes the per-key state or what the state means (keys, event time, watermark delay, operator,
  record steps, end-of-stream steps, enrichment, sink mode, the engine's state layout). The old state cannot serve
  the new definition: a redeploy runs the new definition's backlog beside the old one, then swaps
  (:mod:`phases._internal.redeploy`);
* **forward**: it changes which records are taken from now on and leaves the state alone (``max_future``,
  ``min_event_time``). The live phase can go on from its state under the new definition once the change is recorded
  (an amendment); records already taken or quarantined stay as they were.

Anything else in a definition (the sink's write options, the trigger interval, maintenance, Dagster metadata) is not
in the state spec: a restart takes it up, and no comparison here sees it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

# The state spec's fields that only decide which records are taken from now on.
FORWARD_FIELDS = ("max_future_us", "min_event_time_us")

Way = Literal["none", "forward", "backfill"]


def flatten(value: object, prefix: str = "") -> dict[str, object]:
    """A nested spec as ``{"operator.aggregations.0.column": ...}``: one entry per leaf, lists with their length."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = {f"{prefix}.length": len(value)}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}.{i}"))
        return out
    return {prefix: value}


@dataclass(frozen=True)
class Difference:
    """One leaf of the state spec that differs: its dotted path, the two values (None: absent) and its class."""

    field: str
    old: object
    new: object

    @property
    def forward(self) -> bool:
        return self.field.split(".", 1)[0] in FORWARD_FIELDS

    def describe(self, old_name: str = "old", new_name: str = "new") -> str:
        return f"{self.field}: {old_name} {self.old!r}, {new_name} {self.new!r}"


@dataclass(frozen=True)
class DefinitionChanges:
    """The differences between an old state spec and a new one, and the way they need (:data:`Way`)."""

    differences: tuple[Difference, ...]

    @classmethod
    def between(cls, old_spec: dict | str, new_spec: dict | str) -> DefinitionChanges:
        """``old_spec`` and ``new_spec``: state specs, as dicts or as the JSON a manifest keeps."""
        old = flatten(json.loads(old_spec) if isinstance(old_spec, str) else old_spec)
        new = flatten(json.loads(new_spec) if isinstance(new_spec, str) else new_spec)
        return cls(
            tuple(
                Difference(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)
            )
        )

    @property
    def shape(self) -> tuple[Difference, ...]:
        """The differences that change the state's shape or meaning: each needs a backfill."""
        return tuple(d for d in self.differences if not d.forward)

    @property
    def forward(self) -> tuple[Difference, ...]:
        """The differences that apply to records from now on."""
        return tuple(d for d in self.differences if d.forward)

    @property
    def way(self) -> Way:
        """``none`` (same state spec), ``forward`` (an amendment, no backfill) or ``backfill`` (a new generation)."""
        if self.shape:
            return "backfill"
        return "forward" if self.forward else "none"

    def describe(self, old_name: str = "old", new_name: str = "new") -> str:
        """The differences, one per line, each marked with what it needs; the way last."""
        if not self.differences:
            return "no change to the state spec: nothing to rebuild (a restart takes up changes outside it)"
        lines = [
            f"  [{'forward' if d.forward else 'shape'}] {d.describe(old_name, new_name)}" for d in self.differences
        ]
        if self.way == "backfill":
            verdict = (
                "needs a backfill: the state's shape or meaning changed, so the new definition's backlog runs beside "
                "the old one, which serves until the swap"
            )
        else:
            verdict = (
                "needs no backfill: the changes apply to records from now on (records already taken or quarantined "
                "stay as they are); the live phase goes on from its state once the change is recorded"
            )
        return "\n".join([*lines, verdict])
