"""Two-phase (backlog -> live) pipelines on Spark: the engine. No Dagster imports here."""
