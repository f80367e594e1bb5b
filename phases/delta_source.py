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
        self.starting_version = spec.starting_version

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
        """All changes of versions start_version..end_version (inclusive), with their commit versions.

        With a ``starting_version`` s > 0, versions 0..s-1 come as one snapshot of version s-1 (every row an
        insert of version s-1, with its commit time); a range can start at 0 or at s or later only."""
        s = self.starting_version
        if s == 0 or start_version >= s:
            return self._changes(start_version, end_version)
        if start_version > 0:
            raise SourceError(
                f"source {self.path}: versions {start_version}..{end_version} start inside the versions "
                f"0..{s - 1} that are read as one snapshot (starting_version {s}); only a range from version 0 "
                "can read them: run the full backlog instead of a catch-up increment or daily slice"
            )
        at = min(end_version, s - 1)
        snapshot = (
            self.spark.read.format("delta")
            .option("versionAsOf", at)
            .load(self.path)
            .select(
                "*",
                F.lit("insert").alias("_change_type"),
                F.lit(at).cast("long").alias("_commit_version"),
                F.lit(self._commit_time(at)).cast("timestamp").alias("_commit_timestamp"),
            )
        )
        if end_version < s:
            return snapshot
        return snapshot.unionByName(self._changes(s, end_version))

    def _changes(self, start_version: int, end_version: int) -> DataFrame:
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

    def _commit_time(self, version: int) -> datetime:
        times = dict(self.commit_times())
        if version not in times:
            raise SourceError(
                f"source {self.path}: version {version} is no longer in the table's history (log retention); "
                "its snapshot's commit time is unknown"
            )
        return times[version]

    def _has_change_data(self, version: int) -> bool:
        try:
            self._changes(version, version).limit(1).collect()
        except (AnalysisException, SourceError) as exc:
            if "DELTA_MISSING_CHANGE_DATA" in str(exc) or "change data was not recorded" in str(exc):
                return False
            raise
        return True

    def change_feed_start(self) -> int:
        """The first version whose change data is recorded: 0, or the version at which
        ``delta.enableChangeDataFeed`` was last turned on (from the table's history)."""
        if self._has_change_data(0):
            return 0
        history = DeltaTable.forPath(self.spark, self.path).history()
        turned_on = sorted(
            int(r["version"])
            for r in history.select("version", "operationParameters").collect()
            if '"delta.enableChangeDataFeed":"true"' in (r["operationParameters"] or {}).get("properties", "")
        )
        for version in turned_on:
            if self._has_change_data(version):
                return version
        raise SourceError(
            f"source {self.path} has no recorded change data at any version; turn it on with ALTER TABLE "
            f"delta.`{self.path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )

    def require_change_feed(self, end_version: int) -> None:
        """Fails with SourceError unless versions starting_version..end_version have their change data, naming
        the first version that has it and the way to proceed."""
        s = self.starting_version
        if s > end_version:
            raise SourceError(
                f"source {self.path}: starting_version {s} is after the backlog's end version {end_version}; the "
                "backlog must read at least the first version of the change feed"
            )
        if self._has_change_data(s):
            return
        first = self.change_feed_start()
        if first <= s:
            return
        raise SourceError(
            f"source {self.path} records its change data feed only from version {first} (when "
            "delta.enableChangeDataFeed was turned on; see DESCRIBE HISTORY): versions before it carry no commit "
            f"version. To proceed: set DeltaSource(path={self.path!r}, starting_version={first}); versions "
            f"0..{first - 1} are then read as one snapshot of version {first - 1} (one arrival), later versions "
            "through the change feed"
        )

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
