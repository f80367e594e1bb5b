"""The registry of operator kinds: one instance per kind, by the definition's ``operator.kind``. Adding a kind: its
definition model in :mod:`phases._internal.definition.operators` (a ``kind`` literal in the ``Operator`` union), its
module in :mod:`phases._internal.operators`, and one line in :data:`KINDS`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phases._internal.operators.base import OperatorKind
from phases._internal.operators.co_group import CoGroupKind
from phases._internal.operators.interval_join import IntervalJoinKind
from phases._internal.operators.keyed_aggregate import KeyedAggregateKind
from phases._internal.operators.process import ProcessKind
from phases._internal.operators.session_aggregate import SessionAggregateKind
from phases._internal.operators.window_aggregate import WindowAggregateKind

if TYPE_CHECKING:
    from phases._internal.definition import Pipeline

KINDS: dict[str, OperatorKind] = {
    kind.name: kind
    for kind in (
        KeyedAggregateKind(),
        WindowAggregateKind(),
        SessionAggregateKind(),
        ProcessKind(),
        IntervalJoinKind(),
        CoGroupKind(),
    )
}


def kind_named(name: str) -> OperatorKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown operator kind {name!r}; valid kinds: {sorted(KINDS)}") from None


def kind_of(pipeline: Pipeline) -> OperatorKind:
    """The operator kind of ``pipeline``."""
    return kind_named(pipeline.operator.kind)
