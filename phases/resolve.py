"""Resolving a pipeline's relative paths under a storage root."""

from __future__ import annotations

from phases.definition import Pipeline


def under(root: str, path: str) -> str:
    """``path`` itself when absolute or a URI, else ``root/path``."""
    if path.startswith("/") or "://" in path or path.startswith("file:"):
        return path
    return f"{root.rstrip('/')}/{path}"


def resolve_paths(pipeline: Pipeline, root: str) -> Pipeline:
    """The pipeline with its relative source, sink and locations paths placed under ``root``."""
    return pipeline.model_copy(
        update={
            "source": pipeline.source.model_copy(update={"path": under(root, pipeline.source.path)}),
            "sink": pipeline.sink.model_copy(update={"path": under(root, pipeline.sink.path)}),
            "locations": pipeline.locations.model_copy(update={"root": under(root, pipeline.locations.root)}),
        }
    )
