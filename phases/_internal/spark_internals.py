"""Every place the engine reaches past PySpark's public API, in one module: private handles (``_jvm``,
``_jsparkSession``, ``_jsc``, ``_jdf``, an observation's ``_jo``, ``DataFrame``'s and ``Column``'s Java
constructors), Spark's status store, Delta's ``DeltaLog``, Hadoop's ``FileSystem`` through the JVM, and the files of
a streaming checkpoint that Spark writes and the engine reads or deletes (``offsets/N``, ``commits/N``).

Each holds for pyspark 4.2.0 and delta-spark 4.4.0 (the pins). ``tests/phases/runtime/test_spark_internals.py`` pins
every function here against a real session and real checkpoint files, and feeds the parsers changed files: when a new
Spark or Delta release changes one of them, that test names it. (The JVM helper's own use of Spark internals is
pinned by ``tests/phases/state/test_keyed_store.py``, its local file systems by
``tests/phases/storage/test_local_file_systems.py``.) A file format that is not what this module knows raises
:class:`~phases._internal.errors.SparkInternalsChanged`.

A leaf of the package: it imports nothing of the engine but its errors and its URI helpers.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql.types import StructType

from phases._internal import uris
from phases._internal.errors import SparkInternalsChanged

# --- handles ---------------------------------------------------------------------------------------------


def jvm(spark: SparkSession) -> Any:
    """The py4j gateway's JVM view (``spark.sparkContext._jvm``)."""
    return spark.sparkContext._jvm


def java_session(spark: SparkSession) -> Any:
    """The classic session's Java ``SparkSession``."""
    return spark._jsparkSession


def java_frame(frame: DataFrame) -> Any:
    """A DataFrame's Java ``Dataset<Row>``."""
    return frame._jdf


def frame_of(java: Any, spark: SparkSession) -> DataFrame:
    """A Python DataFrame over a Java ``Dataset<Row>`` (the JVM helper's results)."""
    return DataFrame(java, spark)


def java_column(column: Column) -> Any:
    """A Column's Java ``Column`` (classic PySpark's ``_to_java_column``)."""
    from pyspark.sql.classic.column import _to_java_column

    return _to_java_column(column)


def column_of(java: Any) -> Column:
    """A Python Column over a Java ``Column`` (the JVM helper's expressions)."""
    from pyspark.sql.classic.column import Column as ClassicColumn

    return ClassicColumn(java)


def empty_frame(spark: SparkSession, schema: StructType) -> DataFrame:
    """A DataFrame of no rows with ``schema``, made in the JVM in a few calls (``createDataFrame([], schema)`` takes
    about a hundred: it parallelizes the empty list through Python's serializers); a live micro-batch and every live
    start make several."""
    session = java_session(spark)
    java_schema = session.parseDataType(schema.json())
    return frame_of(session.createDataFrame(jvm(spark).java.util.Collections.emptyList(), java_schema), spark)


def java_list(spark: SparkSession, items: list) -> Any:
    """A ``java.util.ArrayList`` of ``items`` (py4j converts each: bytes-likes to ``byte[]``)."""
    out = jvm(spark).java.util.ArrayList()
    for item in items:
        out.add(item)
    return out


def local_copy(frame: DataFrame, max_rows: int) -> DataFrame | None:
    """``frame``'s rows collected into the driver's JVM as a local relation (a plan that reads nothing, no lineage), or
    None when ``frame`` has more than ``max_rows`` rows. One Spark job (at most ``max_rows + 1`` rows collected); the
    rows do not cross into Python."""
    java = java_frame(frame)
    rows = java.limit(max_rows + 1).collectAsList()
    if rows.size() > max_rows:
        return None
    return frame_of(java.sparkSession().createDataFrame(rows, java.schema()), frame.sparkSession)


def hadoop_configuration(spark: SparkSession) -> Any:
    return spark.sparkContext._jsc.hadoopConfiguration()


def hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """(Hadoop ``FileSystem``, ``Path``) of ``path``, for any URI Spark can write to."""
    p = jvm(spark).org.apache.hadoop.fs.Path(path)
    return p.getFileSystem(hadoop_configuration(spark)), p


def read_text(spark: SparkSession, path: str) -> str:
    """The whole text file at ``path``: a plain local path read by the OS (no JVM round trip: the micro-batch reads
    its offset log this way), any other URI through Hadoop's ``FileSystem``."""
    if uris.scheme(path) is None:
        with open(path, encoding="utf-8") as f:
            return f.read()
    return read_hadoop_text(spark, path)


def read_hadoop_text(spark: SparkSession, path: str) -> str:
    """The whole text file at ``path`` through Hadoop's ``FileSystem`` (lines joined by ``\\n``)."""
    fs, p = hadoop_path(spark, path)
    java = jvm(spark).java.io
    stream = fs.open(p)
    try:
        reader = java.BufferedReader(java.InputStreamReader(stream, "UTF-8"))
        lines = []
        line = reader.readLine()
        while line is not None:
            lines.append(line)
            line = reader.readLine()
        return "\n".join(lines)
    finally:
        stream.close()


def set_logger_level(spark: SparkSession, logger: str, level: str) -> None:
    """Sets one log4j logger's level in the driver (``FATAL``, ``ERROR``, ...)."""
    log4j = jvm(spark).org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel(logger, getattr(log4j.Level, level))


# --- SQL ---------------------------------------------------------------------------------------------------


def parse_sql_expression(spark: SparkSession, text: str) -> None:
    """Parses ``text`` as a SQL expression with the session's parser (no job); raises pyspark's
    ``ParseException``."""
    java_session(spark).sessionState().sqlParser().parseExpression(text)


def analysed_root_node(frame: DataFrame) -> str:
    """The class name of the root of ``frame``'s analysed plan (``Project``, ``Aggregate``, ...)."""
    return str(java_frame(frame).queryExecution().analyzed().getClass().getSimpleName())


def observation_has_row(observation: Observation) -> bool:
    """Whether the observed node reported its metrics; blocks until the first action on the observed frame ends.
    Spark's adaptive execution replaces a subtree it finds empty, and the observed node with it (an empty row)."""
    return observation._jo.getRow().length() > 0


# --- the status store ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageView:
    """One stage attempt as Spark's status store shows it."""

    stage_id: int
    name: str
    description: str  # the job group's description ("" when none)
    status: str  # ACTIVE, PENDING, COMPLETE, FAILED, SKIPPED
    tasks_done: int
    tasks_total: int
    input_records: int
    submitted_ms: int | None  # wall clock, ms since the epoch


def _stage_view(stage: Any) -> StageView:
    described = stage.description()
    submitted = stage.submissionTime()
    return StageView(
        stage_id=int(stage.stageId()),
        name=str(stage.name()),
        description=str(described.get()) if described.isDefined() else "",
        status=str(stage.status()),
        tasks_done=int(stage.numCompleteTasks()),
        tasks_total=int(stage.numTasks()),
        input_records=int(stage.inputRecords()),
        submitted_ms=int(submitted.get().getTime()) if submitted.isDefined() else None,
    )


def _status_store(spark: SparkSession) -> Any:
    return spark.sparkContext._jsc.sc().statusStore()


def active_stages(spark: SparkSession) -> list[StageView]:
    """The stages the session runs now."""
    stages = _status_store(spark).activeStages()
    return [_stage_view(stages.apply(i)) for i in range(stages.size())]


def stage_attempt(spark: SparkSession, stage_id: int) -> StageView | None:
    """The last attempt of stage ``stage_id``; None when the store no longer has it (skipped or evicted)."""
    try:
        return _stage_view(_status_store(spark).lastStageAttempt(stage_id))
    except Exception:  # py4j's error for Spark's NoSuchElementException
        return None


