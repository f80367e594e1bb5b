"""This repository's Dagster code location: the demo pipelines (``pipelines.py``) orchestrated by the
``phases_dagster`` factory (``definitions.py``, which ``workspace.yaml`` and ``dg`` load)."""
