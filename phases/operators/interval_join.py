"""The interval join (``interval_join``) of the pipeline's source with a second Delta source: every pair of
on-time records with equal keys and ``left.ts + lower <= right.ts <= left.ts + upper``. State: per key, each
input's rows that a future row of the other input can still match."""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from phases.definition import RIGHT_LABEL, SOURCE_LABEL, IntervalJoin
from phases.operators.aggregation import MAX_TS
from phases.operators.join_logic import LEFT, LEFT_ROWS, RIGHT, RIGHT_ROWS, IntervalJoinLogic
from phases.operators.two_input import TwoInputKind
from phases.storage import tables


class IntervalJoinStep:
    """Interval join: the batch's new rows of each input joined with the other input's rows held in the state
    (one row per key: each input's rows that can still match) and with each other; the pairs appended to the
    sink first, then the new rows merged into their keys' state, leaving out rows no future row of the
    other input can match (its watermark passed ``ts + upper``, or ``ts - lower``).

    A batch replayed after a crash before the state write joins against the same state and appends the same
    pairs (Delta skips the second append); one replayed after it skips both writes. Rows of keys without new
    rows stay until their key gets one: they can match nothing, they only take room."""

    def __init__(self, logic: IntervalJoinLogic, state_path: str, sink_path: str):
        self.logic, self.state_path, self.sink_path = logic, state_path, sink_path

    def _pairs(self, left: DataFrame, right: DataFrame) -> DataFrame:
        return self.logic.pairs(left, right)

    def apply_inputs(self, spark, records, watermarks, closing_us, batch, app, state=None) -> None:
        logic, keys, et = self.logic, self.logic.keys, self.logic.event_time
        new_left, new_right = records[SOURCE_LABEL], records[RIGHT_LABEL]
        if new_left is None and new_right is None:
            return
        left_cols = [f.name for f in logic.fields(LEFT)]
        right_cols = [f.name for f in logic.fields(RIGHT)]
        new_left = None if new_left is None else new_left.select(*left_cols).persist()
        new_right = None if new_right is None else new_right.select(*right_cols).persist()
        try:
            news = [df.select(*keys) for df in (new_left, new_right) if df is not None]
            touched = (news[0] if len(news) == 1 else news[0].unionByName(news[1])).distinct()
            held = spark.read.format("delta").load(self.state_path).join(touched, keys)
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
                    tables.append_once(out, self.sink_path, app("sink"), batch)
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
            rows = lifted[0] if len(lifted) == 1 else lifted[0].unionByName(lifted[1])
            grouped = rows.groupBy(*keys).agg(
                F.flatten(F.collect_list(LEFT_ROWS)).alias(LEFT_ROWS),
                F.flatten(F.collect_list(RIGHT_ROWS)).alias(RIGHT_ROWS),
                F.max(MAX_TS).alias(MAX_TS),
            )
            keep_left, keep_right = self._keep(watermarks)
            with tables.idempotent_dml(spark, app("state"), batch):
                (
                    DeltaTable.forPath(spark, self.state_path)
                    .alias("t")
                    .merge(grouped.alias("s"), tables.key_match("t", "s", keys))
                    .whenMatchedUpdate(
                        set={
                            LEFT_ROWS: f"filter(concat(t.{LEFT_ROWS}, s.{LEFT_ROWS}), {keep_left})",
                            RIGHT_ROWS: f"filter(concat(t.{RIGHT_ROWS}, s.{RIGHT_ROWS}), {keep_right})",
                            MAX_TS: f"greatest(t.{MAX_TS}, s.{MAX_TS})",
                        }
                    )
                    .whenNotMatchedInsert(
                        values={
                            **{k: f"s.`{k}`" for k in keys},
                            LEFT_ROWS: f"filter(s.{LEFT_ROWS}, {keep_left})",
                            RIGHT_ROWS: f"filter(s.{RIGHT_ROWS}, {keep_right})",
                            MAX_TS: f"s.{MAX_TS}",
                        }
                    )
                    .execute()
                )
        finally:
            for df in (new_left, new_right):
                if df is not None:
                    df.unpersist()

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
    step_class = IntervalJoinStep
