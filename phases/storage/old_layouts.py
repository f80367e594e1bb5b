"""What earlier releases left on disk, read in its old layout: the only module that knows those layouts.

* A live run's progress kept in a Delta table ``<run folder>/progress`` (releases before 2026-11-24; now a folder
  of small files, :mod:`phases.storage.progress_log`). Such a run resumes from that table's last row.
* The two-query live layout (releases before 2026-11-23): a run has started once its operator query committed
  ``checkpoints/<run>/aggregate/commits/0``.
* A quarantine table without the Kafka position columns (``kafka_topic``, ``kafka_partition``, ``kafka_offset``;
  releases before 2026-11-24): they are added.

**Remove after 2027-06-01** (:data:`REMOVE_AFTER`): by then every live run of those releases has been replaced by
a newer handoff. ``tests/phases/test_old_layouts.py`` fails from that day on, naming this module and its callers.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases.storage import fs, tables

REMOVE_AFTER = date(2027, 6, 1)

PROGRESS_TABLE = "progress"  # under a live run's folder
TWO_QUERY_OPERATOR = "aggregate"  # under a live run's checkpoint folder


def progress_table_record(spark: SparkSession, run_root: str) -> dict | None:
    """The last progress row of a run that kept its progress in a Delta table, as a progress record (None: the run
    has no such table, or it is empty)."""
    path = f"{run_root.rstrip('/')}/{PROGRESS_TABLE}"
    if not tables.exists(spark, path):
        return None
    rows = spark.read.format("delta").load(path).orderBy(F.col("batch_id").desc()).limit(1).collect()
    return rows[0].asDict() if rows else None


def has_progress_table(spark: SparkSession, run_root: str) -> bool:
    return tables.exists(spark, f"{run_root.rstrip('/')}/{PROGRESS_TABLE}")


def two_query_run_started(spark: SparkSession, checkpoint_root: str) -> bool:
    """True when a run of the two-query layout committed its operator query's first micro-batch."""
    return fs.exists(spark, f"{checkpoint_root.rstrip('/')}/{TWO_QUERY_OPERATOR}/commits/0")


def add_missing_columns(spark: SparkSession, path: str, schema: T.StructType) -> None:
    """Adds to the Delta table at ``path`` the columns of ``schema`` it lacks (a table an earlier release made)."""
    have = set(spark.read.format("delta").load(path).columns)
    missing = [f for f in schema.fields if f.name not in have]
    if missing:
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
