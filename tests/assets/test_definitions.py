"""workspace.yaml's Definitions load and expose the demo backlog asset with the in-process executor."""

from __future__ import annotations

import dagster as dg

from assets.definitions import DEMO, defs


def test_definitions_load_with_the_backlog_asset():
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey(f"{DEMO.name}_backlog") in graph.get_all_asset_keys()
    assert defs.executor is dg.in_process_executor
