"""A redeploy's swap in a result topic: the one topic consumers read gets the definition that now serves, whole, in one
transaction, so that a ``read_committed`` consumer folding it sees exactly one definition's results at every committed
offset, before and after the swap (and after a rollback's swap).

- **Keyed aggregations** (upsert and changelog modes): every key's row of the new result (a changelog's latest row
  per key, with its change columns), and a tombstone for each key of the result before the swap that the new one does
  not have (keys compared as the topic's key bytes: a redeploy that changed the key columns tombstones every old key).
- **A changelog topic and the append kinds** (windows, sessions, process functions, joins) get a **boundary record**
  first, in every partition (header ``phases.boundary``: the generation that now serves; value
  ``{"phases.boundary": {"generation": n, "from_generation": m, "redeploy": id}}``): what came before it in the
  partition is the definition swapped out, what follows is the new definition's whole result, then its changes.
- The write's marker names the new generation's handoff (batch -1): a rerun of a redeploy stopped after its swap's
  Delta commit finds it out and does not publish it again; the new generation's live phase goes on from it.

Until its swap, a generation a redeploy builds or catches up publishes nothing (:func:`phases._internal.topics.sink.
topic_sink` of a placement that does not serve is None): the topic never holds records of a definition that does not
serve.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from phases._internal.placement import Placement
from phases._internal.topics import records
from phases._internal.topics.reading import HEADER_BOUNDARY
from phases._internal.topics.sink import TopicSink
from phases._internal.topics.transactions import HANDOFF_BATCH, Marker, Record

log = logging.getLogger(__name__)


def publish_swap(
    where: Placement,
    before: DataFrame,
    after: DataFrame,
    before_keys: Sequence[str],
    *,
    handoff_id: str,
    from_generation: int,
    redeploy_id: str,
) -> int | None:
    """Publishes the swap from ``before`` (the table consumers read just before the swap's commit, written by a
    definition with key columns ``before_keys``) to ``after`` (that table at the swap's commit) into the placed
    pipeline's result topic (``where``: the generation that now serves), named by its handoff ``handoff_id``. Returns
    the records produced; None when the topic holds that write already."""
    from phases._internal.storage.changelog import BATCH_ID, latest_per_key

    pipeline = where.definition
    topic = TopicSink(where)
    try:
        committed = topic.committed()
        if committed is not None and committed.handoff == handoff_id:
            log.info("%s: the swap to handoff %s is out already: not published again", topic.where, handoff_id)
            return None
        keys = list(pipeline.key_columns)
        header = records.headers(pipeline.name, handoff_id, HANDOFF_BATCH)
        upserts = pipeline.operator.upserts
        changelog = upserts and BATCH_ID in after.columns
        rows = latest_per_key(after, keys) if changelog else after
        produced: list[Iterator[Record]] = []
        if changelog or not upserts:
            boundary = {"generation": where.generation, "from_generation": from_generation, "redeploy": redeploy_id}
            produced.append(
                _boundaries(topic.writer.check_topic(), header, boundary, nulls=topic.registered is not None)
            )
        encoded = records.encoded(rows, keys, registered=topic.registered)
        produced.append(records.records(encoded, header))
        if upserts:
            gone = (
                records.encoded(before, list(before_keys), registered=topic.registered)
                .select(records.KEY)
                .distinct()
                .join(encoded.select(records.KEY), records.KEY, "left_anti")
                .withColumn(records.VALUE, F.lit(None).cast("binary"))
            )
            produced.append(records.records(gone, header))
        count = topic.writer.write(
            (r for part in produced for r in part), Marker(HANDOFF_BATCH, handoff_id), records_before=0
        )
        log.info(
            "%s: the swap from generation %d to %d published (%d records)",
            topic.where,
            from_generation,
            where.generation,
            count,
        )
        return count
    finally:
        topic.close()


def _boundaries(
    partitions: int, header: tuple[tuple[str, bytes], ...], boundary: dict, *, nulls: bool = False
) -> Iterator[Record]:
    """One boundary record a partition; ``nulls`` (an Avro topic): with a null key and value, the header alone says
    what it is (an Avro deserializer reads nulls)."""
    value = None if nulls else json.dumps({HEADER_BOUNDARY: boundary}, sort_keys=True).encode()
    marked = (*header, (HEADER_BOUNDARY, str(boundary["generation"]).encode()))
    for p in range(partitions):
        yield Record(None if nulls else json.dumps({HEADER_BOUNDARY: p}).encode(), value, marked, partition=p)
