"""The pipeline's inputs as observable source assets: each observation records where the input's head is (a
Delta version, or Kafka end offsets) and its newest event time. The health sensor observes them on every tick
where the head moved; the UI's "Observe" button runs the same function.

The head is metadata (``position``), not a Dagster data version: with one, every new source version would mark the
backlog "Unsynced (upstream data)" and invite a second backlog, though the switch sensor catches the backlog up
before the switch and the live phase applies new data after it. A changed definition shows instead, as a changed
code version of the pipeline's assets."""

import dagster as dg

from phases import HybridSource, KafkaSource, Pipeline, PipelineSource, Placement
from phases.inspect import SourceHead, source_heads
from phases_dagster import catalog
from phases_dagster.settings import Names


def _kind(spec) -> str:
    return "kafka" if isinstance(spec, KafkaSource | HybridSource) else "delta"


def _own(pipeline: Pipeline) -> list[bool]:
    """For each input: whether it is a source asset of this pipeline's own (another pipeline's results are that
    pipeline's sink asset)."""
    return [not isinstance(inp.spec, PipelineSource) for inp in pipeline.inputs]


def source_keys(pipeline: Pipeline) -> list[str]:
    """The keys of the pipeline's own source assets, in input order."""
    names = Names(pipeline)
    keys = [names.source] + ([names.right_source] if pipeline.inputs.two else [])
    return [key for key, own in zip(keys, _own(pipeline), strict=True) if own]


def _own_heads(where: Placement) -> list[SourceHead]:
    return [head for head, own in zip(source_heads(where), _own(where.definition), strict=True) if own]


def observation(key: str, head: SourceHead) -> dg.AssetObservation:
    return dg.AssetObservation(asset_key=key, metadata=catalog.head_metadata(head))


def observations(where: Placement) -> list[dg.AssetObservation]:
    """One observation per source asset of a placed pipeline's own (no Spark)."""
    keys = source_keys(where.definition)
    return [observation(key, head) for key, head in zip(keys, _own_heads(where), strict=True)]


def build_source_asset(pipeline: Pipeline) -> dg.AssetsDefinition | None:
    """The pipeline's observable source assets; None when it reads only other pipelines' results."""
    names = Names(pipeline)
    labelled = zip(("source", "right_source"), pipeline.inputs, _own(pipeline), strict=False)
    own_inputs = [(label, inp) for label, inp, own in labelled if own]
    specs = [
        dg.AssetSpec(
            key,
            metadata={"dagster/table_name": f"{pipeline.name}.{label}"},
            **catalog.spec_kwargs(
                pipeline,
                f"The {label.replace('_', ' ')} of {pipeline.name!r}, written by others. Observations record its head "
                "(Delta version or Kafka end offsets) and newest event time.",
                kinds={_kind(inp.spec)},
            ),
        )
        for key, (label, inp) in zip(source_keys(pipeline), own_inputs, strict=True)
    ]
    if not specs:
        return None

    @dg.multi_observable_source_asset(specs=specs, name=names.source_op, required_resource_keys={"storage"})
    def heads(context):
        where = context.resources.storage.placement(pipeline)
        for key, head in zip(source_keys(pipeline), _own_heads(where), strict=True):
            yield dg.ObserveResult(asset_key=key, metadata=catalog.head_metadata(head))

    return heads
