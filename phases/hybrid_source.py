"""A hybrid source (FLIP-327's first example, Flink's ``HybridSource``): a Delta archive as the backlog, then a
Kafka topic as the live input, handed over at recorded offsets.

The handoff offsets (given, or resolved from a timestamp when the backlog starts) are recorded in the manifest as
a chunk plan whose end offsets are where the live phase starts. The backlog reads the archive's change feed like a
Delta source and, when the archive keeps each record's Kafka position, takes only records before the handoff
offsets: a record in both the archive and the topic is counted once, by the phase its offset belongs to. Arrival
order: the archive's versions 0..V, then one chunk per live micro-batch (V+1, V+2, ...).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases import fs
from phases.definition import FileArchive, HybridSource
from phases.delta_source import CHANGE_COLUMNS, DeltaTableSource
from phases.errors import SourceError
from phases.kafka_source import ChunkPlan, KafkaTopicSource, client_conf


class HybridArchiveSource:
    """The archive for the backlog, the topic for the live phase."""

    arrival = "chunks"  # live: one arrival chunk per micro-batch

    def __init__(self, spark: SparkSession, spec: HybridSource, *, position: str | None = None):
        self.spark = spark
        self.spec = spec
        self.kafka = KafkaTopicSource(spark, spec.live, position=position)
        if isinstance(spec.backlog, FileArchive):
            cut = [
                T.StructField(spec.archive_partition_column, T.IntegerType(), True),
                T.StructField(spec.archive_offset_column, T.LongType(), True),
            ]
            columns = [*self.kafka.schema().fields, *(cut if spec.archive_partition_column else [])]
            self.archive = FileArchiveSource(spark, spec.backlog, T.StructType(columns))
        else:
            self.archive = DeltaTableSource(spark, spec.backlog)
        self.topic = spec.live.topic
        self._handoff: dict[int, int] | None = None

    # --- shared ------------------------------------------------------------------------------------
    def check(self) -> None:
        self.archive.check()
        self.kafka.check()

    def schema(self) -> T.StructType:
        """The records' schema: the topic's declared value schema (the archive must hold those columns)."""
        return self.kafka.schema()

    def table_id(self) -> str:
        return self.kafka.table_id()

    # --- backlog: the archive, cut at the handoff ---------------------------------------------------
    def handoff_offsets(self) -> dict[int, int]:
        """The first offset of each partition the live phase reads, resolved once per runner."""
        if self._handoff is None:
            marks = self.kafka.watermarks()
            h = self.spec.handoff
            if h.offsets is not None:
                unknown = sorted(set(h.offsets) - set(marks))
                if unknown:
                    raise SourceError(
                        f"{self.spec.live.location}: handoff.offsets name partitions {unknown} the topic does not have "
                        f"(it has {sorted(marks)})"
                    )
                self._handoff = {p: h.offsets.get(p, 0) for p in marks}
            else:
                self._handoff = _offsets_for_time(client_conf(self.spec.live), self.topic, marks, h.timestamp)
        return self._handoff

    def head_version(self) -> int:
        return self.archive.head_version()

    def position_of(self, end_version: int) -> str:
        """The manifest's record of the handoff: a chunk plan that ends (and starts) at the handoff offsets, its
        chunks numbered after the archive's last version."""
        offsets = self.handoff_offsets()
        return ChunkPlan(
            self.topic, dict(offsets), dict(offsets), self.spec.live.backlog_chunk_records, end_version + 1
        ).to_json()

    def require_change_feed(self, end_version: int) -> None:
        self.archive.require_change_feed(end_version)
        self._require_columns()
        self.kafka._require_available(self.handoff_offsets(), "the live phase after the archive")

    def _require_columns(self) -> None:
        have = {f.name: f for f in self.archive.schema().fields}
        wanted = [f.name for f in self.schema().fields]
        cut = [c for c in (self.spec.archive_partition_column, self.spec.archive_offset_column) if c]
        missing = [c for c in [*wanted, *cut] if c not in have]
        if missing:
            raise SourceError(
                f"hybrid source: the archive {self.spec.backlog.location} lacks columns {missing} (the topic's "
                f"value_schema fields{' and the Kafka position columns' if cut else ''}); its columns: {sorted(have)}"
            )

    def read_backlog(self, end_version: int, start_version: int = 0) -> DataFrame:
        """The archive's changes of versions start..end with only the records before the handoff offsets (when
        the archive keeps Kafka positions), as the topic's records."""
        changes = self.archive.read_backlog(end_version, start_version)
        s = self.spec
        if s.archive_partition_column is not None:
            offsets = self.handoff_offsets()
            limit = F.create_map(*[x for p, o in sorted(offsets.items()) for x in (F.lit(p), F.lit(o))])
            partition, offset = F.col(s.archive_partition_column), F.col(s.archive_offset_column)
            # A record of a partition the topic no longer has is the archive's alone: kept.
            before = F.coalesce(offset < limit[partition.cast("int")], F.lit(True))
            changes = changes.filter(before)
        fields = [f.name for f in self.schema().fields]
        return changes.select(*fields, *CHANGE_COLUMNS)

    def missing_file_error(self, exc: BaseException, versions: tuple[int, int]) -> SourceError | None:
        return self.archive.missing_file_error(exc, versions)

    def commit_times(self):
        return self.archive.commit_times()

    # --- live: the topic from the handoff offsets ---------------------------------------------------
    def read_live(
        self,
        after_version: int | None,
        max_files_per_trigger: int | None = None,
        *,
        start_offsets: dict[int, int] | None = None,
    ) -> DataFrame:
        if self.kafka.position is None:
            raise SourceError(
                f"hybrid source {self.spec.location}: the live phase starts only from a handoff (the archive's backlog "
                "records where the topic takes over); there is no single streaming job over an archive and a topic"
            )
        return self.kafka.read_live(after_version, max_files_per_trigger, start_offsets=start_offsets)


