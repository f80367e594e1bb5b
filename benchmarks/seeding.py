"""Seeding the live state through ``transformWithState(initialState=...)`` (row API), for the switch-latency
comparison with the framework's switch (which replays nothing: the live phase merges into the handoff's
state table). One sentinel input row forces batch 0, where the initial
state is applied (docs/history.md, observations while building: without input, batch 0 does not run)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

from pyspark.sql import Row, SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

STATE_SCHEMA = "n long, total long"


class SumCount(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("sum_count", STATE_SCHEMA)

    def handleInitialState(self, key, initialState: Row, timerValues) -> None:
        self.state.update((initialState["n"], initialState["total"]))

    def handleInputRows(self, key, rows: Iterator[Row], timerValues) -> Iterator[Row]:
        n, total = self.state.get() if self.state.exists() else (0, 0)
        for row in rows:
            n, total = n + 1, total + (row["value"] or 0)
        self.state.update((n, total))
        yield Row(key=key[0], n=n, total=total)

    def close(self) -> None:
        pass


def seed_with_initial_state(spark: SparkSession, state_table: str, root: str) -> tuple[float, int]:
    """(seconds from query start to batch 0 committed, keys seeded) for the state in ``state_table``
    (columns key, n, total)."""
    shutil.rmtree(root, ignore_errors=True)
    sentinel = f"{root}/sentinel"
    spark.createDataFrame([("__sentinel__", 0)], "key string, value long").write.format("delta").save(sentinel)
    initial = spark.read.format("delta").load(state_table).select("key", "n", "total")
    keys = initial.count()
    t = time.perf_counter()
    query = (
        spark.readStream.format("delta")
        .load(sentinel)
        .groupBy("key")
        .transformWithState(
            SumCount(),
            outputStructType="key string, n long, total long",
            outputMode="Update",
            timeMode="None",
            initialState=initial.groupBy("key"),
        )
        .writeStream.format("noop")
        .option("checkpointLocation", f"{root}/checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - t, keys
