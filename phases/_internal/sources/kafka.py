"""A Kafka topic as a two-phase source, with **arrival chunks** in the role of Delta's commit versions.

Lateness is defined by arrival order (:mod:`phases._internal.lateness`): W(v) = max valid event time of the versions
before v, minus the delay. Kafka has offsets per partition but no global commit order, so the framework
numbers *arrival chunks* and gives every record its chunk as ``_commit_version``:

* **backlog**: the end offsets of every partition are captured when the backlog starts; from each partition's
  start offset (its earliest, or where the previous handoff ended) the offsets are cut into slices of
  ``backlog_chunk_records``: chunk ``first + i`` holds offsets ``[start + i*n, start + (i+1)*n)`` of every
  partition (clipped to the end offsets). The plan (start and end offsets, chunk size, first chunk) is recorded
  in the handoff manifest (``source_position``), so the chunks of a backlog never change;
* **live**: each micro-batch is one chunk: the next number after the previous batch's (the progress log), holding
  the offset ranges Spark's offset log gives that batch. A replayed batch reads the same ranges (Spark writes
  its offsets before running the batch) and gets the same number from the previous batch's progress. Each
  batch's end offsets are kept in its progress record: the live half of the arrival-chunk log.

One streaming job over the same chunks (one micro-batch per chunk) tags exactly the records the two phases tag.
The record's Kafka timestamp stands for its version's commit time (the ``max_future`` guard). A value that is
not JSON of the declared schema (or a null value) is kept with ``_decode_error`` and ``_raw``: it is
quarantined with its topic, partition and offset.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.definition import HybridSource, KafkaSource
from phases._internal.errors import PhasesError, SourceError
from phases._internal.runtime import kafka_client_log
from phases._internal.sources import kafka_records
from phases._internal.sources.kafka_records import DECODE_ERROR, OFFSET, PARTITION, TOPIC

EARLIEST = -2  # Spark's and Kafka's code for "the earliest offset" in an offsets JSON
# Records a consumer poll returns (Kafka's default: 500). Spark's reader polls until a task's range is read: 1M records
# of a local topic took 2.0 s at 500 a poll, 1.55 s at 20,000. A user's ``options`` may set another.
MAX_POLL_RECORDS = 10_000


@dataclass(frozen=True)
class ChunkPlan:
    """The backlog's arrival chunks: chunk ``first + i`` holds offsets ``[start + i*size, start + (i+1)*size)``
    of each partition, below its end offset. A catch-up increment's plan continues an earlier handoff's: it starts
    at that plan's end offsets, numbers its chunks after it, and keeps the earlier plans (``earlier``, oldest first)
    so that the whole arrival order stays on record."""

    topic: str
    start: dict[int, int]
    end: dict[int, int]
    size: int
    first: int = 0
    earlier: tuple[ChunkPlan, ...] = ()

    @property
    def segments(self) -> list[ChunkPlan]:
        """The earlier plans and this one, oldest first (each without its own ``earlier``)."""
        return [*self.earlier, ChunkPlan(self.topic, self.start, self.end, self.size, self.first)]

    @property
    def origin(self) -> dict[int, int]:
        """Where the first of the plans started: what a backlog from the topic's start reads again."""
        return self.earlier[0].start if self.earlier else self.start

    def cut(self, until: dict[int, int]) -> ChunkPlan:
        """This plan ending at ``until``."""
        return ChunkPlan(self.topic, self.start, until, self.size, self.first, self.earlier)

    def continued(self, marks: dict[int, tuple[int, int]], first: int) -> ChunkPlan:
        """The plan of an increment after this one: from this plan's end offsets (a partition added since: from its
        earliest offset) to the end offsets in ``marks`` (partition -> (earliest, end)), chunks numbered from
        ``first``."""
        start = {p: self.end.get(p, lo) for p, (lo, _) in marks.items()}
        end = {p: max(hi, start[p]) for p, (_, hi) in marks.items()}
        return ChunkPlan(self.topic, start, end, self.size, first, tuple(self.segments))

    @property
    def empty(self) -> bool:
        """Whether the plan holds no offset."""
        return all(self.end[p] <= self.start.get(p, self.end[p]) for p in self.end)

    @property
    def chunks(self) -> int:
        """How many chunks the plan has (at least one, possibly empty: the backlog always has a version)."""
        longest = max((self.end[p] - self.start[p] for p in self.end), default=0)
        return max(1, -(-longest // self.size))

    @property
    def last(self) -> int:
        return self.first + self.chunks - 1

    def offsets(self, lo: int, hi: int) -> tuple[dict[int, int], dict[int, int]]:
        """(from, until) offsets per partition of chunks lo..hi."""
        a = {p: min(self.end[p], self.start[p] + (lo - self.first) * self.size) for p in self.end}
        b = {p: min(self.end[p], self.start[p] + (hi - self.first + 1) * self.size) for p in self.end}
        return a, b

    def _fields(self) -> dict:
        return {"topic": self.topic, "start": self.start, "end": self.end, "size": self.size, "first": self.first}

    def to_json(self) -> str:
        data = self._fields()
        if self.earlier:
            data["earlier"] = [plan._fields() for plan in self.earlier]
        return json.dumps(data, sort_keys=True)

    @staticmethod
    def _of(data: dict, earlier: tuple[ChunkPlan, ...] = ()) -> ChunkPlan:
        return ChunkPlan(
            data["topic"],
            {int(p): int(o) for p, o in data["start"].items()},
            {int(p): int(o) for p, o in data["end"].items()},
            int(data["size"]),
            int(data["first"]),
            earlier,
        )

    @staticmethod
    def from_json(text: str) -> ChunkPlan:
        data = json.loads(text)
        return ChunkPlan._of(data, tuple(ChunkPlan._of(e) for e in data.get("earlier", ())))


def offsets_json(topic: str, offsets: dict[int, int]) -> str:
    """Spark's offsets JSON (``startingOffsets``/``endingOffsets``) for one topic."""
    return json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}})


