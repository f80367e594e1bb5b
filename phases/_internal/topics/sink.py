"""A pipeline's result topic (:class:`phases.KafkaSink`): the writes of the handoff and of every live micro-batch,
each once, through the generation's transactional writer (:class:`phases._internal.topics.transactions.TopicWriter`).

The engine keeps the results in its Delta table (``sink.path``) as for a Delta sink, and publishes the same rows:

- **the handoff's results**: the table's rows at the version the handoff manifest names (``sink_version``), as batch
  -1 of that handoff. The backlog publishes them right after it writes the manifest; a live phase that starts from
  the handoff publishes them first if they are not out yet (the backlog stopped between its manifest and its
  publish), so the manifest's id names the write wherever it is made and a rerun never publishes it twice. A
  catch-up increment's handoff (and each increment of a backlog committed in increments) publishes only what
  changed since the handoff it builds on, when that one is the topic's newest write: a consumer folds the same
  results as from one handoff, and in a changelog topic each change is there once;
- **a live micro-batch's changes** (:meth:`TopicSink.publish`), before the micro-batch writes the Delta table and
  its progress record. The query's first micro-batch after a start may be a replay: it reads the marker first and
  skips a write that already committed. A later micro-batch runs after its predecessor's progress record, so
  nothing of it can be out yet.

Every record's Kafka key is the pipeline's key columns, so one key's records keep their order in one partition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from phases._internal.definition import KafkaSink, Pipeline
from phases._internal.errors import DefinitionError, SinkError
from phases._internal.placement import Placement
from phases._internal.topics import records
from phases._internal.topics.record_formats import registered_records
from phases._internal.topics.transactions import HANDOFF_BATCH, Marker, TopicWriter

log = logging.getLogger(__name__)


def topic_sink(where: Placement) -> TopicSink | None:
    """The writes of the placed pipeline into its result topic (the declared one: consumers never move); None for a
    Delta sink, and for a generation that does not serve (one a redeploy builds or catches up, or a generation swapped
    out and being caught up for a rollback): it publishes nothing until its swap publishes its whole result
    (:mod:`phases._internal.topics.swap_publish`), so the topic never holds a definition that does not serve."""
    if not isinstance(where.definition.sink, KafkaSink) or not where.serving:
        return None
    return TopicSink(where)


def check(where: Placement) -> None:
    """A topic sink: a SinkError when its topic does not exist or its brokers do not answer (nothing is written)."""
    topic = topic_sink(where)
    if topic is not None:
        try:
            topic.check()
        finally:
            topic.close()  # (its client logs what it met once it is closed)


def refuse(pipeline: Pipeline, what: str) -> None:
    """A DefinitionError when ``pipeline`` has a topic sink: ``what`` (a way of running) cannot publish its results
    to a topic exactly once yet."""
    if isinstance(pipeline.sink, KafkaSink):
        raise DefinitionError(
            f"pipeline {pipeline.name!r}: {what} is not available with a topic sink (sink.kind 'kafka', topic "
            f"{pipeline.sink.topic!r}): its results could not be published exactly once. Nothing was run. Run a full "
            "backlog (BacklogRunner(spark, pipeline).run()) and the live phase, or use a Delta sink (DeltaSink)"
        )


class TopicSink:
    """The writes of the serving generation into the pipeline's result topic. Every generation that serves writes
    with one transactional id and one marker group, named as generation 0's (the generation that first wrote the
    topic; a pipeline never redeployed writes as it always did): a generation that starts serving fences the writer
    of the one it replaced, and its swap's marker is the newest write's."""

    def __init__(self, where: Placement):
        sink = where.definition.sink
        if not isinstance(sink, KafkaSink):
            raise TypeError(f"pipeline {where.name!r} has no topic sink")
        self.pipeline, self.sink, self.table = where.name, sink, where.sink_path
        self.key_columns = list(where.definition.key_columns)
        self.writer = TopicWriter(
            where.sink_brokers,
            where.topic(),
            where.name,
            client_config=sink.client_options,
            timeout_s=sink.transaction_timeout.total_seconds(),
            connect_timeout_s=sink.connect_timeout.total_seconds(),
        )
        # Avro or Protobuf records: the schemas registered in the sink's registry (None: JSON).
        self.registered = registered_records(sink, where.name)
        self.published = 0  # records produced by this process's writes (for reports)
        # What the current handoff's writes published in all, as the newest marker counts it (None: not read yet).
        self._handoff_records: int | None = None
        # The newest marker as this writer knows it once its start read or wrote one (False: not known): the live
        # start reads it, and the query's first micro-batch then needs no second read (the writer fenced every other).
        self._newest: Marker | None | bool = False

    @property
    def where(self) -> str:
        return self.writer.where

    def check(self) -> None:
        """A SinkError naming the topic when it does not exist, or the registry of an Avro topic when it does not
        answer (before anything is written)."""
        self.writer.check_topic()
        if self.registered is not None:
            self.registered.client.probe()

    def committed(self) -> Marker | None:
        return self.writer.committed()

    def refuse_lost_writes(self, handoff_id: str, recorded_batch: int) -> None:
        """At a live start: a SinkError when the live phase of handoff ``handoff_id`` has recorded a write of
        micro-batch ``recorded_batch`` (>= 0) but the topic's newest write is of no handoff, or of another one: the
        topic was deleted and made again, or its records or the marker's consumer group removed. Publishing on would
        leave its consumers without the results published before. Nothing is written; the way out is
        :func:`phases.republish_topic`."""
        if recorded_batch < 0:
            return
        committed = self._newest = self.writer.committed()
        if committed is not None and committed.handoff == handoff_id:
            return
        holds = "no write of the engine" if committed is None else f"the write of handoff {committed.handoff}"
        raise SinkError(
            f"{self.where}: the live phase of handoff {handoff_id} has published up to micro-batch {recorded_batch}, "
            f"but the topic holds {holds}: it was deleted and made again, or its records or the consumer group "
            f"{self.writer.group!r} (the engine's marker) were removed. Its consumers miss the results published "
            "before, so nothing was written. To give them the whole result again, run "
            "phases.republish_topic(spark, pipeline) while no live phase runs: it publishes the engine's table of "
            f"the results ({self.table}) in one transaction; then start the live phase, which goes on from there"
        )

    def republish(self, spark: SparkSession, table: str, handoff_id: str, batch: int) -> int:
        """Publishes every row of the engine's table of the results (``table`` now) in one transaction whose marker
        is (``batch``, ``handoff_id``): ``batch`` is the newest live micro-batch whose write the table holds (-1:
        none), so the live phase goes on after it. Returns the records produced."""
        rows = spark.read.format("delta").load(table)
        count = self.writer.write(self._records(rows, handoff_id, batch), Marker(batch, handoff_id), records_before=0)
        self._handoff_records, self._newest = count, Marker(batch, handoff_id, count)
        self.published += count
        log.info(
            "%s: the results of handoff %s up to micro-batch %d published again (%d)",
            self.where,
            handoff_id,
            batch,
            count,
        )
        return count

    def publish_handoff(
        self,
        spark: SparkSession,
        handoff_id: str,
        table: str,
        version: int,
        *,
        bases: Callable[[], dict[str, int]] = dict,
    ) -> int | None:
        """Publishes the handoff ``handoff_id``'s results (the table ``table`` at ``version``) as its batch -1, unless
        the topic already holds a write of that handoff; returns the records produced (None: none needed).

        ``bases``: the handoffs this one builds on (a catch-up increment's base, its base, ...) with their table
        versions. When the topic's newest write is of one of them, only what changed since that version goes out
        (the rows that are new or differ). Otherwise (the first handoff, or a backlog run again from the start) every
        row goes out."""
        committed = self._newest = self.writer.committed()
        if committed is not None and committed.handoff == handoff_id:
            self._handoff_records = committed.records
            return None
        rows = spark.read.format("delta").option("versionAsOf", version).load(table)
        since = bases().get(committed.handoff) if committed is not None else None
        if since is not None:
            if committed.batch != HANDOFF_BATCH:
                raise SinkError(
                    f"{self.where}: the handoff {handoff_id} builds on handoff {committed.handoff}, whose live "
                    f"micro-batch {committed.batch} the topic holds: a catch-up increment after a live start. Nothing "
                    "was written. Run the backlog again from the start (reset) to publish a consistent result"
                )
            rows = self._changed_since(spark, table, since, rows)
        produced = self._records(rows, handoff_id, HANDOFF_BATCH)
        count = self.writer.write(produced, Marker(HANDOFF_BATCH, handoff_id), records_before=0)
        self._handoff_records = count
        self._newest = Marker(HANDOFF_BATCH, handoff_id, count)
        log.info("%s: the handoff %s's %d results published", self.where, handoff_id, count)
        self.published += count
        return count

    @staticmethod
    def _changed_since(spark: SparkSession, table: str, since: int, rows: DataFrame) -> DataFrame:
        """The rows of ``rows`` (the table now) that are not in the table at version ``since``, each as often as it is
        new there. A key never leaves a result table between handoffs (an aggregation's key stays; a window or an
        output row, once emitted, stays), so no tombstone is needed."""
        before = spark.read.format("delta").option("versionAsOf", since).load(table).select(*rows.columns)
        return rows.exceptAll(before)

    def publish(
        self, rows: DataFrame, batch: int, handoff_id: str, *, replay_possible: bool, after_handoff: bool = True
    ) -> int | None:
        """Publishes live micro-batch ``batch``'s rows (of the handoff ``handoff_id``, or of one streaming job's
        run when not ``after_handoff``) in one transaction with its marker; ``replay_possible`` (the query's first
        micro-batch after a start): unless its write already committed. Returns the records produced (None: already
        out). A batch with no row commits nothing."""
        marker = Marker(batch, handoff_id)
        produced = self._records(rows, handoff_id, batch)
        if replay_possible:
            committed = self.writer.committed() if self._newest is False else self._newest
            if (committed is None and after_handoff) or (committed is not None and committed.handoff != handoff_id):  # pyright: ignore[reportAttributeAccessIssue]
                raise self._other_handoff(committed, marker)  # pyright: ignore[reportArgumentType]
            self._handoff_records = committed.records if committed is not None else 0  # pyright: ignore[reportAttributeAccessIssue]
            if committed is not None and committed.batch >= batch:  # pyright: ignore[reportAttributeAccessIssue]
                log.info("%s: micro-batch %d is out already (a replay): not published again", self.where, batch)
                return None
        before = self._handoff_records
        count = self.writer.write(produced, marker, empty_commits=False, records_before=before)
        if before is not None:
            self._handoff_records = before + count
        if count:
            self._newest = Marker(batch, handoff_id, self._handoff_records)
        self.published += count
        return count

    def _other_handoff(self, committed: Marker | None, marker: Marker) -> SinkError:
        holds = (
            f"the topic's newest write is of handoff {committed.handoff} (batch {committed.batch})"
            if committed is not None
            else "the topic holds no write of the engine"
        )
        return SinkError(
            f"{self.where}: micro-batch {marker.batch} of handoff {marker.handoff} is to be written, but {holds}: the "
            "results of this handoff never went out, or another run writes this generation's topic. Nothing was "
            "written. Start the live phase again (its start publishes the handoff's results first)"
        )

    def _records(self, rows: DataFrame, handoff_id: str, batch: int):
        return records.records(
            records.encoded(rows, self.key_columns, registered=self.registered),
            records.headers(self.pipeline, handoff_id, batch),
        )

    def close(self) -> None:
        self.writer.close()


def read_topic(
    spark: SparkSession,
    where: Placement,
    *,
    with_change_columns: bool = False,
    timeout_s: float = 60.0,
) -> DataFrame:
    """What a ``read_committed`` consumer of ``pipeline``'s result topic reads, folded as its mode says, with the
    columns and types of the engine's table of the results (the JSON values parsed with its schema: exact
    timestamps, decimals and nulls; Avro values by their schema ids): for a keyed aggregation the current row per key
    (its newest record; a tombstone removes the key), for the other operators every result once.
    ``with_change_columns`` keeps a changelog's ``_batch_id``, ``_source_version`` and ``_op``. For reconciliation and
    tests: it reads the whole topic through the driver."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from phases._internal.topics.reading import after_last_boundary, fold_upsert, read_committed

    pipeline = where.definition
    sink = pipeline.sink
    if not isinstance(sink, KafkaSink):
        raise DefinitionError(f"pipeline {pipeline.name!r} has no topic sink (sink.kind {sink.kind!r})")
    read = read_committed(where.sink_brokers, where.topic(), timeout_s=timeout_s, client_config=sink.client_options)
    read = after_last_boundary(read)  # the serving definition's: its swap's whole result, then its changes
    if pipeline.operator.upserts:
        values = list(fold_upsert(read).values())
    else:
        values = [r.value for r in read if r.value is not None]
    schema = spark.read.format("delta").load(where.sink_path).schema
    registered = registered_records(sink, pipeline.name)
    if registered is not None:
        binary = spark.createDataFrame(pa.table({"value": pa.array(values, pa.binary())}))
        rows = registered.decoded_values(binary, schema)
    else:
        texts = pa.table({"value": pa.array([v.decode() for v in values], pa.string())})
        frame = spark.createDataFrame(texts).select(F.from_json("value", schema, records.JSON_OPTIONS).alias("r"))
        rows = frame.select("r.*")
    if with_change_columns or sink.mode != "changelog" or not pipeline.operator.upserts:
        return rows
    from phases._internal.storage.changelog import BATCH_ID, OP, SOURCE_VERSION

    return rows.drop(BATCH_ID, SOURCE_VERSION, OP)
