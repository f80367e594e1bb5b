"""Exactly-once writes into a Kafka topic: one Kafka transaction a write, and a marker committed inside it.

A result topic is written by one producer at a time, whose ``transactional.id`` is stable for the pipeline and its
generation (:func:`transactional_id`). A writer that starts fences every older producer of the same id (a zombie: a
run that lost its host or its lease and still holds a transaction), and the broker aborts whatever transaction that
producer left open.

Each write (the backlog's results at a handoff, a live micro-batch's changes) goes out in one transaction that also
commits the write's **marker**: the position of a consumer group of the writer's own (:func:`marker_group`) on the
topic's partition 0, whose offset is the write's batch + 2 (the handoff is batch -1, so its marker is offset 1) and
whose metadata names the batch and the handoff (:class:`Marker`). Records and marker commit together or not at
all, so a replay after a crash reads the marker (:meth:`TopicWriter.committed`) and knows whether its write went
out: the idempotence names what was applied (the batch, a position of the run's progress log), never a count.

A consumer with ``isolation.level=read_committed`` (:func:`read_committed`) sees each record of a committed
transaction once and no record of an aborted one. Records are partitioned by their key with Kafka's Java client's
hash (``murmur2_random``), so the records of one key keep their order in one partition, as a Java producer would
place them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from phases._internal.errors import SinkError
from phases._internal.runtime import kafka_client_log
from phases._internal.topics.admin import broker_away, client_settings, coordinator_moving, unanswered

# The marker's offset is the batch + this: the handoff (batch -1) is 1, micro-batch 0 is 2. Offset 0 is never a
# marker, so a group that committed nothing (offset -1001) and a marker are told apart.
MARKER_BASE = 2
HANDOFF_BATCH = -1


def transactional_id(pipeline: str) -> str:
    """The producer id of a pipeline's result topic: stable, so a new writer fences an old one, whichever generation
    serves (named as generation 0's, the one that first wrote the topic)."""
    return f"phases.{pipeline}.g0.sink"


def marker_group(pipeline: str) -> str:
    """The consumer group whose position on the topic's partition 0 is the newest committed write's marker."""
    return f"phases.{pipeline}.g0.sink-marker"


@dataclass(frozen=True)
class Marker:
    """What a committed write applied: ``batch`` (the live micro-batch, or -1 for the handoff's results) and
    ``handoff`` (the handoff manifest the write belongs to); ``records``: how many records the handoff's writes
    published in all, this one included (committed with them, so it is exact)."""

    batch: int
    handoff: str
    records: int | None = None  # the records the handoff's writes published up to this one (None: not counted)

    @property
    def offset(self) -> int:
        return self.batch + MARKER_BASE

    @property
    def metadata(self) -> str:
        data: dict = {"batch": self.batch, "handoff": self.handoff}
        if self.records is not None:
            data["records"] = self.records
        return json.dumps(data, sort_keys=True)

    @staticmethod
    def parse(offset: int, metadata: str | None, where: str) -> Marker:
        try:
            data = json.loads(metadata or "")
            records = data.get("records")
            marker = Marker(int(data["batch"]), str(data["handoff"]), None if records is None else int(records))
        except (ValueError, KeyError, TypeError) as exc:
            raise SinkError(
                f"{where}: the committed marker (offset {offset}, metadata {metadata!r}) is not one this engine "
                f"writes ({exc}); another client committed offsets for the engine's own consumer group. Use another "
                "group for that client; the engine's group is phases.<pipeline>.g0.sink-marker"
            ) from exc
        if marker.offset != offset:
            raise SinkError(
                f"{where}: the committed marker says batch {marker.batch} but sits at offset {offset} "
                f"(expected {marker.offset}); another client moved the engine's consumer group"
            )
        return marker


@dataclass(frozen=True)
class Record:
    """One record of a write: key and value bytes (a None value is a tombstone), headers, and its partition (-1: by
    its key)."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int = -1


@dataclass(frozen=True)
class TopicRecord:
    """A record read back from the topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes] = field(default_factory=dict)


def marker_reader(config: dict, group: str):
    """A read_committed consumer of the marker group ``group`` (it never joins the group: it only reads its
    committed offsets, and a writer commits them through its transactions)."""
    from confluent_kafka import Consumer

    return Consumer({**config, "group.id": group, "enable.auto.commit": False, "isolation.level": "read_committed"})


