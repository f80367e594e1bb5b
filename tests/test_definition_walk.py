"""The walk of a pipeline definition from the Dagster live asset (scripts/definition_walk.py): bound at the storage
resource, taken as it is by the live runner, never climbing into a peer or a higher layer."""

from __future__ import annotations

from scripts.definition_walk import measure


def test_the_definition_walks_from_the_live_asset_down_without_a_climb():
    walk = measure("phases_dagster/live.py:build_live_asset:pipeline")
    stops = [row.split()[0] for row in walk["rows"]]
    assert "phases_dagster.resources.storage.StorageResource.deployment" in stops
    assert "phases._internal.live.runner.LiveRunner.from_manifest" in stops
    assert walk["climbs"] == 0, [r for r in walk["rows"] if "climb" in r]
    assert walk["returns"] <= 10, [r for r in walk["rows"] if "return" in r]
    # The storage resource binds; the live runner's deploy() takes the Deployment as it is (a call site only).
    assert [b.split(" (from ")[1].rstrip(")") for b in walk["binds"]] == [
        "phases_dagster.resources.storage.StorageResource.deployment",
        "phases._internal.live.runner.LiveRunner.from_manifest",
    ]


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
