"""Builds the SparkSession the engine runs on: Delta, the state store, and the cached JVM jars."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from pydantic import Field
from pyspark.sql import SparkSession

from phases._internal import spark_internals
from phases._internal.definition.model import SettingsModel
from phases._internal.definition.secrets import SPARK_OPTIONS_REDACTION, SPARK_REDACTION
from phases._internal.runtime import class_archive, jvm_deps

STATE_STORE_PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}


LOOPBACK = "127.0.0.1"
ARROW_BATCH_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
NO_BYTE_LIMIT = 2**31 - 1  # Spark skips its per-row size check at exactly Int.MaxValue (PythonArrowInput.scala)
LIVE_STATE_PARTITIONS = "spark.phases.liveStatePartitions"  # read by phases._internal.state.keyed_store
SCHEDULER_POOL = "spark.scheduler.pool"  # a thread's local property: the pool its jobs go to
BACKGROUND_POOL = "phases-background"
# Spark's fair scheduler with two pools. "default" (every job no thread assigns to a pool: the micro-batches, the
# backlog, the user's own queries) is needy while it runs fewer tasks than its minShare, so whenever a core frees, a
# waiting task of its jobs goes first; the background pool (a changelog's compaction, the copy kept for a rollback)
# gets the cores the default pool leaves. No task is pre-empted: a micro-batch waits at most for the background tasks
# already running to end, not for a whole background job. Within each pool, jobs run first come first served.
FAIR_POOLS = f"""<?xml version="1.0"?>
<allocations>
  <pool name="default"><schedulingMode>FIFO</schedulingMode><weight>1000</weight><minShare>100000</minShare></pool>
  <pool name="{BACKGROUND_POOL}"><schedulingMode>FIFO</schedulingMode><weight>1</weight><minShare>0</minShare></pool>
</allocations>
"""
# The file systems (FileSystem and FileContext APIs) of `file:` paths: the helper's, which a local session uses, and
# Hadoop's own.
LOCAL_FILE_SYSTEM = "org.apache.spark.sql.phases.LocalFileSystemWithoutShell"
LOCAL_FILE_CONTEXT_FS = "org.apache.spark.sql.phases.LocalFsWithoutShell"
LOCAL_FILE_SYSTEMS = {
    "spark.hadoop.fs.file.impl": LOCAL_FILE_SYSTEM,
    "spark.hadoop.fs.AbstractFileSystem.file.impl": LOCAL_FILE_CONTEXT_FS,
}
HADOOP_FILE_SYSTEM = "org.apache.hadoop.fs.LocalFileSystem"
HADOOP_FILE_CONTEXT_FS = "org.apache.hadoop.fs.local.LocalFs"
HADOOP_FILE_SYSTEMS = {
    "spark.hadoop.fs.file.impl": HADOOP_FILE_SYSTEM,
    "spark.hadoop.fs.AbstractFileSystem.file.impl": HADOOP_FILE_CONTEXT_FS,
}


def task_slots(master: str) -> int | None:
    """The tasks a local master runs at once (``local``, ``local[N]``, ``local[*]``, ``local[N,F]``); None for a
    cluster's master."""
    if master == "local":
        return 1
    found = re.fullmatch(r"local\[(\*|[0-9]+)(?:,[0-9]+)?\]", master)
    if found is None:
        return None
    return (os.cpu_count() or 1) if found.group(1) == "*" else int(found.group(1))


def snapshot_partitions(settings: SparkSettings) -> int:
    """The partitions of Delta's snapshot job (its log replayed, at every read or write of a table at a new version;
    Delta's default is 50). The engine's tables hold few versions: a local session makes one task per core (2 against
    8 saved 0.3 s a snapshot, 0.5 s of a 1M-row backlog: benchmarks/profiles/kafka-backlog-2026-12-02.txt), a cluster
    one per shuffle partition; at least 2."""
    return max(2, task_slots(settings.master) or settings.shuffle_partitions)