def jobs_submitted(spark: SparkSession) -> int:
    """How many jobs the session's scheduler has submitted so far (its next job id): the difference over a step is
    the Spark jobs that step ran, in any job group, however many the status store still keeps."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def stages_submitted(spark: SparkSession) -> int:
    """How many stages the session's scheduler has created so far (its next stage id): a stage created after this
    call has an id at least this one."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextStageId())


def codegen_compilations(spark: SparkSession) -> int:
    """How many generated classes the driver's JVM has compiled so far (Spark's ``CodegenMetrics``: one per
    Janino compilation, a hit of the codegen cache counts none)."""
    return int(jvm(spark).org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount())


@contextmanager
def processes_started(spark: SparkSession, folder: str | Path) -> Iterator[list[str]]:
    """Inside the block, the driver's JVM records the processes it starts (a Flight Recorder recording of
    ``jdk.ProcessStart``, Java 11+); the yielded list holds their command lines once the block ends. The recording
    is dumped into ``folder``."""
    j = jvm(spark)
    commands: list[str] = []
    recording = j.jdk.jfr.Recording()
    recording.enable("jdk.ProcessStart")
    recording.start()
    try:
        yield commands
    finally:
        recording.stop()
        dump = j.java.io.File(str(Path(folder) / f"processes-{uuid.uuid4().hex[:8]}.jfr")).toPath()
        recording.dump(dump)
        recording.close()
        events = j.jdk.jfr.consumer.RecordingFile.readAllEvents(dump)
        commands += [str(events.get(i).getString("command")) for i in range(events.size())]


# --- Delta's JVM log ----------------------------------------------------------------------------------------


def delta_transactions(spark: SparkSession, path: str, app_ids: list[str]) -> dict[str, int]:
    """The newest ``txnVersion`` each of ``app_ids`` committed to the Delta table at ``path``, from Delta's
    reconstructed snapshot (``DeltaLog.update(...).transactions()``); apps without one are missing."""
    gateway = jvm(spark)
    log = gateway.org.apache.spark.sql.delta.DeltaLog.forTable(java_session(spark), path)
    none = getattr(getattr(gateway.scala, "None$"), "MODULE$")
    transactions = log.update(False, none, none).transactions()
    out = {}
    for app in app_ids:
        version = transactions.get(app)
        if version.isDefined():
            out[app] = int(version.get())
    return out


def checkpoint_delta_log(spark: SparkSession, path: str) -> None:
    """Writes a checkpoint of the Delta table's log at its newest version."""
    jvm(spark).org.apache.spark.sql.delta.DeltaLog.forTable(java_session(spark), path).checkpoint()


# --- a streaming query's checkpoint ------------------------------------------------------------------------
# Spark writes ``offsets/N`` before micro-batch N runs and ``commits/N`` after it ran. Both are "v1", then JSON:
# the offset file's second line is the batch's metadata, then one line per source in the query's source order,
# "-" for a source with no offset yet.

OFFSET_LOG_VERSION = "v1"
COMMIT_LOG_VERSION = "v1"
OFFSETS, COMMITS = "offsets", "commits"


@dataclass(frozen=True)
class DeltaOffset:
    """A Delta source's offset: ``reservoir_version`` read up to file ``index`` (-1: every version below
    ``reservoir_version`` read whole)."""

    table_id: str
    reservoir_version: int
    index: int


@dataclass(frozen=True)
class OffsetLogEntry:
    """One ``offsets/N`` file: the batch's metadata and each source's offset (None: none yet)."""

    path: str
    metadata: dict
    sources: list[dict | None]

    def delta_offsets(self) -> list[DeltaOffset]:
        """The Delta sources' offsets, in the query's source order."""
        out = []
        for source in self.sources:
            if source is None or "reservoirVersion" not in source:
                continue
            missing = [k for k in ("reservoirId", "index") if k not in source]
            if missing:
                raise SparkInternalsChanged(
                    f"{self.path}: a Delta source offset without {missing}: {source!r}; the engine reads "
                    "reservoirId, reservoirVersion and index (delta-spark 4.4.0)"
                )
            out.append(DeltaOffset(str(source["reservoirId"]), int(source["reservoirVersion"]), int(source["index"])))
        return out

    def kafka_offsets(self, topic: str) -> dict[int, int] | None:
        """The end offsets per partition of ``topic`` (None: no source of the query reads it)."""
        for source in self.sources:
            if source is not None and isinstance(source.get(topic), dict):
                return {int(p): int(o) for p, o in source[topic].items()}
        return None


