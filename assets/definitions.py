"""The Definitions object workspace.yaml loads: every pipeline of assets/pipelines.py, orchestrated.

Adding a pipeline is one line in the merge below (plus its definition in assets/pipelines.py), or a folder with a
``defs.yaml`` in assets/defs/ (a Dagster Component: docs/components.md).
"""

import os
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg

from assets.pipelines import DEMO, DEMO_DAILY, DEMO_KAFKA, DEMO_KAFKA_AVRO, DEMO_KAFKA_PROTOBUF
from phases import Pipeline
from phases_dagster import DailyBackfill, LiveHealth, Orchestration, SwitchPolicy, pipeline_definitions
from resources import RESOURCES

# The two beta APIs the pipelines' definitions use on purpose, each once per pipeline and per process that loads this
# location (webserver, daemon, code server, every run): multi_observable_source_asset (the inputs' observations) and
# BackfillPolicy.single_run (a range of daily slices in one run). Other beta warnings still show.
warnings.filterwarnings("ignore", message=r"Function `multi_observable_source_asset` is currently in beta")
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy` of function `asset` is currently in beta")

# The demo runs by itself: its sensors start with the daemon (a pipeline's sensors start stopped unless its settings
# say so) and evaluate often so that the demo does not wait; production keeps the default interval (30 s).
SENSOR_INTERVAL_S = int(os.environ.get("PHASES_SENSOR_INTERVAL_S", "5"))
DEMO_SETTINGS = Orchestration(
    switch=SwitchPolicy(minimum_interval_seconds=SENSOR_INTERVAL_S, running_by_default=True),
    health=LiveHealth(
        running_by_default=True,
        minimum_interval_seconds=SENSOR_INTERVAL_S,
        backoff_seconds=float(os.environ.get("PHASES_RELAUNCH_BACKOFF_S", "30")),
        max_lag=timedelta(seconds=float(os.environ.get("PHASES_SINK_MAX_LAG_S", "600"))),
    ),
)
# The daily demo's source is written by `make demo`, one version on each of the three days before it runs: its
# partitions start a week before today (UTC), not at a fixed date months before any data.
DAILY_START = datetime.now(UTC).date() - timedelta(days=7)
DAILY_SETTINGS = DEMO_SETTINGS.model_copy(update={"backfill": DailyBackfill(start_date=DAILY_START)})


def build_definitions(demo: Pipeline = DEMO) -> dg.Definitions:
    """The location's definitions, serving ``demo`` as the keyed demo pipeline: :data:`assets.pipelines.DEMO`, or a
    changed revision of it (:data:`assets.pipelines.DEMO_REVISED`) to redeploy under the same name."""
    served = [pipeline_definitions(demo, DEMO_SETTINGS), pipeline_definitions(DEMO_DAILY, DAILY_SETTINGS)]
    if os.environ.get("PHASES_KAFKA_BOOTSTRAP_SERVERS"):  # a deployment with a Kafka broker serves it too
        served.append(pipeline_definitions(DEMO_KAFKA, DEMO_SETTINGS))
        if os.environ.get("PHASES_SCHEMA_REGISTRY_URL"):  # ... and with a schema registry, its Avro and Protobuf twins
            served.append(pipeline_definitions(DEMO_KAFKA_AVRO, DEMO_SETTINGS))
            served.append(pipeline_definitions(DEMO_KAFKA_PROTOBUF, DEMO_SETTINGS))
    # The pipelines declared as Components in assets/defs/ (defs.yaml files: docs/components.md).
    served.append(dg.load_from_defs_folder(path_within_project=Path(__file__).parent))
    return dg.Definitions.merge(
        *served,
        dg.Definitions(resources=RESOURCES, executor=dg.in_process_executor),
    )


defs = build_definitions()
