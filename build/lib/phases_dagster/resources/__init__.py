"""Dagster resources: the Spark session and the storage root of the Delta tables."""

from phases_dagster.resources.spark import SparkResource
from phases_dagster.resources.storage import StorageResource

__all__ = ["SparkResource", "StorageResource"]
