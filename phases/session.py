"""Builds the SparkSession the engine runs on: Delta, the state store, and the cached JVM jars."""

from __future__ import annotations

import os
import sys
from typing import Literal

from pydantic import Field
from pyspark.sql import SparkSession

from phases import jvm_deps
from phases.models import SettingsModel

STATE_STORE_PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}


class SparkSettings(SettingsModel):
    """Everything that shapes the SparkSession, in one place."""

    master: str = Field("local[2]", description="Spark master URL; local[N] by default.")
    app_name: str = "two-phase-pipelines"
    shuffle_partitions: int = Field(8, gt=0)
    driver_memory: str = "2g"
    state_store: Literal["rocksdb", "hdfs"] = Field(
        "rocksdb",
        description="Streaming state store. RocksDB is required by transformWithState and is fixed in a "
        "checkpoint at its first run.",
    )
    rocksdb_changelog_checkpointing: bool = True
    ui_enabled: bool = False
    listing_parallelism: int | None = Field(
        None,
        gt=0,
        description="Tasks Spark and Delta use to list files (VACUUM's listing among them). Spark's default, "
        "10,000, makes a VACUUM of a small table take half a minute on a small machine; None uses "
        "shuffle_partitions.",
    )
    extra_conf: dict[str, str] = Field(default_factory=dict)


def build_session(settings: SparkSettings | None = None) -> SparkSession:
    """Returns the active session configured by ``settings`` (or creates it)."""
    s = settings or SparkSettings()
    # Python workers (mapInPandas, user functions) must run the driver's interpreter, with the project's
    # packages; otherwise Spark starts whatever `python3` is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(s.master)
        .appName(s.app_name)
        .config("spark.jars", ",".join(jvm_deps.jar_paths()))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.driver.memory", s.driver_memory)
        .config("spark.sql.shuffle.partitions", str(s.shuffle_partitions))
        .config("spark.default.parallelism", str(s.shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", STATE_STORE_PROVIDERS[s.state_store])
        .config(
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
            str(s.rocksdb_changelog_checkpointing).lower(),
        )
        # Delta reconstructs table snapshots with 50 partitions by default: far too many locally.
        .config("spark.databricks.delta.snapshotPartitions", str(max(2, s.shuffle_partitions)))
        .config("spark.sql.adaptive.enabled", "true")
        .config(
            "spark.sql.sources.parallelPartitionDiscovery.parallelism",
            str(s.listing_parallelism or s.shuffle_partitions),
        )
        .config("spark.ui.enabled", str(s.ui_enabled).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in s.extra_conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # The backlog reads the source's change feed from version 0, which Delta counts as time travel and by
    # default refuses beyond delta.deletedFileRetentionDuration (7 days). An append-only source removes no
    # files, so its old versions stay readable; a vacuumed-away file still fails the read, loudly.
    spark.conf.set("spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration", "false")
    spark.sparkContext.setLogLevel("ERROR")
    return spark
