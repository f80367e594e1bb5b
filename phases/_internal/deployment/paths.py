"""Resolving a pipeline's relative paths under a storage root."""

from __future__ import annotations

from phases._internal import uris
from phases._internal.definition import Pipeline


def under(root: str, path: str) -> str:
    """``path`` itself when absolute or a URI, else ``root/path``."""
    if path.startswith("/") or uris.scheme(path) is not None:
        return path
    return uris.join(root, path)


def resolve_paths(pipeline: Pipeline, root: str, kafka_bootstrap_servers: str | None = None) -> Pipeline:
    """The pipeline with its relative paths (sources, sink, locations, end-of-stream outputs) under ``root``,
    and its Kafka source and topic sink pointed at ``kafka_bootstrap_servers`` when given (the deployment's broker)."""

    def moved(spec):
        kind = getattr(spec, "kind", "delta")
        if kind == "kafka":
            if kafka_bootstrap_servers:
                return spec.model_copy(update={"bootstrap_servers": kafka_bootstrap_servers})
            return spec
        if kind == "hybrid":
            return spec.model_copy(update={"backlog": moved(spec.backlog), "live": moved(spec.live)})
        return spec.model_copy(update={"path": under(root, spec.path)})

    sink_update: dict = {"path": under(root, pipeline.sink.path)}
    if pipeline.sink.kind == "kafka" and kafka_bootstrap_servers:  # a topic sink: its table moves, and its brokers
        sink_update["bootstrap_servers"] = kafka_bootstrap_servers
    update: dict = {
        "source": moved(pipeline.source),
        "sink": pipeline.sink.model_copy(update=sink_update),
        "locations": pipeline.locations.model_copy(update={"root": under(root, pipeline.locations.root)}),
        "end_of_stream": [s.model_copy(update={"output": moved(s.output)}) for s in pipeline.end_of_stream],
    }
    if pipeline.inputs.two:
        update["operator"] = pipeline.operator.model_copy(update={"right": moved(pipeline.inputs.right.spec)})
    return pipeline.model_copy(update=update)