class SparkSettings(SettingsModel):
    """Everything that shapes the SparkSession, in one place."""

    master: str = Field(default="local[2]", description="Spark master URL; local[N] by default.")
    app_name: str = "two-phase-pipelines"
    shuffle_partitions: int = Field(default=8, gt=0)
    driver_memory: str = "2g"
    state_store: Literal["rocksdb", "hdfs"] = Field(
        default="rocksdb",
        description="Streaming state store. RocksDB is required by transformWithState and is fixed in a "
        "checkpoint at its first run.",
    )
    rocksdb_changelog_checkpointing: bool = True
    live_state_partitions: int | None = Field(
        default=None,
        gt=0,
        description="Partitions of a new live run's state store (each is one task of every micro-batch, which loads "
        "and commits its part of the store). None: the session's task slots (local[N]: N; a cluster: "
        "spark.default.parallelism). A run keeps the partitions its store was first written with.",
    )
    codegen_cache_entries: int = Field(
        default=1000,
        gt=0,
        description="Compiled generated classes Spark keeps (spark.sql.codegen.cache.maxEntries). Spark's 100 is "
        "four LRU segments of 25: the ~100 classes of a live micro-batch (the store update, the MERGE, Delta's log "
        "replay) evict each other, and every micro-batch compiled ~40 of them again, in Janino and then in the JIT.",
    )
    arrow_batch_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Bytes an Arrow batch sent to a Python worker may hold (spark.sql.execution.arrow.maxBytesPerBatch)"
        ". None: no byte limit, batches bounded by spark.sql.execution.arrow.maxRecordsPerBatch rows (10,000) alone, "
        "as before Spark 4. With a limit, Spark measures the batch after every row it adds, over every column: at a "
        "million records this doubled the process function's pass (benchmarks/profiles/arrow-batch-bytes-2026-12-03"
        ".txt). Set one for records of many kilobytes.",
    )
    background_yields: bool = Field(
        default=True,
        description="The engine's background work (a changelog sink's compaction while the live phase runs, the copy "
        "of a redeploy's previous results kept for a rollback) yields the cores to every other job: Spark's fair "
        "scheduler (spark.scheduler.mode FAIR) with a pool for it that gets only the cores the others leave. Off: "
        "Spark's FIFO scheduler, where a background job started first holds the cores until its tasks are all "
        "launched and the micro-batches queue behind it. A session built elsewhere keeps its own scheduler.",
    )
    ui_enabled: bool = False
    class_archive: bool = Field(
        default=True,
        description="A local session's driver JVM maps the setup's class archive (built by `python -m "
        "phases.setup`) when one is built for this JDK and these jars: it starts and runs its first queries sooner. "
        "Off, or with no current archive, the JVM loads every class from its jar as usual.",
    )
    listing_parallelism: int | None = Field(
        default=None,
        gt=0,
        description="Tasks Spark and Delta use to list files (VACUUM's listing among them). Spark's default, "
        "10,000, makes a VACUUM of a small table take half a minute on a small machine; None uses "
        "shuffle_partitions.",
    )
    python: str | None = Field(
        default=None,
        description="Interpreter of the executors' Python workers (PYSPARK_PYTHON). On a cluster it must exist on "
        "every worker with pyspark, pandas, pyarrow and protobuf installed; the engine's own code arrives through "
        "py_files. None: the driver's interpreter (right for local[N]).",
    )
    py_files: list[str] = Field(
        default_factory=list,
        description="Zip archives or .py files added to every executor's Python path, as spark-submit --py-files "
        "does: the engine's packages and those holding the pipeline's functions "
        "(phases.package_archive builds one). Not needed on local[N].",
    )
    s3a: bool = Field(
        default=False,
        description="Load Hadoop's S3A connector and the AWS SDK (the setup's jar cache) for s3a:// tables, with "
        "Delta's single-driver S3 log store. The store itself (endpoint, credentials) is configured through "
        "spark.hadoop.fs.s3a.* entries in extra_conf, or the AWS SDK's environment variables.",
    )
    extra_conf: dict[str, str] = Field(default_factory=dict)