class KafkaTopicSource:
    """Reads one topic for the backlog (Spark batch, by chunk plan) and the live phase (Spark stream)."""

    arrival = "chunks"  # live: one arrival chunk per micro-batch

    def __init__(
        self,
        spark: SparkSession,
        spec: KafkaSource,
        brokers: str,
        *,
        position: str | None = None,
        continue_from: str | None = None,
        first: int = 0,
        plan: str | None = None,
    ):
        """``position``: the handoff's chunk plan (JSON); the live phase starts at its end offsets. A catch-up
        increment's reader continues the plan ``continue_from`` (its base handoff's) with chunks numbered from
        ``first``, up to the end offsets when it is first asked, or follows the recorded ``plan`` (a rerun's).
        ``brokers``: where the topic is (:meth:`phases._internal.placement.Placement.source_brokers`)."""
        self.spark = spark
        self.spec = spec
        self.brokers = brokers
        self.topic = spec.topic
        self.position = position
        self.continue_from, self.first = continue_from, first
        self._plan: ChunkPlan | None = ChunkPlan.from_json(plan) if plan is not None else None
        self._cached: list[DataFrame] = []
        # Avro or Protobuf values: the registry's versions of the subject (read again for each backlog read and each
        # query); None for JSON.
        self.registered = kafka_records.registered_values(spark, spec)
        self.registered_keys = kafka_records.registered_values(spark, spec, key=True)

    # --- the broker, without Spark ----------------------------------------------------------------
    def _client_conf(self) -> dict:
        return client_conf(self.spec, self.brokers)

    def watermarks(self, timeout: float | None = None) -> dict[int, tuple[int, int]]:
        """(earliest, end) offset of every partition of the topic, from the broker (waiting at most ``timeout``, by
        default the source's ``connect_timeout``)."""
        wait = self.spec.connect_timeout.total_seconds() if timeout is None else timeout
        return partition_watermarks(self._client_conf(), self.topic, wait)

    def check(self) -> None:
        self.watermarks()
        for values in filter(None, (self.registered, self.registered_keys)):  # the registry, before anything is read
            values.refresh()

    # --- the backlog ------------------------------------------------------------------------------
    def plan(self) -> ChunkPlan:
        """The backlog's chunk plan, captured once per runner: from each partition's earliest offset to its end
        offset now."""
        if self._plan is None and self.continue_from is not None:
            self._plan = ChunkPlan.from_json(self.continue_from).continued(self.watermarks(), self.first)
        if self._plan is None:
            marks = self.watermarks()
            self._plan = ChunkPlan(
                self.topic,
                {p: lo for p, (lo, _) in marks.items()},
                {p: hi for p, (_, hi) in marks.items()},
                self.spec.backlog_chunk_records,
            )
        return self._plan

    def head_version(self) -> int:
        """The plan's last chunk; an increment's plan with no new offset has none (the base's last chunk)."""
        plan = self.plan()
        if self.continue_from is not None and plan.empty:
            return plan.first - 1
        return plan.last

    def position_of(self, end_version: int) -> str:
        """What the manifest records for a backlog over chunks first..end_version: the plan cut there."""
        plan = self.plan()
        _, until = plan.offsets(plan.first, end_version)
        return plan.cut(until).to_json()

    def schema(self) -> T.StructType:
        """The records' schema: the declared value schema (Avro or Protobuf values: else the subject's newest schema's
        fields)."""
        if self.registered is not None:
            values = self.registered.schema()
            if self.registered_keys is None:
                return values
            keys = self.registered_keys.schema()
            return T.StructType([*values.fields, *[f for f in keys.fields if f.name not in values.fieldNames()]])
        try:
            schema = T._parse_datatype_string(self.spec.value_schema or "")  # (JSON values: required)
        except Exception as exc:  # noqa: BLE001 - Spark's parser names the problem
            raise SourceError(
                f"{self.spec.location}: value_schema {self.spec.value_schema!r} is not valid: {exc}"
            ) from exc
        if isinstance(schema, T.StructType):
            return schema
        raise SourceError(f"{self.spec.location}: value_schema must be a list of fields, got {schema.simpleString()}")

    def require_change_feed(self, end_version: int) -> None:
        """Fails with SourceError when retention deleted offsets the backlog's plan needs."""
        plan = self.plan()
        self._require_available(plan.start, "the backlog")

    def require_kept_from(self, position: str, who: str, way_out: str) -> None:
        """Fails with SourceError unless the topic still holds every offset from the start of the chunk plan
        ``position`` (a handoff's): a new backlog from the topic's start then reads what that handoff's did."""
        self._require_available(ChunkPlan.from_json(position).origin, who, way_out)

    def _require_available(self, needed: dict[int, int], who: str, way_out: str | None = None) -> None:
        marks = self.watermarks()
        for p, offset in sorted(needed.items()):
            if offset < 0 or p not in marks:
                continue
            earliest = marks[p][0]
            if earliest > offset:
                raise SourceError(
                    f"{self.spec.location}: {who} needs partition {p} from offset {offset}, but the broker keeps "
                    f"it only from offset {earliest}: offsets {offset}..{earliest - 1} were deleted by retention "
                    "(retention.ms / retention.bytes) before they were read. Nothing is skipped silently: to proceed, "
                    + (
                        way_out
                        or "run the backlog again from the topic's start (BacklogRunner(...).run(reset=True)), or "
                        "restore the missing records"
                    )
                )

    def commit_times(self):
        raise SourceError(
            f"{self.spec.location}: a Kafka source has no commit times; daily slices and increments by source time "
            "need a Delta source"
        )

    def missing_file_error(self, exc: BaseException, versions: tuple[int, int]) -> SourceError | None:
        """A SourceError naming the partition and range when ``exc`` says offsets were lost (retention)."""
        text = str(exc)
        if "OffsetOutOfRange" not in text and "data loss" not in text.lower() and "offsets" not in text.lower():
            return None
        plan = self.plan()
        try:
            self._require_available(plan.offsets(*versions)[0], f"the backlog (chunks {versions[0]}..{versions[1]})")
        except SourceError as error:
            return error
        return None

    def read_backlog(self, end_version: int, start_version: int = 0) -> DataFrame:
        """The records of chunks start_version..end_version of the plan, decoded, each with its chunk as
        ``_commit_version``."""
        plan = self.plan()
        lo, hi = max(start_version, plan.first), end_version
        starting, ending = plan.offsets(lo, hi)
        for values in filter(None, (self.registered, self.registered_keys)):  # after the plan: each record's schema
            values.refresh()  # is registered
        reader = self._reader(self.spark.read)
        if "minPartitions" not in self.spec.options:
            # One Spark task per Kafka partition by default: a 3-partition topic on 2 cores ran its fetch and JSON
            # decoding in two waves (the second one core idle), and a partition's task alone on a core. Splitting
            # the offset ranges into as many tasks as the session's parallelism keeps every core busy.
            reader = reader.option("minPartitions", str(self.spark.sparkContext.defaultParallelism))
        raw = (
            reader.option("startingOffsets", offsets_json(self.topic, starting))
            .option("endingOffsets", offsets_json(self.topic, ending))
            .load()
        )
        start = F.create_map(*[x for p, o in sorted(plan.start.items()) for x in (F.lit(p), F.lit(o))])
        chunk = F.lit(plan.first) + F.floor((F.col(OFFSET) - start[F.col(PARTITION)]) / F.lit(plan.size))
        # The backlog makes several passes (statistics, quarantine, operator): fetching and decoding the topic
        # once, into Spark's disk cache, spares the broker and the JSON parser the others. release() drops it. The
        # cache leaves out the columns that are the same on every row (added back after it).
        decoded = self.decode(raw).withColumn("_commit_version", chunk.cast("long"))
        constant = {"_change_type": F.lit("insert"), TOPIC: F.lit(self.topic)}
        cached = decoded.drop(*constant).persist(StorageLevel.DISK_ONLY)
        self._cached.append(cached)
        return cached.select(*[constant[c].alias(c) if c in constant else F.col(c) for c in decoded.columns])

    def release(self) -> None:
        """Drops what :meth:`read_backlog` cached."""
        for df in self._cached:
            df.unpersist()
        self._cached.clear()

    # --- the live phase ---------------------------------------------------------------------------
    def live_start_offsets(self, after: dict[int, int] | None = None) -> dict[int, int]:
        """Where the live phase starts: ``after`` (the end offsets of the live micro-batch a new query resumes
        after) or the handoff's end offsets, and partitions the topic gained since from their start; fails when
        retention deleted offsets the live phase still needs."""
        marks = self.watermarks()
        if after is None and self.position is None:
            return {p: EARLIEST for p in marks}
        end = after if after is not None else ChunkPlan.from_json(self.position).end  # pyright: ignore[reportArgumentType]
        self._require_available(end, "the live phase")
        return {p: end.get(p, EARLIEST) for p in marks}

    def read_live(
        self,
        after_version: int | None,
        max_files_per_trigger: int | None = None,
        *,
        start_offsets: dict[int, int] | None = None,
    ) -> DataFrame:
        """The decoded stream from :meth:`live_start_offsets` (``max_files_per_trigger``: at most that many
        offsets per micro-batch). The chunk number is given per micro-batch
        (:mod:`phases._internal.live.micro_batch`)."""
        reader = self._reader(self.spark.readStream).option(
            "startingOffsets", offsets_json(self.topic, self.live_start_offsets(start_offsets))
        )
        if max_files_per_trigger is not None:
            reader = reader.option("maxOffsetsPerTrigger", max_files_per_trigger)
        # Avro or Protobuf values: decoded by the subject's versions as the live runner read them before it started
        # the query (schema()); a record of a newer version restarts it (check_batch).
        return self.decode(reader.load())

    def check_batch(self, rows: DataFrame) -> None:
        """A live micro-batch's decoded rows: Avro or Protobuf values of a version registered after the query started
        stop it (:class:`phases._internal.errors.NewSchemaVersion`), to start again with that version."""
        for values in filter(None, (self.registered, self.registered_keys)):
            values.newer_schema(rows, DECODE_ERROR)

    def table_id(self) -> str:
        """How Spark's offset log names this source: by its topic."""
        return self.topic

    # --- decoding ---------------------------------------------------------------------------------
    def _reader(self, reader):
        reader = (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", self.brokers)
            .option("subscribe", self.topic)
            # Lost offsets fail the read, loudly (Spark's default, stated here on purpose).
            .option("failOnDataLoss", "true")
        )
        if "kafka.max.poll.records" not in self.spec.options:
            reader = reader.option("kafka.max.poll.records", str(MAX_POLL_RECORDS))
        for key, value in self.spec.options.items():
            reader = reader.option(key, value)
        return reader

    def decode(self, raw: DataFrame) -> DataFrame:
        """Kafka rows -> the record's fields, plus the change columns the engine expects and the record's position;
        an undecodable record keeps its reason and bytes (:mod:`phases._internal.sources.kafka_records`)."""
        if self.registered is not None:
            return kafka_records.decode_registered(raw, self.registered, self.registered_keys)
        return kafka_records.decode_json(raw, self.spec, self.schema())


