"""The engine's pipelines as Dagster definitions: assets that are the pipeline's tables, their checks, the switch and
health sensors, and the resources they run on. Its own package name, so that it never collides with a Dagster
project's own ``assets`` or ``resources`` modules::

    import dagster as dg
    from phases_dagster import Orchestration, default_resources, pipeline_definitions

    defs = dg.Definitions.merge(pipeline_definitions(my_pipeline), dg.Definitions(resources=default_resources()))

Dependencies point one way: the asset, check and sensor modules use :mod:`phases_dagster.resources`, which uses the
engine (:mod:`phases`); the engine never imports Dagster. ``phases_dagster.testing.materialize_backlog`` runs a
pipeline's backlog asset and its checks in pytest.
"""

from phases_dagster.component import TwoPhasePipelineComponent
from phases_dagster.factory import default_resources, pipeline_definitions
from phases_dagster.resources import SparkResource, StorageResource
from phases_dagster.settings import (
    CheckPolicy,
    DailyBackfill,
    LiveHealth,
    LiveReporting,
    Names,
    Orchestration,
    SwitchPolicy,
    WhenLiveDown,
)

__all__ = [
    "CheckPolicy",
    "DailyBackfill",
    "LiveHealth",
    "LiveReporting",
    "Names",
    "Orchestration",
    "SparkResource",
    "StorageResource",
    "SwitchPolicy",
    "TwoPhasePipelineComponent",
    "WhenLiveDown",
    "default_resources",
    "pipeline_definitions",
]
