"""Locations as URIs: joins keep the scheme's ``//``; local paths and ``file:`` URIs name the same folder."""

from __future__ import annotations

import pytest

from phases._internal import uris
from phases._internal.definition import Locations


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        ("s3a://bucket/engine", "s3a://bucket/engine/state/m1"),
        ("s3a://bucket/engine/", "s3a://bucket/engine/state/m1"),
        ("abfss://c@acct.dfs.core.windows.net/p", "abfss://c@acct.dfs.core.windows.net/p/state/m1"),
        ("gs://bucket", "gs://bucket/state/m1"),
        ("file:///tmp/x", "file:///tmp/x/state/m1"),
        ("/tmp/x", "/tmp/x/state/m1"),
        ("relative/x", "relative/x/state/m1"),
        ("/", "/state/m1"),
    ],
)
def test_join_keeps_scheme_and_authority(root, expected):
    assert uris.join(root, "state", "m1") == expected


def test_engine_locations_under_an_object_store_root_stay_uris():
    loc = Locations(root="s3a://bucket/pipelines/events")
    assert loc.state_root == "s3a://bucket/pipelines/events/state"
    assert loc.manifests == "s3a://bucket/pipelines/events/manifests"
    assert loc.quarantine == "s3a://bucket/pipelines/events/quarantine"
    assert loc.checkpoints == "s3a://bucket/pipelines/events/checkpoints"
    assert loc.live_run("abc") == "s3a://bucket/pipelines/events/live/abc"


@pytest.mark.parametrize(
    ("location", "local", "path"),
    [
        ("/tmp/t", True, "/tmp/t"),
        ("file:/tmp/t", True, "/tmp/t"),
        ("file:///tmp/t", True, "/tmp/t"),
        ("s3a://b/t", False, None),
        ("gs://b/t", False, None),
    ],
)
def test_local_locations_and_their_paths(location, local, path):
    assert uris.is_local(location) is local
    if local:
        assert uris.local_path(location) == path
    else:
        with pytest.raises(ValueError, match="not a local path"):
            uris.local_path(location)


def test_relative_pipeline_paths_resolve_under_an_object_store_root():
    from phases._internal.placement import under

    assert under("s3a://lake/pipelines/", "engine") == "s3a://lake/pipelines/engine"
    assert under("s3a://lake/pipelines", "gs://other/x") == "gs://other/x"
    assert under("s3a://lake/pipelines", "file:/data/x") == "file:/data/x"
    assert under("s3a://lake/pipelines", "/abs/x") == "/abs/x"
