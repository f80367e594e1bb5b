"""This repository's code location's resources: the engine's Spark session and storage root with their defaults,
which read the environment (``PHASES_*``; docs/deployment.md). A deployment binds its own here."""

from phases_dagster import default_resources

RESOURCES = default_resources()