class TopicWriter:
    """The transactional producer of a pipeline's result topic.

    ``servers``: the brokers; ``topic``: the result topic (it must exist: :meth:`check_topic`); ``pipeline``
    names the transactional id and the marker group; ``client_config``: more librdkafka settings
    (security, timeouts). The first call that needs the producer starts it (``init_transactions``), fencing any older
    producer of the same id.
    """

    def __init__(
        self,
        servers: str,
        topic: str,
        pipeline: str,
        *,
        client_config: dict[str, str] | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 30.0,
    ):
        self.servers, self.topic, self.timeout_s = servers, topic, timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.transactional_id = transactional_id(pipeline)
        self.group = marker_group(pipeline)
        self.prefix = f"phases.{pipeline}."
        self._config = client_settings(servers, client_config)
        self._producer = None
        self._consumer = None
        self._admin = None
        self._partitions: int | None = None
        self._brokers_were_away = False

    @property
    def where(self) -> str:
        return f"topic {self.topic!r} on {self.servers} (transactional id {self.transactional_id!r})"

    def _start(self):
        """The producer, started once: ``init_transactions`` fences an older producer of this id and has the
        broker abort the transaction it left open (so :meth:`committed` then reads a settled marker)."""
        if self._producer is None:
            from confluent_kafka import KafkaError, KafkaException, Producer

            producer = Producer(
                {
                    **self._config,
                    "transactional.id": self.transactional_id,
                    "partitioner": "murmur2_random",  # the Java client's: a key lands where a Java producer puts it
                    "linger.ms": 5,
                    # No delivery report per record (a Python call each: ~2 s a million). A record that fails delivery
                    # makes the transaction's commit fail (librdkafka: an abortable error), and the write aborts.
                    "delivery.report.only.error": True,
                }
            )
            try:
                producer.init_transactions(self.timeout_s)
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                    raise self._not_authorized(
                        f"transactional id {self.transactional_id!r}",
                        exc.args[0],
                        "Describe and Write on the transactional id",
                        f"--transactional-id {self.transactional_id}",
                    ) from exc
                raise SinkError(
                    f"{self.where}: the transactional producer could not start ({exc.args[0]}). Check that the "
                    f"brokers {self.servers} are up and allow transactions (transaction.state.log.replication.factor "
                    "no greater than the number of brokers)"
                ) from exc
            self._producer = producer
        return self._producer

    def _not_authorized(self, what: str, error, grant: str, option: str) -> SinkError:
        user = self._config.get("sasl.username")
        who = f"user {user!r}" if user else "the client's principal"
        return SinkError(
            f"{self.where}: {who} is not authorized to use the {what} ({error.str()}). Nothing was written. Grant it "
            f"{grant} (kafka-acls.sh --add --allow-principal User:{user or '<name>'} ... {option}; the engine's "
            f"transactional ids and groups all begin with {self.prefix!r}: a prefixed grant covers every "
            "generation), or set credentials that have them in sink.client_options, then run again"
        )

    def _marker_consumer(self):
        if self._consumer is None:
            self._consumer = marker_reader(self._config, self.group)
        return self._consumer

    def check_topic(self) -> int:
        """The topic's partition count; a SinkError naming the topic when it does not exist."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            metadata = kafka_client_log.list_topics(
                self._marker_consumer(), self._config, self.topic, self.connect_timeout_s
            )
        except KafkaException as exc:
            raise unanswered(self.where, self.servers, self.connect_timeout_s, exc, self._config) from exc
        found = metadata.topics.get(self.topic)
        if (
            found is not None
            and found.error is not None
            and found.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        ):
            raise self._not_authorized(
                f"topic {self.topic!r}", found.error, "Describe, Read and Write on the topic", f"--topic {self.topic}"
            )
        if found is None or found.error is not None or not found.partitions:
            raise SinkError(
                f"{self.where}: the topic does not exist on {self.servers}"
                + (f" ({found.error})" if found is not None and found.error is not None else "")
                + ". Create it first (a compacted topic for an upsert sink: cleanup.policy=compact)"
            )
        return len(found.partitions)

    def committed(self) -> Marker | None:
        """The marker of the newest committed write (None: nothing committed yet). Starts the producer first, so
        that a transaction a crashed writer left open is aborted and its marker never counts."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        self._start()
        # A coordinator that is moving or still loading its offsets (a broker just started or restarted) answers
        # NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS: retriable, so asked again until timeout_s has passed.
        deadline = time.monotonic() + self.timeout_s
        while True:
            error = None
            try:
                [tp] = self._marker_consumer().committed(
                    [TopicPartition(self.topic, 0)], timeout=max(1.0, deadline - time.monotonic())
                )
                error = tp.error
            except KafkaException as exc:
                error = exc.args[0]
            if error is None:
                return None if tp.offset < 0 else Marker.parse(tp.offset, tp.metadata, self.where)
            if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise self._not_authorized(
                    f"consumer group {self.group!r} (where its markers are committed)",
                    error,
                    "Describe and Read on the group",
                    f"--group {self.group}",
                )
            if not coordinator_moving(error) or time.monotonic() >= deadline:
                raise SinkError(f"{self.where}: its committed marker could not be read ({error})")
            time.sleep(0.5)

    def write(
        self,
        records: Iterable[Record],
        marker: Marker,
        *,
        empty_commits: bool = True,
        records_before: int | None = None,
    ) -> int:
        """Produces ``records`` and commits them with ``marker`` in one transaction; returns the count. With
        ``records_before`` (what the handoff's earlier writes published), the marker committed counts this write's
        records too (:attr:`Marker.records`). An error
        aborts the transaction (nothing of it is ever read committed) and raises SinkError; a newer writer of the
        same id (this one is a zombie) raises SinkError saying so, and this writer can no longer write. Without
        records and ``empty_commits`` False, nothing is committed (the marker stays where it is) and 0 returned."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        records = iter(records)
        first = next(records, None)
        if first is None and not empty_commits:
            return 0
        records = itertools.chain([first] if first is not None else [], records)
        producer = self._start()
        before = self._end_offsets(committed=False, marker=marker)
        if self._brokers_were_away:  # they answer again: fresh clients, not ones that lost their coordinator
            self._restart_clients()
            producer = self._start()
        try:
            producer.begin_transaction()
            count = 0
            for record in records:
                while True:
                    try:
                        producer.produce(
                            self.topic, record.value, record.key, record.partition, headers=list(record.headers)
                        )
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.05)
                count += 1
                if count % 10_000 == 0:
                    producer.poll(0)
            producer.flush(self.timeout_s)
            committed = (
                marker if records_before is None else dataclasses.replace(marker, records=records_before + count)
            )
            offsets = [TopicPartition(self.topic, 0, committed.offset, committed.metadata)]
            group = self._marker_consumer().consumer_group_metadata()
            self._bounded(
                "the marker's offsets",
                marker,
                lambda: producer.send_offsets_to_transaction(offsets, group, self.timeout_s),
            )
            self._bounded("the commit", marker, lambda: producer.commit_transaction(self.timeout_s))
        except SinkError:
            raise  # a call that did not return (_bounded): the producer is dropped, not aborted (it holds the lock)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
                self._producer = None
                raise SinkError(
                    f"{self.where}: this writer was fenced before its write of batch {marker.batch} committed: a "
                    "newer writer of this pipeline started, or the broker ended this writer's session "
                    "(it restarted while the write was open). Nothing of that write will be read. When no other run "
                    "of this pipeline runs, start the live phase again (a backlog: run it again): it "
                    "resumes from its checkpoint and publishes nothing twice"
                ) from exc
            self._abort(producer)
            raise SinkError(
                f"{self.where}: the write of batch {marker.batch} was aborted ({error}); nothing of it will be read. "
                f"Once the brokers (sink.bootstrap_servers {self.servers}) answer, run it again: a live phase "
                "resumes from its checkpoint, a backlog publishes at its rerun, neither publishes anything twice"
            ) from exc
        except BaseException:
            self._abort(producer)
            raise
        self._await_stable(before, marker)
        return count

    def _end_offsets(self, *, committed: bool, marker: Marker) -> dict[int, int]:
        """Each partition's end offset: the high watermark, or with ``committed`` the last stable offset (where a
        read_committed consumer stops: before the first transaction still open)."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import AdminClient, OffsetSpec

        if self._admin is None:
            self._admin = AdminClient(self._config)
        if self._partitions is None:
            self._partitions = self.check_topic()
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        query = {TopicPartition(self.topic, p): OffsetSpec.latest() for p in range(self._partitions)}
        # A broker that does not answer (restarting, a partition without its leader for a moment) is asked again
        # until the sink's transaction_timeout has passed: a short outage delays the micro-batch, not the phase.
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                answers = self._admin.list_offsets(query, isolation_level=level, request_timeout=self.timeout_s)  # pyright: ignore[reportArgumentType]
                return {tp.partition: future.result().offset for tp, future in answers.items()}
            except KafkaException as exc:
                if time.monotonic() < deadline and broker_away(exc.args[0]):
                    time.sleep(1.0)
                    self._admin = AdminClient(self._config)  # fresh metadata: a restarted broker's leader epochs
                    self._brokers_were_away = True
                    continue
                raise SinkError(
                    f"{self.where}: the end offsets around batch {marker.batch}'s write could not be read within "
                    f"sink.transaction_timeout ({self.timeout_s:.0f} s): {exc.args[0]}. Nothing of the write was "
                    f"committed. Once the brokers (sink.bootstrap_servers {self.servers}) answer, start the live "
                    "phase again: it resumes from its checkpoint and publishes nothing twice"
                ) from exc

    def _await_stable(self, before: dict[int, int], marker: Marker) -> None:
        """Returns once a read_committed consumer sees the write just committed: the broker answers a commit before
        its markers reach the partitions, and until then their last stable offsets stay before the write. The
        partitions the write reached are those whose high watermark moved since ``before``; each is stable once its
        last stable offset reaches the high watermark as of the commit. A read of the end offsets that fails (a
        broker slow to answer) is tried again until the deadline. A SinkError (the write is committed: a replay of
        it is skipped) when that takes over ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        pending: dict[int, int] | None = None  # partition -> high watermark as of the commit (None: not read yet)
        failure: SinkError | None = None
        while True:
            try:
                if pending is None:
                    ends = self._end_offsets(committed=False, marker=marker)
                    pending = {p: end for p, end in ends.items() if end > before.get(p, 0)}
                if pending:
                    stable = self._end_offsets(committed=True, marker=marker)
                    pending = {p: end for p, end in pending.items() if stable[p] < end}
                if not pending:
                    return
                failure = None
            except SinkError as exc:
                failure = exc
            if time.monotonic() > deadline:
                where = (
                    f"partitions {sorted(pending)} stay before it"
                    if failure is None and pending is not None
                    else f"the last read of its end offsets failed: {failure}"
                )
                raise SinkError(
                    f"{self.where}: batch {marker.batch} committed, but read_committed consumers did not see it within "
                    f"{self.timeout_s:g} s ({where}: is another transactional producer writing this topic and holding "
                    "a transaction open, or the broker slow to answer?)"
                ) from failure
            time.sleep(0.002)

    def _bounded(self, what: str, marker: Marker, call) -> None:
        """Runs a transactional call of the client and waits for it at most ``timeout_s`` (and a little): librdkafka
        can block in ``send_offsets_to_transaction`` past its own timeout when the group coordinator went away and
        came back (a broker restarted: confluentinc/librdkafka#5456, #5511). Then the producer is dropped without an
        abort (the stuck call holds its lock) and a SinkError says so; the next writer's ``init_transactions``
        fences it, and the broker aborts its open transaction."""
        box: dict[str, BaseException] = {}

        def run() -> None:
            try:
                call()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc

        worker = threading.Thread(target=run, name=f"phases-topic-{self.topic}", daemon=True)
        worker.start()
        worker.join(self.timeout_s + 5.0)
        if worker.is_alive():
            self._producer = None
            raise SinkError(
                f"{self.where}: {what} of batch {marker.batch}'s write did not complete within "
                f"sink.transaction_timeout ({self.timeout_s:.0f} s): the brokers (sink.bootstrap_servers "
                f"{self.servers}) did not answer, or the client lost its group coordinator when a broker restarted. "
                "Nothing of the write was committed (the broker aborts it). Once the brokers answer, start the live "
                "phase again (a backlog: run it again): it resumes from its checkpoint and publishes nothing twice"
            )
        if "error" in box:
            raise box["error"]

    def _abort(self, producer) -> None:
        """Aborts the open transaction, and drops the producer: after a failed write its state may need a new epoch
        (a record the broker refused leaves its sequence numbers out of order), which the next write's new producer
        gets from ``init_transactions`` (fencing this one)."""
        from confluent_kafka import KafkaException

        with contextlib.suppress(KafkaException):
            producer.abort_transaction(self.timeout_s)
        self._producer = None

    def write_once(self, records: Iterable[Record], marker: Marker, *, empty_commits: bool = True) -> int | None:
        """:meth:`write`, unless the committed marker is this write's or a later one's (a replay): then nothing is
        produced and None is returned. A committed marker of another handoff at the same or a later batch is a
        SinkError: the topic holds results this run did not make."""
        committed = self.committed()
        if committed is not None and committed.batch >= marker.batch:
            if committed.handoff != marker.handoff and committed.batch == marker.batch:
                raise SinkError(
                    f"{self.where}: batch {marker.batch} of handoff {marker.handoff} is to be written, but the topic "
                    f"holds batch {committed.batch} of handoff {committed.handoff}. Another handoff wrote this "
                    "generation's topic: a new backlog needs a new generation's topic (a redeploy) or an emptied one"
                )
            return None
        return self.write(records, marker, empty_commits=empty_commits)

    def _restart_clients(self) -> None:
        """Drops the producer and the marker consumer after the brokers did not answer for a while (restarted): a
        client that lived through a broker's restart may never find its group coordinator again, and its
        ``send_offsets_to_transaction`` then blocks (confluentinc/librdkafka#5456, #5511). No transaction is open
        here; the next :meth:`_start`'s ``init_transactions`` fences the old producer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._producer = None
        self._brokers_were_away = False

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
        self._admin = None
