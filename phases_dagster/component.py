"""A two-phase pipeline declared the Dagster way: a Component whose ``defs.yaml`` holds the pipeline's definition and
its orchestration settings, with the fields of :class:`phases.Pipeline` and :class:`phases_dagster.Orchestration` as
the Python declaration has them::

    type: phases_dagster.TwoPhasePipelineComponent
    attributes:
      pipeline:
        name: clicks
        source: {kind: delta, path: clicks/source}
        key_columns: [user]
        event_time: ts
        watermark_delay: PT2M
        operator:
          kind: keyed_aggregate
          aggregations: [{name: clicks, kind: count}]
        sink: {kind: delta, path: clicks/sink}
        locations: {root: clicks/engine}
      orchestration:
        switch: {running_by_default: false}

``build_defs`` validates both with the engine's own models (the same rules and messages: a mistake names the file, the
field and the valid values) and returns exactly what :func:`phases_dagster.pipeline_definitions` returns for them, so
the two ways of declaring a pipeline are one implementation. The resources (``spark``, ``storage``) are the code
location's, as for a Python declaration. ``dg scaffold defs phases_dagster.TwoPhasePipelineComponent <path>`` writes a
commented ``defs.yaml`` (:class:`PipelineScaffolder`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import dagster as dg
import yaml
from pydantic import Field

from phases import DefinitionError, Pipeline
from phases_dagster.factory import pipeline_definitions
from phases_dagster.settings import Orchestration

SCAFFOLDED_YAML = """\
# A two-phase pipeline (phases_dagster.TwoPhasePipelineComponent): its backlog runs as a Spark batch job, then a
# Dagster sensor switches it to a Structured Streaming live phase seeded from the backlog's state. The fields are
# those of phases.Pipeline and phases_dagster.Orchestration (docs/components.md); `dg check defs` validates them.
type: {type_name}
attributes:
  pipeline:
    name: {name}
    # A Delta table with its change data feed on (phases.feed.create_source makes one); a relative path is under the
    # storage root (PHASES_DATA_ROOT). Other kinds: kafka, hybrid.
    source: {{kind: delta, path: {name}/source}}
    key_columns: [key]
    event_time: ts                  # a timestamp column; a record at or before the watermark is late (quarantined)
    watermark_delay: PT2M           # how far event time may lag the newest record (ISO 8601, or seconds)
    operator:
      kind: keyed_aggregate         # or window_aggregate, session_aggregate, process, interval_join, co_group
      aggregations:
        - {{name: events, kind: count}}
        - {{name: total, kind: sum, column: value}}
    sink: {{kind: delta, path: {name}/sink}}
    locations: {{root: {name}/engine}}
  orchestration:
    # The sensors that launch Spark runs (the switch to live, the live phase's relaunch) start stopped (the default,
    # spelled out): turn them on in the UI (Automation), or set running_by_default: true.
    switch: {{running_by_default: false}}
    health: {{running_by_default: false}}
"""


# The scaffolded declaration: the example the UI's Docs tab shows for each attribute.
_EXAMPLE = yaml.safe_load(SCAFFOLDED_YAML.format(type_name="phases_dagster.TwoPhasePipelineComponent", name="clicks"))


class PipelineScaffolder(dg.Scaffolder):
    """Writes a commented ``defs.yaml`` that declares a keyed aggregation over a Delta source (``key``, ``ts``,
    ``value``: the columns ``phases.feed.create_source`` makes), named after the folder."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        name = Path(request.target_path).name.replace("-", "_")
        text = SCAFFOLDED_YAML.format(type_name=request.type_name, name=name)
        (Path(request.target_path) / "defs.yaml").write_text(text)


@dg.scaffold_with(PipelineScaffolder)
class TwoPhasePipelineComponent(dg.Component, dg.Model, dg.Resolvable):
    """A two-phase pipeline: a sorted Spark batch backlog, then a Structured Streaming live phase seeded from its
    state, switched by a Dagster sensor. `pipeline` holds the fields of phases.Pipeline, `orchestration` those of
    phases_dagster.Orchestration (switch, health and check policies, a daily backfill). It builds the same assets,
    checks, sensors and jobs as phases_dagster.pipeline_definitions; the project binds the resources (spark,
    storage) once for all its components."""

    pipeline: dict[str, Any] = Field(
        description="The pipeline's definition: the fields of phases.Pipeline (name, source, key_columns, event_time, "
        "watermark_delay, operator, sink, locations, ...), with durations as ISO 8601 (PT2M) or seconds.",
        examples=[_EXAMPLE["attributes"]["pipeline"]],
    )
    # A field with a default takes its description from its Resolver (Dagster 1.13 drops a Field's from the schema).
    orchestration: Annotated[
        dict[str, Any],
        dg.Resolver.default(
            description="How Dagster runs it: the fields of phases_dagster.Orchestration (switch, health, checks, "
            "backfill, ...); each sensor's running_by_default says whether it starts with the daemon (default: no).",
            examples=[_EXAMPLE["attributes"]["orchestration"]],
        ),
    ] = Field(default_factory=dict)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        where = context.path / "defs.yaml"
        pipeline = _validated(Pipeline, self.pipeline, where, "pipeline")
        settings = _validated(Orchestration, self.orchestration, where, "orchestration")
        return pipeline_definitions(pipeline, settings)


def _validated(model: Any, fields: dict[str, Any], where: Path, attribute: str) -> Any:
    """``fields`` as ``model``; a DefinitionError naming the file and the attribute, then the engine's message (the
    field and the valid values)."""
    try:
        return model.model_validate(fields)
    except DefinitionError as exc:
        raise DefinitionError(f"{where}: attributes.{attribute}: {exc}") from exc
