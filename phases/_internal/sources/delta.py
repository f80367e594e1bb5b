"""A Delta table as a two-phase source: snapshot at version V (backlog), versions V+1.. (live).

Both reads go through the change data feed so that every record carries its commit version
(``_commit_version``), which defines arrival order (see :mod:`phases._internal.lateness`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.definition import DeltaSource
from phases._internal.errors import SourceError
from phases._internal.sources import version_bounds
from phases._internal.storage import table_stats, tables

CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
# Spark's and Delta's words for a data file the log names but the store no longer has.
_MISSING_FILE = re.compile(
    r"FAILED_READ_FILE\.FILE_NOT_EXIST\] Encountered error while reading file (\S+?)\. File does not exist"
    r"|DELTA_CHANGE_DATA_FILE_NOT_FOUND\]\s*File (\S+) referenced"
)


class DeltaTableSource:
    arrival = "versions"  # live: the records' commit versions (a version may span micro-batches)

    def __init__(self, spark: SparkSession, spec: DeltaSource, path: str):
        """``path``: where the table is (the placement's, :meth:`phases._internal.placement.Placement.source_path`)."""
        self.spark = spark
        self.path = path
        self.starting_version = spec.starting_version

    def check(self) -> None:
        """Fails with SourceError unless the table exists and records its change data feed. The properties come from
        the log through delta-rs (a few ms; ``SHOW TBLPROPERTIES`` took 35-55 ms warm), through Spark when delta-rs
        cannot read it (store settings given to Spark only)."""
        props = table_stats.from_log(table_stats.properties, self.path)
        if props is None:
            if not tables.exists(self.spark, self.path):
                raise SourceError(f"source {self.path} is not a Delta table (or does not exist)")
            shown = self.spark.sql(f"SHOW TBLPROPERTIES delta.`{self.path}`").collect()
            props = {r["key"]: r["value"] for r in shown}
        cdf = props.get("delta.enableChangeDataFeed", "false")
        if cdf.lower() != "true":
            raise SourceError(
                f"source {self.path} must have the change data feed on from its first version "
                "(table property delta.enableChangeDataFeed = true); it gives records their commit "
                "version, which defines arrival order and lateness. Nothing was read. To proceed: ALTER TABLE "
                f"delta.`{self.path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true); the next start names "
                f"the starting_version that reads the versions before it as one snapshot ({self.declaration('N')})"
            )

    def declaration(self, starting_version: int | str) -> str:
        """How the user declares this source read from ``starting_version`` (what an error's way out says)."""
        return f"DeltaSource(path={self.path!r}, starting_version={starting_version})"

    def head_version(self) -> int:
        self.check()
        return tables.version(self.spark, self.path)

    def position_of(self, end_version: int) -> None:
        """A Delta source's position is its version alone (the manifest's ``source_version``)."""
        return None

    def table_id(self) -> str:
        """The Delta table's id (``metaData.id``): what Spark's offset log names the source by. Read from the log
        with delta-rs (no Spark job: every live start asks); through Spark when delta-rs cannot read the log."""
        found = table_stats.from_log(table_stats.table_id, self.path)
        if found is not None:
            return found
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

    def read_appended(self, end_version: int) -> DataFrame:
        """The records versions 0..end_version added, as the table's snapshot at ``end_version``: without the change
        feed's columns (no commit version per record), and the same records as :meth:`read_backlog` only when no
        version of the range removed a file, which the caller proves from the log (:mod:`version_bounds`). A batch
        read of the change feed goes through a row-based relation; the snapshot's scan is columnar (0.3 s of a
        backlog of 1e7 records)."""
        if self.starting_version > 0:
            raise SourceError(f"source {self.path}: versions 0..{self.starting_version - 1} are read as one snapshot")
        return self.spark.read.format("delta").option("versionAsOf", end_version).load(self.path)

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

    def missing_file_error(self, exc: BaseException, versions: tuple[int, int]) -> SourceError | None:
        """A SourceError naming the version whose data file is gone, when ``exc`` (raised while reading
        ``versions`` of the change feed) says a file is missing; None for any other error."""
        match = _MISSING_FILE.search(str(exc))
        if match is None:
            return None
        file = match.group(1) or match.group(2)
        version = self._version_adding(file, versions)
        which = f"version {version}" if version is not None else f"a version in {versions[0]}..{versions[1]}"
        head = self.head_version()
        return SourceError(
            f"source {self.path}: {which} of its change feed can no longer be read: its data file {file} is gone "
            "(removed by VACUUM once older than the table's retention, or deleted by hand). The backlog needs "
            f"versions {versions[0]}..{versions[1]}. To proceed: {self.declaration('N')}, where N is after that "
            "version and version N-1 is still whole (VACUUM keeps the "
            f"files of the current version, {head}, so N = {head + 1} works once a version follows it): the "
            "versions before N are then read as one snapshot of version N-1. Or keep removed files longer "
            "(delta.deletedFileRetentionDuration) than the backlog needs"
        )

    def _version_adding(self, file: str, versions: tuple[int, int]) -> int | None:
        """The version whose commit added ``file`` (read from the log with delta-rs, only on this error path)."""
        name = file.rstrip("/").rsplit("/", 1)[-1]
        try:
            return table_stats.version_adding(self.path, name, *versions)
        except SourceError:  # a diagnostic: the error still names the file and the range
            return None

    def log_bounds(self, first: int, last: int, event_time: str, keys: list[str]) -> list | None:
        """What the log says of the records versions first..last added (:mod:`phases._internal.sources.version_bounds`),
        or None when it cannot tell or the range starts inside the versions read as one snapshot."""
        if self.starting_version > 0 and first < self.starting_version:
            return None
        return version_bounds.read(self.path, first, last, event_time, keys)

    def log_max_us(self, last: int, candidates: list, top_us: int, event_time: str) -> int | None:
        """The exact greatest event time of the versions ``candidates`` of :meth:`log_bounds` (those reaching
        ``top_us``), read from the files that can hold it (:func:`version_bounds.exact_max_us`); None: read the rows."""
        return version_bounds.exact_max_us(self.path, last, candidates, top_us, event_time)

    def log_commit_times(self, first: int) -> dict[int, datetime]:
        """Commit times of versions ``first``.. to the head as the log's commits record them, read with delta-rs (no
        Spark job; :meth:`commit_times`' history job costs 0.3 s warm). They are the writer's clock at the commit,
        which may differ from :meth:`commit_times` (the commit files' times, as the change feed's
        ``_commit_timestamp``) by the commit's duration: for checks with a slack, not for version boundaries.
        :meth:`commit_times` when delta-rs cannot read the log."""
        times = table_stats.from_log(lambda p: table_stats.commit_times(p, first), self.path)
        if times is None:
            return {v: t for v, t in self.commit_times() if v >= first}
        return times

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
            f"version. To proceed: set {self.declaration(first)}; versions "
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
