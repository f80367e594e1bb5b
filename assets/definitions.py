"""The Definitions object workspace.yaml loads: every pipeline of assets/pipelines.py, orchestrated.

Adding a pipeline is one line in the merge below (plus its definition in assets/pipelines.py).
"""

import os

import dagster as dg

from assets.factory import default_resources, pipeline_definitions
from assets.pipelines import DEMO, DEMO_KAFKA
from assets.settings import Orchestration, SwitchPolicy

# The demo's sensor evaluates often so that the demo does not wait; production keeps the default (30 s).
DEMO_SWITCH = SwitchPolicy(minimum_interval_seconds=int(os.environ.get("PHASES_SENSOR_INTERVAL_S", "5")))

served = [pipeline_definitions(DEMO, Orchestration(switch=DEMO_SWITCH))]
if os.environ.get("PHASES_KAFKA_BOOTSTRAP_SERVERS"):  # a deployment with a Kafka broker serves the Kafka pipeline too
    served.append(pipeline_definitions(DEMO_KAFKA, Orchestration(switch=DEMO_SWITCH)))

defs = dg.Definitions.merge(
    *served,
    dg.Definitions(resources=default_resources(), executor=dg.in_process_executor),
)
