"""Dagster resources: the Spark session and the storage root of the Delta tables."""

from resources.spark import SparkResource
from resources.storage import StorageResource

__all__ = ["SparkResource", "StorageResource"]
