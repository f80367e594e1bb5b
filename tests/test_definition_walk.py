"""The walk of a pipeline definition from the Dagster live asset (scripts/definition_walk.py): placed once at the
storage resource, never copied, taken as it is by the live runner, never climbing into a peer or a higher layer. Its
placing count is checked against a run that records every placement (tests/test_definition_is_never_rewritten.py)."""

from __future__ import annotations

from scripts.definition_walk import measure


def test_the_definition_walks_from_the_live_asset_down_without_a_climb():
    walk = measure("phases_dagster/live.py:build_live_asset:pipeline")
    stops = [row.split()[0] for row in walk["rows"]]
    assert "phases_dagster.resources.storage.StorageResource.placement" in stops
    # Followed through the constructor a classmethod calls (cls(...)): the runner and its plan.
    assert {"phases._internal.live.runner.LiveRunner.at", "phases._internal.live.runner.LiveRunner.__init__"} <= set(
        stops
    )
    assert "phases._internal.live.plan.LivePlan.of" in stops
    assert walk["climbs"] == 0, [r for r in walk["rows"] if "climb" in r]
    assert walk["stops"] <= 30 and walk["returns"] <= 12, walk["rows"]
    # Placed once, at the storage resource; the runners take the placement as it is. No copy of the definition.
    assert [b.split(" (from ")[1].rstrip(")") for b in walk["binds"]] == [
        "phases_dagster.resources.storage.StorageResource.placement",
    ]
    assert walk["copies"] == []


def test_the_walk_follows_the_public_face_and_finds_a_copy(tmp_path):
    """The checker itself: ``from phases import LiveRunner`` is followed into the live runner's module, and a
    ``model_copy`` of the definition on the way is counted."""
    import ast

    from scripts.definition_walk import Function, Walk, load, summarize

    modules = load()
    live = modules["phases_dagster.live"]
    source = (
        "def run(pipeline):\n    moved = pipeline.model_copy(update={})\n    LiveRunner.from_manifest(None, moved)\n"
    )
    fn = Function("phases_dagster.live", "run", ast.parse(source).body[0])
    live.functions["run"] = fn
    walk = Walk(modules)
    walk.visit(fn, {"pipeline"}, None)
    found = summarize(walk)
    assert found["copies"] == ["model_copy of the definition in phases_dagster.live.run"]
    assert "phases._internal.live.runner.LiveRunner.from_manifest" in [r.split()[0] for r in found["rows"]]
    assert any("binding.place" in b for b in found["binds"])


def test_a_call_into_a_peer_phase_is_a_climb():
    """The checker itself: a live-runner function handing the definition to the backlog's increments, as the live
    start did before the increments' intents moved under both phases."""
    import ast

    from scripts.definition_walk import Function, Walk, load, summarize

    modules = load()
    runner = modules["phases._internal.live.runner"]
    runner.imports["increments"] = "phases._internal.backlog.increments"
    source = "def start_checks(pipeline):\n    increments.run_through_step(None, pipeline)\n"
    fn = Function("phases._internal.live.runner", "start_checks", ast.parse(source).body[0])
    runner.functions["start_checks"] = fn
    walk = Walk(modules)
    walk.visit(fn, {"pipeline"}, None)
    found = summarize(walk)
    assert found["rows"][1] == "phases._internal.backlog.increments.run_through_step  [climb]" and found["climbs"] >= 1