def client_conf(spec: KafkaSource, brokers: str) -> dict:
    """The confluent-kafka settings for ``spec``'s topic at ``brokers`` (no consumer group is ever committed)."""
    return kafka_client_log.quiet({"bootstrap.servers": brokers, **spec.client_options})


def partition_watermarks(conf: dict, topic: str, timeout: float = 30.0) -> dict[int, tuple[int, int]]:
    """(earliest, end) offset of each partition of ``topic`` (confluent-kafka; no Spark)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({**conf, "group.id": "phases-probe", "enable.auto.commit": False})
    try:
        try:
            metadata = kafka_client_log.list_topics(consumer, conf, topic, timeout)
        except KafkaException as exc:
            raise _unanswered(topic, conf, timeout, exc) from exc
        info = metadata.topics.get(topic)
        if info is not None and info.error is not None and info.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            principal = f"User:{conf.get('sasl.username') or '<name>'}"
            raise SourceError(
                f"kafka topic {topic!r} at {conf['bootstrap.servers']}: {_user(conf)} is not authorized to describe "
                f"or read it ({info.error.str()}). Grant it Describe and Read on the topic (kafka-acls.sh --add "
                f"--allow-principal {principal} --operation Describe --operation Read --topic {topic}), or set "
                "credentials that have them in source.client_options and source.options, then run again"
            )
        if info is None or info.error is not None or not info.partitions:
            raise SourceError(
                f"kafka topic {topic!r} does not exist at {conf['bootstrap.servers']}"
                + (f" ({info.error})" if info is not None and info.error is not None else "")
                + "; create it first (the framework never creates topics)"
            )
        out = {}
        for p in sorted(info.partitions):
            try:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
            except KafkaException as exc:
                raise _unanswered(topic, conf, timeout, exc) from exc
            out[p] = (int(lo), int(hi))
        return out
    finally:
        consumer.close()


def _user(conf: dict) -> str:
    user = conf.get("sasl.username")
    return f"user {user!r}" if user else "the client's principal"


def _unanswered(topic: str, conf: dict, timeout: float, exc: Exception) -> SourceError:
    refused = kafka_client_log.refusal(conf)
    if refused is not None:
        return SourceError(
            f"kafka topic {topic!r}: the brokers at {conf['bootstrap.servers']} refused the credentials in "
            f"source.client_options ({refused}). Nothing was read. Set the right sasl.username and sasl.password (or "
            "the security settings the brokers ask for) in source.client_options, then run again"
        )
    cause = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
    return SourceError(
        f"kafka topic {topic!r}: the brokers at {conf['bootstrap.servers']} (source.bootstrap_servers) did not "
        f"answer within {timeout:g} s (source.connect_timeout): {cause}. Nothing was read. Check that the brokers "
        "run and that source.bootstrap_servers and source.client_options (security, credentials) are right, then "
        "run again"
    )


_REFUSED = re.compile(
    r"org\.apache\.kafka\.common\.errors\.((?:Sasl|Ssl)Authentication|(?:Topic|Group|Cluster)Authorization)Exception"
    r": ([^\n]*)"
)


def raise_if_refused(exc: BaseException, inputs) -> None:
    """Raises a SourceError when a Spark job stopped (``exc``) because the brokers refused Spark's Kafka client (its
    credentials, or a grant its user lacks), naming the Kafka inputs and source.options; else returns. ``inputs``:
    the pipeline's :class:`~phases._internal.definition.pipeline.Inputs`."""
    found = None if isinstance(exc, PhasesError) else _REFUSED.search(str(exc))
    if found is None:
        return
    kind, said = found.groups()
    topics = [
        spec.live.topic if isinstance(spec, HybridSource) else spec.topic
        for spec in (inp.spec for inp in inputs)
        if isinstance(spec, KafkaSource | HybridSource)
    ]
    what = "refused the credentials of" if kind.endswith("Authentication") else "did not authorize"
    raise SourceError(
        f"kafka topic {', '.join(map(repr, topics))}: the brokers {what} Spark's Kafka client ({kind}Exception: "
        f"{said}). Check the security settings in source.options (kafka.security.protocol, kafka.sasl.mechanism, "
        "kafka.sasl.jaas.config: its username and password), and that its user may Describe and Read the topic, then "
        "run again (a live phase resumes from its checkpoint)"
    ) from exc