def build_session(settings: SparkSettings | None = None) -> SparkSession:
    """Returns the active session configured by ``settings`` (or creates it)."""
    s = settings or SparkSettings()
    # Python workers (mapInPandas, user functions) run the driver's interpreter unless told otherwise (a cluster's
    # workers have their own); without PYSPARK_PYTHON Spark starts whatever `python3` is first on PATH.
    if s.python:
        os.environ["PYSPARK_PYTHON"] = s.python
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Delta and Kafka: spark.jars ships them to every executor; the engine's helper (the live phase's state store)
    # too on a cluster, while a local session has it on its classpath.
    jars, helper = jvm_deps.jar_paths(), jvm_deps.helper_jar()
    s3a = jvm_deps.jar_paths(bundle=jvm_deps.S3A) if s.s3a else []
    conf = dict(s.extra_conf)
    if s.master.startswith("local"):
        # One JVM: the helper and the S3A connector on its classpath. Hadoop finds the local file systems below
        # there when spark-submit first opens a path (before spark.jars are loaded); through spark.jars the local
        # executor would copy the ~690 MB AWS SDK bundle into its temporary folder at every start.
        # Protobuf's runtime beside the helper that decodes Protobuf topics with it (a class on the classpath cannot
        # see the jars spark.jars adds).
        protobuf = [j for j in jars if os.path.basename(j).startswith("protobuf-java-")]
        key = "spark.driver.extraClassPath"
        conf[key] = os.pathsep.join([*filter(None, [conf.get(key)]), helper, *protobuf, *s3a])
        # A local session listens on loopback only (its driver RPC and block manager ports otherwise bind to the
        # machine's network address), like the broker, Dagster and py4j; a cluster session uses the address the
        # user configures. extra_conf can still set either.
        conf.setdefault("spark.driver.bindAddress", LOOPBACK)
        conf.setdefault("spark.driver.host", LOOPBACK)
        # Hadoop's local file system, less a `chmod` or `readlink` process for every file Spark's checkpoints, its
        # state store and Delta's commits write (pip's PySpark has no Hadoop native library); the same results
        # (the helper's LocalFileSystems.scala). extra_conf can set Hadoop's own classes back (HADOOP_FILE_SYSTEMS).
        for key, value in LOCAL_FILE_SYSTEMS.items():
            conf.setdefault(key, value)
        archive = class_archive.java_options(jars=[*jars, helper]) if s.class_archive and not s3a else ""
        if archive:
            # The archive was written by a driver with this class path (the S3A jars change it: not mapped then).
            key = "spark.driver.extraJavaOptions"
            conf[key] = " ".join(filter(None, [conf.get(key), archive]))
    else:
        jars += [*s3a, helper]  # shipped to every executor, as Delta's jars are
    builder = (
        SparkSession.builder.master(s.master)
        .appName(s.app_name)
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.driver.memory", s.driver_memory)
        .config("spark.sql.shuffle.partitions", str(s.shuffle_partitions))
        .config("spark.default.parallelism", str(s.shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", STATE_STORE_PROVIDERS[s.state_store])
        .config(LIVE_STATE_PARTITIONS, str(s.live_state_partitions or task_slots(s.master) or s.shuffle_partitions))
        .config(
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
            str(s.rocksdb_changelog_checkpointing).lower(),
        )
        .config("spark.databricks.delta.snapshotPartitions", str(snapshot_partitions(s)))
        .config(ADAPTIVE_EXECUTION, "true")
        .config("spark.sql.codegen.cache.maxEntries", str(s.codegen_cache_entries))
        .config(
            "spark.sql.sources.parallelPartitionDiscovery.parallelism",
            str(s.listing_parallelism or s.shuffle_partitions),
        )
        .config("spark.ui.enabled", str(s.ui_enabled).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config(ARROW_BATCH_BYTES, str(s.arrow_batch_bytes or NO_BYTE_LIMIT))
        # A data source's options in a plan (its string, the UI, an error) and the session's settings in the UI and
        # event log: credentials hidden by what they are called (phases._internal.definition.secrets).
        .config("spark.sql.redaction.options.regex", SPARK_OPTIONS_REDACTION)
        .config("spark.redaction.regex", SPARK_REDACTION)
    )
    if s.background_yields:
        conf.setdefault("spark.scheduler.mode", "FAIR")
        conf.setdefault("spark.scheduler.allocation.file", _fair_pools_file())
    if s.s3a:
        # Delta's documented log store for S3 written by one Spark driver at a time: it makes a commit atomic only
        # within this JVM. Several drivers writing one table need S3DynamoDBLogStore (see the README's deployment).
        builder = builder.config("spark.delta.logStore.s3a.impl", "io.delta.storage.S3SingleDriverLogStore")
        builder = builder.config("spark.hadoop.fs.s3a.impl", "org.apache.hadoop.fs.s3a.S3AFileSystem")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for path in s.py_files:
        spark.sparkContext.addPyFile(path)
    # The backlog reads the source's change feed from version 0, which Delta counts as time travel and by
    # default refuses beyond delta.deletedFileRetentionDuration (7 days). An append-only source removes no
    # files, so its old versions stay readable; a vacuumed-away file still fails the read, loudly.
    spark.conf.set("spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration", "false")
    spark.sparkContext.setLogLevel("ERROR")
    quiet_stopped_queries(spark)
    if not s.master.startswith("yarn"):
        drop_yarn_defaults(spark)
    return spark


def _fair_pools_file() -> str:
    """:data:`FAIR_POOLS` in a file of the machine's temporary folder (named by its content: written once, never
    changed under a running driver; the scheduler reads it when the session's context starts)."""
    digest = hashlib.sha256(FAIR_POOLS.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"phases-fair-pools-{digest}.xml")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".xml")
        with os.fdopen(fd, "w") as f:
            f.write(FAIR_POOLS)
        os.replace(tmp, path)
    return path


@contextmanager
def background_jobs(spark: SparkSession) -> Iterator[None]:
    """The Spark jobs this thread starts in the block go to the background pool (:data:`FAIR_POOLS`), which yields
    the cores to every other job; the thread's pool after the block is the one before it. Under Spark's FIFO
    scheduler (a session built with ``background_yields=False``, or elsewhere) the pool is ignored."""
    sc = spark.sparkContext
    before = sc.getLocalProperty(SCHEDULER_POOL)
    sc.setLocalProperty(SCHEDULER_POOL, BACKGROUND_POOL)
    try:
        yield
    finally:
        sc.setLocalProperty(SCHEDULER_POOL, before)  # pyright: ignore[reportArgumentType]


def drop_yarn_defaults(spark: SparkSession) -> int:
    """Takes YARN's default properties (``yarn-default.xml``, which Spark's context loads: about half of the
    session's Hadoop configuration) out of the session's Hadoop configuration, which Spark serializes into every file
    scan, write task and state store job: the engine's small jobs spent a measurable part of their time on them. Only
    a YARN client reads them; a session on YARN keeps them. Returns how many were dropped (the helper's
    ``HadoopDefaults``; the other properties keep their values)."""
    helper = spark_internals.jvm(spark).org.apache.spark.sql.phases.HadoopDefaults
    return int(helper.dropYarnDefaults(spark_internals.hadoop_configuration(spark)))


ADAPTIVE_EXECUTION = "spark.sql.adaptive.enabled"


@contextmanager
def adaptive_execution_off(spark: SparkSession) -> Iterator[None]:
    """Spark's adaptive execution off in ``spark``'s session while the block runs (the session's setting after).

    For a DataFrame persisted and then written: under adaptive execution the write's first action materializes the
    cache as a query stage of its own and reads it back in a second stage; without it, the rows are cached as the
    write's stage writes them (one stage). The plan of a persisted DataFrame is fixed when ``persist()`` is called,
    so both the call and the first action go inside the block. The setting is the session's: a query another thread
    plans on the same session meanwhile runs without adaptive execution too (a streaming query plans on a session
    of its own)."""
    before = spark.conf.get(ADAPTIVE_EXECUTION, "true")
    spark.conf.set(ADAPTIVE_EXECUTION, "false")
    try:
        yield
    finally:
        spark.conf.set(ADAPTIVE_EXECUTION, before)  # pyright: ignore[reportArgumentType]


# Spark's streaming drivers log an ERROR line and the whole JVM stack when a query stops with an exception. The engine
# reports such a stop itself (LiveQueryStopped with the query's error), and a source schema change stops the query
# on purpose before the live phase takes it up and resumes: Spark's line on the console would report a failure where
# there is none. Both loggers are named after Spark 4.2's classes (tests/phases/live/test_live_schema.py pins them).
STREAM_EXECUTION_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.runtime.StreamExecution",
)


def quiet_stopped_queries(spark: SparkSession) -> None:
    """Leaves only FATAL messages of Spark's streaming query drivers on the console (see
    :data:`STREAM_EXECUTION_LOGGERS`); every other logger keeps the session's level."""
    for name in STREAM_EXECUTION_LOGGERS:
        spark_internals.set_logger_level(spark, name, "FATAL")
