"""A definition is bound to where it runs once (:mod:`phases._internal.deployment`): the definition carries no engine
state, a deployment is immutable, and a runner given a deployment neither binds nor reads the redeploy log again before
its start."""

from __future__ import annotations

import dataclasses

import pytest

from phases import deploy
from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Locations, Pipeline
from phases._internal.deployment import bind, generations
from phases._internal.live.runner import LiveRunner
from tests.conftest import make_pipeline
from tests.helpers import write_source
from tests.phases.backlog.test_backlog import VERSIONS


def _engine_fields(model: type) -> list[str]:
    """Fields of a definition model documented as set by the engine (none may be)."""
    found = []
    for name, f in model.model_fields.items():
        if "engine" in (f.description or "").lower() and "set" in (f.description or "").lower():
            found.append(f"{model.__name__}.{name}")
    return found


def test_the_definition_carries_no_engine_state():
    assert set(Locations.model_fields) == {"root"}
    assert _engine_fields(Pipeline) == [] and _engine_fields(Locations) == []


def test_a_definition_is_bound_to_the_serving_generation_and_the_deployment_is_immutable(tmp_path):
    p = make_pipeline("rel/source", "engine").model_copy(update={"sink": make_pipeline("x", "y").sink})
    d = deploy(None, p, root=str(tmp_path))  # no redeploy log: generation 0 serves
    assert (d.generation, d.serving, d.redeployed) == (0, True, False)
    assert d.definition.source.path == f"{tmp_path}/rel/source" and d.pipeline.locations.root == f"{tmp_path}/engine"
    assert deploy(None, d) is d  # a deployment is taken as it is
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.generation = 1  # type: ignore[misc]
    built = bind(d.definition, 2, serving=False)
    assert built.pipeline.locations.root == f"{tmp_path}/engine/generations/2"
    assert built.pipeline.sink.path == f"{tmp_path}/engine/generations/2/sink"
    assert built.definition is d.definition and p.locations.root == "engine"  # the user's definition is unchanged


def test_a_runner_given_a_deployment_binds_and_reads_the_log_no_more_until_its_start(spark, tmp_path, monkeypatch):
    write_source(spark, f"{tmp_path}/source", VERSIONS)
    p = make_pipeline(f"{tmp_path}/source", str(tmp_path / "run"))
    BacklogRunner(spark, p).run()
    d = deploy(spark, p)
    reads, binds = [], []
    real_read, real_bind = generations.read, bind

    def counting_read(spark_, definition):
        reads.append(definition.name)
        return real_read(spark_, definition)

    def counting_bind(*args, **kwargs):
        binds.append(args[1])
        return real_bind(*args, **kwargs)

    monkeypatch.setattr(generations, "read", counting_read)
    monkeypatch.setattr("phases._internal.deployment.binding.bind", counting_bind)
    runner = LiveRunner.from_manifest(spark, d)
    assert runner.deployment is d and (reads, binds) == ([], [])
    BacklogRunner(spark, d)
    assert (reads, binds) == ([], [])
    # A definition is bound once at the entry: one read of the log, one bind.
    LiveRunner.from_manifest(spark, p)
    assert (reads, binds) == (["events"], [0])
    # The start checks again that the generation still serves (a swap since would refuse it).
    reads.clear()
    runner.start(available_now=True)
    assert reads == ["events"]
