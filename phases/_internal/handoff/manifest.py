"""The handoff manifest: the single source of truth for the backlog -> live switch.

One row per backlog run in a Delta table (``locations.manifests``), appended last, after the state and
the sink are committed; a Delta commit is atomic, so a crash leaves either no row or a whole one. The
live phase takes the newest row of its pipeline and refuses to start unless it is complete and matches
the pipeline definition, the state schema and the operator version.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.coordination import progress_log
from phases._internal.definition import OPERATOR_VERSION, RIGHT_LABEL, SOURCE_LABEL, STATE_SCHEMA_VERSION
from phases._internal.definition.changes import DefinitionChanges
from phases._internal.errors import ManifestError
from phases._internal.placement import Placement
from phases._internal.storage import table_stats, tables


class HandoffManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    manifest_id: str
    pipeline: str
    kind: str = "full"  # full | increment (catch-up from base_manifest_id) | slices (combined daily slices)
    base_manifest_id: str | None = None
    fingerprint: str
    state_spec: str  # JSON of Pipeline.state_spec(), kept to say *what* differs on a mismatch
    state_schema_version: int
    operator_version: int
    source_path: str
    source_version: int  # V: the backlog read versions 0..V; live starts at V+1
    # Where the source stands at V beyond the version number: a Kafka source's chunk plan (JSON: start and end
    # offsets per partition, chunk size); None for Delta.
    source_position: str | None = None
    backlog_max_event_time_us: int | None  # None when the backlog held no valid record
    final_watermark_us: int | None  # = backlog_max_event_time_us - delay = W(V+1)
    state_path: str
    state_table_version: int
    state_rows: int  # keys in the state
    input_rows: int  # change-feed rows read
    aggregated_rows: int
    late_rows: int
    invalid_rows: int
    future_rows: int | None = None  # of the invalid rows, those quarantined as far-future (max_future)
    sink_version: int
    sink_rows: int | None = None  # rows in the sink after the handoff (keys, or emitted windows)
    # The quarantine's version after the backlog's rows went in (None: a manifest from before it was recorded): a live
    # start refuses a quarantine behind it (phases._internal.live.start_checks).
    quarantine_version: int | None = None
    # The time (ms) of the sink's commit at sink_version: with the version, what identifies the handoff's sink commit
    # (None: a manifest from before it was recorded).
    sink_commit_ms: int | None = None
    right_source_version: int | None = None  # two-input operators: the right source's V (live: V+1..)
    right_max_event_time_us: int | None = None  # ... and its max event time (W_right = this - delay)
    right_source_position: str | None = None  # ... and where it stands beyond the version (Kafka: its chunk plan)
    # Where the live phase's state starts in its state store (an increment run through the live step leaves it at
    # this layout and version); None: version 1, written from the state table.
    state_store_layout: str | None = None
    state_store_version: int | None = None
    backlog_seconds: float
    created_at_us: int

    @property
    def quarantined_rows(self) -> int:
        return self.late_rows + self.invalid_rows

    @property
    def positions(self) -> dict[str, str | None]:
        """Each input's recorded position beyond its version, by input label (a Kafka input's chunk plan)."""
        return {SOURCE_LABEL: self.source_position, RIGHT_LABEL: self.right_source_position}

    @property
    def final_watermark(self) -> datetime | None:
        return _dt(self.final_watermark_us)

    @property
    def backlog_max_event_time(self) -> datetime | None:
        return _dt(self.backlog_max_event_time_us)


def _dt(us: int | None) -> datetime | None:
    return None if us is None else datetime.fromtimestamp(us / 1e6, tz=UTC)


_TYPES = {int: T.LongType(), float: T.DoubleType(), str: T.StringType()}


def _schema() -> T.StructType:
    fields = []
    for name, info in HandoffManifest.model_fields.items():
        base = info.annotation
        base = next(t for t in _TYPES if t is base or (hasattr(base, "__args__") and t in base.__args__))  # pyright: ignore[reportAttributeAccessIssue]
        fields.append(T.StructField(name, _TYPES[base], True))
    return T.StructType(fields)


SCHEMA = _schema()


def write(spark: SparkSession, path: str, manifest: HandoffManifest) -> None:
    tables.append_row(spark, path, SCHEMA, manifest.model_dump())


def latest(spark: SparkSession, path: str, pipeline: str, manifest_id: str | None = None) -> HandoffManifest:
    """The newest manifest of ``pipeline`` (or the one with ``manifest_id``); ManifestError when there is
    none, it is partial, or a newer manifest superseded the requested one."""
    if not tables.exists(spark, path):
        raise ManifestError(
            f"no handoff manifest for pipeline {pipeline!r}: {path} does not exist; run the backlog phase first"
        )
    data = _newest_row(spark, path, pipeline)
    if data is None:
        raise ManifestError(f"no handoff manifest for pipeline {pipeline!r} in {path}; run the backlog first")
    if manifest_id is not None and data["manifest_id"] != manifest_id:
        raise ManifestError(
            f"handoff manifest {manifest_id!r} of pipeline {pipeline!r} is not the newest one in {path} "
            f"(newest: {data['manifest_id']!r}); the live phase starts only from the newest handoff"
        )
    optional = {
        "backlog_max_event_time_us",
        "final_watermark_us",
        "base_manifest_id",
        "sink_rows",
        "right_source_version",
        "right_max_event_time_us",
        "future_rows",
        "source_position",
        "right_source_position",
        "state_store_layout",
        "state_store_version",
        "quarantine_version",
        "sink_commit_ms",
    }
    missing = sorted(k for k, v in data.items() if v is None and k not in optional)
    if missing:
        raise ManifestError(f"partial handoff manifest {data.get('manifest_id')!r} in {path}: missing {missing}")
    return HandoffManifest(**data)


def _newest_row(spark: SparkSession, path: str, pipeline: str) -> dict | None:
    """The newest manifest row of ``pipeline`` as a dict (None: none)."""
    return max(_rows_of(spark, path, pipeline), key=lambda row: row["created_at_us"], default=None)


def _rows_of(spark: SparkSession, path: str, pipeline: str) -> list[dict]:
    """Every manifest row of ``pipeline`` as dicts. Read with delta-rs (a few rows, no Spark job: a live start reads
    them every time); a log delta-rs cannot read (store settings given to Spark only) is read through Spark."""
    found = table_stats.from_log(lambda p: table_stats.rows(p, where=("pipeline", pipeline)), path)
    if found is not None:
        return found
    return [r.asDict() for r in spark.read.format("delta").load(path).filter(F.col("pipeline") == pipeline).collect()]


def base_sink_versions(spark: SparkSession, path: str, handoff: HandoffManifest) -> dict[str, int]:
    """The handoffs ``handoff`` builds on (its base, the base's base, ...: catch-up increments on a backlog) by
    manifest id, each with its sink version. Empty for a handoff with no base."""
    by_id = {row["manifest_id"]: row for row in _rows_of(spark, path, handoff.pipeline)}
    bases: dict[str, int] = {}
    base = handoff.base_manifest_id
    while base is not None and base in by_id and base not in bases:
        bases[base] = int(by_id[base]["sink_version"])
        base = by_id[base]["base_manifest_id"]
    return bases


def check_matches(
    spark: SparkSession,
    manifest: HandoffManifest,
    where: Placement,
    amended: frozenset[tuple[str, str]] = frozenset(),
) -> None:
    """Raises ManifestError saying what differs between the manifest and the pipeline (or its state). ``amended``:
    the (manifest id, fingerprint) pairs the redeploy log accepts for a handoff
    (:attr:`phases._internal.deployment.generations.Generations.amended`)."""
    problems: list[str] = []
    if manifest.state_schema_version != STATE_SCHEMA_VERSION:
        problems.append(
            f"state schema version: manifest {manifest.state_schema_version}, engine {STATE_SCHEMA_VERSION}"
        )
    if manifest.operator_version != OPERATOR_VERSION:
        problems.append(f"operator version: manifest {manifest.operator_version}, engine {OPERATOR_VERSION}")
    pipeline = where.definition
    if not where.is_fingerprint(manifest.fingerprint):
        changes = DefinitionChanges.between(manifest.state_spec, pipeline.state_spec())
        if changes.way == "forward" and (manifest.manifest_id, pipeline.fingerprint()) in amended:
            pass  # a redeploy recorded the change: the live phase goes on from the handoff's state
        elif changes.way == "forward":
            problems += [d.describe("manifest", "pipeline") for d in changes.differences]
            problems.append(
                "these changes apply to records from now on and need no new backlog: record them with "
                "phases.Redeploy(spark, pipeline).run(), then start the live phase"
            )
        else:
            problems += [d.describe("manifest", "pipeline") for d in changes.differences] or [
                f"fingerprint: manifest {manifest.fingerprint}, pipeline {pipeline.fingerprint()}"
            ]
    if not problems:
        if not tables.exists(spark, manifest.state_path):
            problems.append(f"state table {manifest.state_path} is missing")
        elif progress_log.live_started(spark, where.live_run(manifest.manifest_id)):
            pass  # the live phase started: its state is the run's store; the table stays the handoff's record
        else:
            v, n = _version_and_rows(spark, manifest.state_path)
            if v != manifest.state_table_version or n != manifest.state_rows:
                problems.append(
                    f"state table {manifest.state_path}: manifest says version {manifest.state_table_version} "
                    f"with {manifest.state_rows} rows, the table has version {v} with {n} rows"
                )
    if problems:
        raise ManifestError(
            f"handoff manifest {manifest.manifest_id} does not match pipeline {pipeline.name!r}: " + "; ".join(problems)
        )


def _version_and_rows(spark: SparkSession, path: str) -> tuple[int, int]:
    """The state table's head version and row count, from its log (delta-rs) when it can tell; else by Spark."""
    counted = table_stats.from_log(table_stats.counted_rows, path)
    version, rows = counted if counted is not None else (tables.version(spark, path), None)
    if rows is None:
        rows = spark.read.format("delta").load(path).count()
    return version, rows