def _offsets_for_time(conf: dict, topic: str, marks: dict[int, tuple[int, int]], at) -> dict[int, int]:
    """Per partition, the first offset whose timestamp is >= ``at`` (the end offset when there is none)."""
    from confluent_kafka import Consumer, TopicPartition

    ms = int(at.timestamp() * 1000)
    consumer = Consumer({**conf, "group.id": "phases-probe", "enable.auto.commit": False})
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, p, ms) for p in sorted(marks)], timeout=30)
    finally:
        consumer.close()
    out = {}
    for tp in found:
        if tp.error is not None:
            raise SourceError(
                f"kafka topic {topic!r}: resolving handoff timestamp {at} for partition {tp.partition}: {tp.error}"
            )
        out[tp.partition] = tp.offset if tp.offset >= 0 else marks[tp.partition][1]
    return out


class FileArchiveSource:
    """A folder of Parquet/JSON files read as versions: file ``i`` (by name) is version ``i``."""

    arrival = "versions"

    def __init__(self, spark: SparkSession, spec: FileArchive, schema: T.StructType):
        self.spark = spark
        self.spec = spec
        self._schema = schema

    def files(self) -> list[str]:
        """The archive's data files, by name (names starting with '_' or '.' skipped)."""
        names = [n for n in fs.list_names(self.spark, self.spec.path) if not n.startswith(("_", "."))]
        if not names:
            raise SourceError(f"archive {self.spec.location}: no data files (does the folder exist?)")
        return sorted(names)

    def check(self) -> None:
        self.files()

    def schema(self) -> T.StructType:
        return self._schema

    def head_version(self) -> int:
        return len(self.files()) - 1

    def require_change_feed(self, end_version: int) -> None:
        self.check()

    def read_backlog(self, end_version: int, start_version: int = 0) -> DataFrame:
        """The records of files start..end (by name), each with its file's index as ``_commit_version`` and the
        file's modification time as ``_commit_timestamp``."""
        names = self.files()[start_version : end_version + 1]
        index = F.create_map(*[x for i, n in enumerate(names, start_version) for x in (F.lit(n), F.lit(i))])
        paths = [f"{self.spec.path.rstrip('/')}/{n}" for n in names]
        records = self.spark.read.format(self.spec.format.value).schema(self._schema).load(paths)
        name = F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1)
        return records.select(
            *[F.col(f.name) for f in self._schema.fields],
            F.lit("insert").alias("_change_type"),
            index[name].cast("long").alias("_commit_version"),
            F.col("_metadata.file_modification_time").alias("_commit_timestamp"),
        )

    def missing_file_error(self, exc: BaseException, versions: tuple[int, int]) -> SourceError | None:
        return None

    def commit_times(self):
        raise SourceError(f"archive {self.spec.location}: a file archive has no commit history")
