"""Dagster resources (thin in the engine slice; the Dagster issue fills this in)."""

from resources.spark import SparkResource

__all__ = ["SparkResource"]
