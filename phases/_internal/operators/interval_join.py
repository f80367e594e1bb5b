"""The interval join (``interval_join``) of the pipeline's source with a second source (Delta or Kafka): every pair of
on-time records with equal keys and ``left.ts + lower <= right.ts <= left.ts + upper``. State: per key, each
input's rows that a future row of the other input can still match: live, in the run's state store, looked up by
key (not a scan of every key's rows)."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from phases._internal.definition import RIGHT_LABEL, SOURCE_LABEL, IntervalJoin
from phases._internal.operators.aggregation import MAX_TS
from phases._internal.operators.base import StoreStep
from phases._internal.operators.join_logic import LEFT, LEFT_ROWS, RIGHT, RIGHT_ROWS, IntervalJoinLogic
from phases._internal.operators.two_input import TwoInputKind
from phases._internal.state.keyed_store import LiveStateStore, RowLayout


class IntervalJoinStoreStep(StoreStep):
    """Interval join: the batch's new rows of each input joined with the other input's rows held for their keys
    (looked up in the run's state store: one row per key, each input's rows that can still match) and with each
    other; the pairs appended to the sink first (marked with the batch id), then the keys' held rows
    replaced, leaving out rows no future row of the other input can match (its watermark passed ``ts + upper``, or
    ``ts - lower``), committed as the store's next version.

    Replays: the rows are looked up at the version the previous progress record names, so a replayed micro-batch
    appends the same pairs (an append already committed is skipped) and writes the same next version. Rows of keys
    without new rows stay until their key gets one: they can match nothing, they only take room."""

    logic: IntervalJoinLogic
    VALUES = (LEFT_ROWS, RIGHT_ROWS, MAX_TS)

    @classmethod
    def open_store(cls, spark: SparkSession, logic: IntervalJoinLogic, store_root: str) -> LiveStateStore:
        values = list(cls.VALUES)
        return LiveStateStore(spark, store_root, RowLayout(tuple(logic.keys), tuple(values)), logic.state_schema)

    @staticmethod
    def start_rows(state: DataFrame) -> DataFrame:
        return state

    def _pairs(self, left: DataFrame, right: DataFrame) -> DataFrame:
        return self.logic.pairs(left, right)

    def has_work(self, records, closing_us) -> bool:
        return any(df is not None for df in records.values())  # held rows go only when their key gets new ones

    def advance(self, spark, store, version, records, watermarks, closing_us, writes) -> int:
        logic, keys, et = self.logic, self.logic.keys, self.logic.event_time
        new_left, new_right = records[SOURCE_LABEL], records[RIGHT_LABEL]
        left_cols = [f.name for f in logic.fields(LEFT)]
        right_cols = [f.name for f in logic.fields(RIGHT)]
        new_left = None if new_left is None else new_left.select(*left_cols).persist()
        new_right = None if new_right is None else new_right.select(*right_cols).persist()
        found = None
        try:
            news = [df.select(*keys) for df in (new_left, new_right) if df is not None]
            touched = news[0] if len(news) == 1 else news[0].unionByName(news[1])
            found = store.store.lookup(touched, version, None)  # pyright: ignore[reportAttributeAccessIssue]
            held = found.rows
            pairs = []
            if new_left is not None:
                old_right = held.select(F.explode(RIGHT_ROWS).alias("_r")).select("_r.*")
                pairs.append(self._pairs(new_left, old_right))
            if new_right is not None:
                old_left = held.select(F.explode(LEFT_ROWS).alias("_r")).select("_r.*")
                pairs.append(self._pairs(old_left, new_right))
            if new_left is not None and new_right is not None:
                pairs.append(self._pairs(new_left, new_right))
            out = pairs[0]
            for more in pairs[1:]:
                out = out.unionByName(more)
            out = out.persist()
            try:
                if not out.isEmpty():
                    writes.append_owned(out, self.sink_path, "sink")
            finally:
                out.unpersist()
            lifted = []
            if new_left is not None:
                lifted.append(
                    new_left.select(
                        *keys,
                        F.array(logic.rows_struct(LEFT)).alias(LEFT_ROWS),
                        logic.empty_rows(RIGHT).alias(RIGHT_ROWS),
                        F.col(et).alias(MAX_TS),
                    )
                )
            if new_right is not None:
                lifted.append(
                    new_right.select(
                        *keys,
                        logic.empty_rows(LEFT).alias(LEFT_ROWS),
                        F.array(logic.rows_struct(RIGHT)).alias(RIGHT_ROWS),
                        F.col(et).alias(MAX_TS),
                    )
                )
            # The keys' held rows and the batch's, each key's rows kept while the other input can still match them.
            held_rows = held.select(*keys, LEFT_ROWS, RIGHT_ROWS, MAX_TS)
            rows = reduce(DataFrame.unionByName, [held_rows, *lifted])
            keep_left, keep_right = self._keep(watermarks)
            replaced = rows.groupBy(*keys).agg(
                F.expr(f"filter(flatten(collect_list({LEFT_ROWS})), {keep_left})").alias(LEFT_ROWS),
                F.expr(f"filter(flatten(collect_list({RIGHT_ROWS})), {keep_right})").alias(RIGHT_ROWS),
                F.max(MAX_TS).alias(MAX_TS),
            )
            store.store.replace(replaced, version).release()  # pyright: ignore[reportAttributeAccessIssue]
        finally:
            if found is not None:
                found.release()
            for df in (new_left, new_right):
                if df is not None:
                    df.unpersist()
        return version + 1

    def settled(self, rows: DataFrame, watermarks: dict[str, int | None]) -> DataFrame:
        """A micro-batch drops the rows no future row can match only for the keys it touches; the backlog drops them
        for every key (and keys left with none), and gives a key the greatest event time of the rows it keeps."""
        keep_left, keep_right = self._keep(watermarks)
        et = self.logic.event_time
        kept = rows.select(
            *self.logic.keys,
            F.expr(f"filter({LEFT_ROWS}, {keep_left})").alias(LEFT_ROWS),
            F.expr(f"filter({RIGHT_ROWS}, {keep_right})").alias(RIGHT_ROWS),
        )
        latest = F.expr(
            f"array_max(concat(transform({LEFT_ROWS}, x -> x.`{et}`), transform({RIGHT_ROWS}, x -> x.`{et}`)))"
        )
        return kept.filter(F.size(LEFT_ROWS) + F.size(RIGHT_ROWS) > 0).withColumn(MAX_TS, latest)

    def _keep(self, watermarks: dict[str, int | None]) -> tuple[str, str]:
        """SQL lambdas: a left row is kept while a future right row (ts > the right watermark) can match it
        (``ts + upper > right_wm``); a right row while a future left row can (``ts - lower > left_wm``)."""
        logic, et = self.logic, self.logic.event_time
        left_wm, right_wm = watermarks[SOURCE_LABEL], watermarks[RIGHT_LABEL]
        keep_left = "x -> true"
        if right_wm is not None:
            keep_left = f"x -> x.`{et}` > timestamp_micros({right_wm - logic.upper_ms * 1000})"
        keep_right = "x -> true"
        if left_wm is not None:
            keep_right = f"x -> x.`{et}` > timestamp_micros({left_wm + logic.lower_ms * 1000})"
        return keep_left, keep_right


class IntervalJoinKind(TwoInputKind):
    spec = IntervalJoin
    state_event_time = MAX_TS
    logic_class = IntervalJoinLogic
    step_class = IntervalJoinStoreStep