def parse_offset_log(text: str, path: str) -> OffsetLogEntry:
    """An ``offsets/N`` file's text, parsed; SparkInternalsChanged when it is not the format of pyspark 4.2.0."""
    lines = text.splitlines()
    if not lines or lines[0] != OFFSET_LOG_VERSION:
        raise SparkInternalsChanged(
            f"{path}: Spark's offset log starts with {lines[0] if lines else '(nothing)'!r}, the engine reads "
            f"{OFFSET_LOG_VERSION!r} (pyspark 4.2.0)"
        )
    try:
        metadata = json.loads(lines[1]) if len(lines) > 1 else None
        sources = [None if line == "-" else json.loads(line) for line in lines[2:]]
    except ValueError as exc:
        raise SparkInternalsChanged(f"{path}: a line of Spark's offset log is not JSON ({exc}): {text!r}") from exc
    if not isinstance(metadata, dict) or any(s is not None and not isinstance(s, dict) for s in sources):
        raise SparkInternalsChanged(f"{path}: not the offset log the engine reads (pyspark 4.2.0): {text!r}")
    return OffsetLogEntry(path, metadata, sources)


def parse_commit_log(text: str, path: str) -> dict:
    """A ``commits/N`` file's text, parsed (its metadata: ``nextBatchWatermarkMs``)."""
    lines = text.splitlines()
    if len(lines) < 2 or lines[0] != COMMIT_LOG_VERSION:
        raise SparkInternalsChanged(
            f"{path}: Spark's commit log is {text!r}, the engine reads {COMMIT_LOG_VERSION!r} and a JSON line "
            "(pyspark 4.2.0)"
        )
    try:
        return json.loads(lines[1])
    except ValueError as exc:
        raise SparkInternalsChanged(f"{path}: Spark's commit log is not JSON ({exc}): {text!r}") from exc


def checkpoint_file(checkpoint: str, log: str, batch_id: int) -> str:
    """The path of micro-batch ``batch_id``'s file in ``log`` (:data:`OFFSETS` or :data:`COMMITS`)."""
    return f"{checkpoint.rstrip('/')}/{log}/{batch_id}"


def checkpoint_batch_ids(spark: SparkSession, checkpoint: str, log: str) -> list[int]:
    """The micro-batch ids ``log`` (:data:`OFFSETS` or :data:`COMMITS`) holds, ascending."""
    fs, p = hadoop_path(spark, f"{checkpoint.rstrip('/')}/{log}")
    if not fs.exists(p):
        return []
    names = (str(status.getPath().getName()) for status in fs.listStatus(p))
    return sorted(int(n) for n in names if n.isdigit())


def read_offset_log(spark: SparkSession, checkpoint: str, batch_id: int) -> OffsetLogEntry:
    path = checkpoint_file(checkpoint, OFFSETS, batch_id)
    return parse_offset_log(read_text(spark, path), path)


def read_commit_log(spark: SparkSession, checkpoint: str, batch_id: int) -> dict:
    path = checkpoint_file(checkpoint, COMMITS, batch_id)
    return parse_commit_log(read_text(spark, path), path)


def remove_commit(spark: SparkSession, checkpoint: str, batch_id: int) -> str:
    """Deletes ``commits/<batch_id>`` so that the query's next start runs that micro-batch again (Hadoop's
    delete: the hidden checksum file goes with it); returns the path."""
    path = checkpoint_file(checkpoint, COMMITS, batch_id)
    fs, p = hadoop_path(spark, path)
    if fs.exists(p):
        fs.delete(p, False)
    return path
