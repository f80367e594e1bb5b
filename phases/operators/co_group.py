"""The windowed co-group (``co_group``) of the pipeline's source with a second Delta source: every (key,
window) whose end both inputs' watermarks passed, with all its on-time records of both, passed to the
user's function once."""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from phases.definition import RIGHT_LABEL, SOURCE_LABEL, WINDOW_END, CoGroup
from phases.operators.join_logic import LEFT, LEFT_ROWS, RIGHT, RIGHT_ROWS, CoGroupLogic
from phases.operators.two_input import TwoInputKind
from phases.storage import tables


class CoGroupStep:
    """Co-group: the batch's rows of both inputs collected into their (key, window) in the state (one
    MERGE); the windows both watermarks closed passed to the user's function, its rows appended to the sink
    once, then those windows removed from the state. Read back from the state after its write, so a replayed
    batch emits exactly what the first attempt would have."""

    def __init__(self, logic: CoGroupLogic, state_path: str, sink_path: str):
        self.logic, self.state_path, self.sink_path = logic, state_path, sink_path

    def apply_inputs(self, spark, records, watermarks, closing_us, batch, app, state=None) -> None:
        logic = self.logic
        lifted = [
            logic.lift(df, side)
            for df, side in ((records[SOURCE_LABEL], LEFT), (records[RIGHT_LABEL], RIGHT))
            if df is not None
        ]
        if lifted:
            rows = lifted[0] if len(lifted) == 1 else lifted[0].unionByName(lifted[1])
            windows = rows.groupBy(*logic.group).agg(*logic.merge_columns())
            with tables.idempotent_dml(spark, app("state"), batch):
                (
                    DeltaTable.forPath(spark, self.state_path)
                    .alias("t")
                    .merge(windows.alias("s"), tables.key_match("t", "s", logic.group))
                    .whenMatchedUpdate(set={c: f"concat(t.{c}, s.{c})" for c in (LEFT_ROWS, RIGHT_ROWS)})
                    .whenNotMatchedInsertAll()
                    .execute()
                )
        if closing_us is None:
            return
        closed = F.col(WINDOW_END) <= F.timestamp_micros(F.lit(closing_us))
        state = spark.read.format("delta").load(self.state_path)
        windows = state.filter(closed).persist()
        try:
            if windows.isEmpty():
                return
            out = logic.apply(windows)
            tables.append_once(out, self.sink_path, app("sink"), batch)
            with tables.idempotent_dml(spark, app("closed"), batch):
                DeltaTable.forPath(spark, self.state_path).delete(closed)
        finally:
            windows.unpersist()


class CoGroupKind(TwoInputKind):
    spec = CoGroup
    logic_class = CoGroupLogic
    step_class = CoGroupStep
