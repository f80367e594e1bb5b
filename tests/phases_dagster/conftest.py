"""Dagster test fixtures: a throwaway SQLite instance, resources on tmp dirs sharing the test Spark session."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest

from phases._internal.definition import Pipeline
from phases_dagster.factory import pipeline_definitions
from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource
from phases_dagster.settings import Orchestration
from tests.conftest import make_pipeline


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def relative_pipeline(**overrides) -> Pipeline:
    """The test pipeline with paths relative to the storage root (source 'src', engine tables 'engine')."""
    return make_pipeline("src", "engine", **overrides)


def definitions(spark, root: str, pipeline: Pipeline, settings: Orchestration | None = None) -> dg.Definitions:
    assert spark is not None  # the session fixture must exist: the resource reuses it and leaves it running
    resources = {
        "spark": SparkResource(shuffle_partitions=2, stop_after_run=False),
        "storage": StorageResource(root=root),
    }
    return dg.Definitions.merge(
        pipeline_definitions(pipeline, settings), dg.Definitions(resources=resources, executor=dg.in_process_executor)
    )
