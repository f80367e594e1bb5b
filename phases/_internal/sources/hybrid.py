"""A hybrid source (FLIP-327's first example, Flink's ``HybridSource``): a Delta archive as the backlog, then a
Kafka topic as the live input, handed over at recorded offsets.

The handoff offsets (given, or resolved from a timestamp when the backlog starts) are recorded in the manifest as
a chunk plan whose end offsets are where the live phase starts. The backlog reads the archive's change feed like a
Delta source and, when the archive keeps each record's Kafka position, takes only records before the handoff
offsets: a record in both the archive and the topic is counted once, by the phase its offset belongs to. Arrival
order: the archive's versions 0..V, then one chunk per live micro-batch (V+1, V+2, ...).
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal import uris
from phases._internal.definition import FileArchive, HybridSource
from phases._internal.errors import SourceError
from phases._internal.sources.delta import CHANGE_COLUMNS, DeltaTableSource
from phases._internal.sources.kafka import ChunkPlan, KafkaTopicSource, client_conf
from phases._internal.storage import fs


class HybridArchiveSource:
    """The archive for the backlog, the topic for the live phase."""

    arrival = "chunks"  # live: one arrival chunk per micro-batch

    def __init__(
        self, spark: SparkSession, spec: HybridSource, path: str, brokers: str, *, position: str | None = None
    ):
        """``path``: where the archive is; ``brokers``: where its topic is (both the placement's)."""
        self.spark = spark
        self.spec = spec
        self.kafka = KafkaTopicSource(spark, spec.live, brokers, position=position)
        if isinstance(spec.backlog, FileArchive):
            cut = []
            if spec.archive_partition_column is not None:  # else the archive is taken whole
                cut = [
                    T.StructField(spec.archive_partition_column, T.IntegerType(), True),
                    T.StructField(spec.archive_offset_column, T.LongType(), True),  # pyright: ignore[reportArgumentType]
                ]
            columns = [*self.kafka.schema().fields, *cut]
            self.archive = FileArchiveSource(spark, spec.backlog, T.StructType(columns), path)
        else:
            self.archive = DeltaTableSource(spark, spec.backlog, path)
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

    def check_batch(self, rows) -> None:
        """A live micro-batch's rows, checked as the topic's (:meth:`KafkaTopicSource.check_batch`)."""
        self.kafka.check_batch(rows)

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
                self._handoff = _offsets_for_time(
                    client_conf(self.spec.live, self.kafka.brokers), self.topic, marks, h.timestamp
                )
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
            partition, offset = F.col(s.archive_partition_column), F.col(s.archive_offset_column)  # pyright: ignore[reportArgumentType]
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

    def __init__(self, spark: SparkSession, spec: FileArchive, schema: T.StructType, path: str):
        self.spark = spark
        self.spec = spec
        self.path = path
        self._schema = schema

    def files(self) -> list[str]:
        """The archive's data files, by name (names starting with '_' or '.' skipped)."""
        names = [n for n in fs.list_names(self.spark, self.path) if not n.startswith(("_", "."))]
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
        file's modification time as ``_commit_timestamp``.

        Parquet stores some columns in forms Spark does not read into the declared type; those files are read with
        the column as its 64-bit integer and converted exactly, after a check (one Spark job over those columns):

        - timestamps in nanoseconds (``TIMESTAMP(NANOS)``: what pandas and pyarrow write by default) become
          Spark's microseconds; a value that is no whole microsecond is a :class:`SourceError`;
        - 64-bit integers (pandas' ``int64``) where the schema says ``int``, ``smallint`` or ``tinyint`` are
          narrowed; a value out of range is a :class:`SourceError`.

        Either error names the file, the column and the value."""
        names = self.files()[start_version : end_version + 1]
        index = F.create_map(*[x for i, n in enumerate(names, start_version) for x in (F.lit(n), F.lit(i))])
        paths = [f"{self.path.rstrip('/')}/{n}" for n in names]
        name = F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1)
        out = None
        for wide, group in self._by_wide_columns(paths).items():
            longs = {c for c, _ in wide}
            as_read = [T.StructField(f.name, T.LongType(), True) if f.name in longs else f for f in self._schema.fields]
            records = self.spark.read.format(self.spec.format.value).schema(T.StructType(as_read)).load(group)
            exact = self._exact(records, dict(wide)) if wide else [F.col(f.name) for f in self._schema.fields]
            frame = records.select(
                *exact,
                F.lit("insert").alias("_change_type"),
                index[name].cast("long").alias("_commit_version"),
                F.col("_metadata.file_modification_time").alias("_commit_timestamp"),
            )
            out = frame if out is None else out.unionByName(frame)
        return out  # pyright: ignore[reportReturnType]

    def _by_wide_columns(self, paths: list[str]) -> dict[frozenset[tuple[str, str]], list[str]]:
        """The files grouped by which schema columns they store as 64-bit integers Spark will not read into the
        declared type: (column, "nanos" | "int64") pairs, from the Parquet footers (pyarrow; JSON: none)."""
        declared = {f.name: f.dataType for f in self._schema.fields}
        groups: dict[frozenset[tuple[str, str]], list[str]] = {}
        for path in paths:
            wide: frozenset[tuple[str, str]] = frozenset()
            if self.spec.format.value == "parquet":
                stored = _int64_columns(path)
                wide = frozenset((c, how) for c, how in stored.items() if _needs_conversion(declared.get(c), how))
            groups.setdefault(wide, []).append(path)
        return groups

    def _exact(self, records: DataFrame, wide: dict[str, str]) -> list[Column]:
        """The schema's columns, ``wide`` ones converted from their 64-bit integers; :class:`SourceError` naming the
        first value that has no exact conversion."""
        declared = {f.name: f.dataType for f in self._schema.fields}
        problems = {}
        for c, how in wide.items():
            if how == "nanos":
                problems[c] = F.col(c) % 1000 != 0
            else:
                bits = _VALUE_BITS[type(declared[c])]
                problems[c] = (F.col(c) < -(2**bits)) | (F.col(c) >= 2**bits)
        bad = F.lit(False)
        for problem in problems.values():
            bad = bad | F.coalesce(problem, F.lit(False))
        found = records.filter(bad).select("_metadata.file_path", *wide).limit(1).collect()
        if found:
            row = found[0]
            c = next(c for c in wide if row[c] is not None and not _exact_value(row[c], wide[c], declared[c]))
            if wide[c] == "nanos":
                why = (
                    f"stores timestamps in nanoseconds (Parquet TIMESTAMP(NANOS), pandas' and pyarrow's default) and "
                    f"holds {row[c]} ns, which is not a whole number of microseconds (Spark's timestamp unit): rewrite "
                    "the file with microsecond timestamps (pandas: df.to_parquet(path, coerce_timestamps='us')) or "
                    "round its values"
                )
            else:
                why = (
                    f"stores 64-bit integers and holds {row[c]}, which does not fit the declared "
                    f"{declared[c].simpleString()}: declare the column bigint"
                )
            raise SourceError(f"archive {self.spec.location}: file {row['file_path']}: column {c!r} {why}")
        out = []
        for f in self._schema.fields:
            how = wide.get(f.name)
            if how == "nanos":
                out.append(F.timestamp_micros(F.expr(f"`{f.name}` div 1000")).alias(f.name))
            elif how == "int64":
                out.append(F.col(f.name).cast(f.dataType).alias(f.name))
            else:
                out.append(F.col(f.name))
        return out

    def missing_file_error(self, exc: BaseException, versions: tuple[int, int]) -> SourceError | None:
        return None

    def commit_times(self):
        raise SourceError(f"archive {self.spec.location}: a file archive has no commit history")


_VALUE_BITS = {T.IntegerType: 31, T.ShortType: 15, T.ByteType: 7}  # a narrower integer's value bits (plus sign)


def _needs_conversion(declared: T.DataType | None, stored: str) -> bool:
    if stored == "nanos":
        return isinstance(declared, T.TimestampType)
    return type(declared) in _VALUE_BITS


def _exact_value(value: int, how: str, declared: T.DataType) -> bool:
    """The Python side of the rule :meth:`FileArchiveSource._exact` checks in Spark: which column to name."""
    if how == "nanos":
        return value % 1000 == 0
    bits = _VALUE_BITS[type(declared)]
    return -(2**bits) <= value < 2**bits


def _int64_columns(path: str) -> dict[str, str]:
    """Top-level columns of the Parquet file at ``path`` stored as 64-bit integers: "nanos" for
    ``TIMESTAMP(NANOS)``, "int64" for plain integers (its footer only; {} when pyarrow cannot open it)."""
    import pyarrow.parquet as pq

    try:
        filesystem, inner = uris.pyarrow_filesystem(path)
        schema = pq.ParquetFile(inner, filesystem=filesystem).schema
    except Exception:  # noqa: BLE001 - a store pyarrow cannot open: Spark's own read reports what is wrong
        return {}
    out = {}
    for i in range(len(schema)):
        column = schema.column(i)
        if "." in column.path or column.physical_type != "INT64":
            continue
        logical = json.loads(column.logical_type.to_json() or "{}")
        kind = logical.get("Type")
        if kind == "Timestamp" and logical.get("timeUnit") == "nanoseconds":
            out[column.name] = "nanos"
        elif kind in (None, "None", "Int"):
            out[column.name] = "int64"
    return out
