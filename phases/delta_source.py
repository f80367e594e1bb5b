"""A Delta table as a two-phase source: snapshot at version V (backlog), versions V+1.. (live).

Both reads go through the change data feed so that every record carries its commit version
(``_commit_version``), which defines arrival order (see :mod:`phases.lateness`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases import tables
from phases.definition import DeltaSource
from phases.errors import SourceError

CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


class DeltaTableSource:
    def __init__(self, spark: SparkSession, spec: DeltaSource):
        self.spark = spark
        self.path = spec.path

    def check(self) -> None:
        """Fails with SourceError unless the table exists and records its change data feed."""
        if not tables.exists(self.spark, self.path):
            raise SourceError(f"source {self.path} is not a Delta table (or does not exist)")
        props = self.spark.sql(f"SHOW TBLPROPERTIES delta.`{self.path}`").collect()
        cdf = {r["key"]: r["value"] for r in props}.get("delta.enableChangeDataFeed", "false")
        if cdf.lower() != "true":
            raise SourceError(
                f"source {self.path} must have the change data feed on from its first version "
                "(table property delta.enableChangeDataFeed = true); it gives records their commit "
                "version, which defines arrival order and lateness"
            )

    def head_version(self) -> int:
        self.check()
        return tables.version(self.spark, self.path)

    def table_id(self) -> str:
        """The Delta table's id (``metaData.id``): what Spark's offset log names the source by."""
        return str(DeltaTable.forPath(self.spark, self.path).detail().select("id").collect()[0][0])

    def schema(self) -> T.StructType:
        return self.spark.read.format("delta").load(self.path).schema

    def read_backlog(self, end_version: int, start_version: int = 0) -> DataFrame:
        """All changes of versions start_version..end_version (inclusive), with their commit versions."""
        try:
            return (
                self.spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", start_version)
                .option("endingVersion", end_version)
                .load(self.path)
            )
        except AnalysisException as exc:
            raise SourceError(
                f"cannot read the change feed of {self.path} for versions {start_version}..{end_version}: {exc}"
            ) from exc

    def commit_times(self) -> list[tuple[int, datetime]]:
        """(version, commit timestamp in UTC) of every version still in the table's history, oldest first."""
        self.check()
        history = DeltaTable.forPath(self.spark, self.path).history()
        rows = history.select("version", F.unix_micros("timestamp").alias("us")).collect()
        return sorted((int(r["version"]), datetime.fromtimestamp(r["us"] / 1e6, tz=UTC)) for r in rows)

    def read_live(self, after_version: int | None, max_files_per_trigger: int | None = None) -> DataFrame:
        """A stream of the changes of the versions after ``after_version`` (all versions if None).

        Delta refuses a ``startingVersion`` beyond the head, and right after the backlog V+1 does not
        exist yet; so the stream starts at V and drops V's changes, which costs one version's read.
        """
        reader = (
            self.spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", 0 if after_version is None else after_version)
        )
        if max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
        stream = reader.load(self.path)
        if after_version is not None:
            stream = stream.filter(stream["_commit_version"] > after_version)
        return stream
