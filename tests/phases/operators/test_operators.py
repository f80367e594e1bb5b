"""The operator registry: every operator model of the definition has exactly one kind, and the drivers get
what a kind supports from it (no JVM)."""

from __future__ import annotations

import typing
from datetime import timedelta

import pytest

from phases._internal.definition import Aggregation, KeyedAggregate, Pipeline, ProcessOperator
from phases._internal.errors import DefinitionError
from phases._internal.operators import registry as operators
from tests.conftest import make_pipeline


def _operator_models() -> list[type]:
    return list(typing.get_args(Pipeline.model_fields["operator"].annotation))


def test_every_operator_model_of_the_definition_has_one_registered_kind():
    names = [model.model_fields["kind"].default for model in _operator_models()]
    assert sorted(names) == sorted(operators.KINDS)
    for name, kind in operators.KINDS.items():
        assert kind.name == name
        assert not (kind.two_inputs and kind.supports_increments), f"{name}: two inputs cannot be cut in increments"
        if not kind.supports_increments:
            assert kind.no_increments_because, f"{name} must say why it takes no increments"


def test_an_unknown_kind_is_refused_with_the_valid_kinds():
    with pytest.raises(ValueError, match="unknown operator kind 'median'.*keyed_aggregate"):
        operators.kind_named("median")


def test_the_pipeline_asks_its_kind_what_it_supports(tmp_path):
    keyed = make_pipeline(
        str(tmp_path / "source"),
        str(tmp_path / "run"),
        operator=KeyedAggregate(aggregations=[Aggregation(name="n", kind="count")]),
    )
    assert operators.kind_of(keyed) is operators.KINDS["keyed_aggregate"] and keyed.supports_increments
    process = keyed.model_copy(
        update={"operator": ProcessOperator(function="tests.phases.operators.process_functions:Sessions")}
    )
    # Every kind takes catch-up increments; only a mergeable state takes daily slices.
    assert operators.kind_of(process) is operators.KINDS["process"] and process.supports_increments
    assert keyed.supports_slices and not process.supports_slices


def test_backlog_checkpoints_take_every_kind_and_name_what_refuses_them(tmp_path):
    keyed = make_pipeline(str(tmp_path / "source"), str(tmp_path / "run"))
    spec = keyed.model_dump()
    spec["operator"] = {"kind": "process", "function": "tests.phases.operators.process_functions:Sessions"}
    spec["checkpoint_interval_during_backlog"] = timedelta(minutes=5)
    assert Pipeline.model_validate(spec).supports_increments
    spec["end_of_stream"] = [
        {
            "name": "tiers",
            "operators": [
                {
                    "kind": "map_partition",
                    "function": "tests.phases.steps.partition_functions:key_tier",
                    "output_schema": "k string",
                }
            ],
            "output": {"path": "tiers"},
        }
    ]
    with pytest.raises(DefinitionError, match="cannot be built from increments: its end_of_stream steps") as err:
        Pipeline.model_validate(spec)
    assert "set it to 0" in str(err.value)
