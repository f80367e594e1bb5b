"""A process operator's schemas and its one pass, used by the backlog, catch-up increments and every live
micro-batch (:mod:`phases.live.micro_batch`).

The pass feeds :class:`~phases.operators.process_function.KeyDriver` *encoded* records: the key columns, the record's
source version (``_commit_version``), the watermark of that version (``_watermark_us``, W(v)) and the user
columns with timestamps as microseconds.

The records, and the previous state rows of the keys concerned (none in the backlog), are hash-partitioned
by key and sorted by key, state first, then version and event time; one ``mapInArrow`` call per partition
walks the keys in order, one key's state in memory at a time (FLIP-140's single-key state), fires the key's
timers before each version's rows and, at the end of the key, up to the watermark after the pass (the final
backlog watermark, FLIP-327; live, the watermark after the micro-batch). It emits output rows and one state
row per key (state JSON, pending timers, rows processed, greatest event time) in the same pass; the caller
writes them apart."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from phases.definition import Pipeline, ProcessOperator
from phases.errors import DefinitionError
from phases.lateness import VERSION, WATERMARK_US
from phases.operators.aggregation import MAX_TS
from phases.operators.process_function import KeyDriver, group_runs, load_process_function, to_us

KIND = "_kind"  # backlog pass output: 'out' (an output row) or 'state' (a key's state)
STATE = "_state"  # the key's state as JSON (null: nothing held)
TIMERS = "_timers"  # the key's pending timers, epoch milliseconds
ROWS = "_rows"  # records the key processed in the backlog (its greatest event time: MAX_TS)
OUT, STATE_ROW = "out", "state"
_ORDER = "_order"  # increment pass input: 0 a key's previous state, 1 a record
_MAX_US = "_max_us"
_ARROW_CHUNK = 10_000


class ProcessLogic:
    """Schemas and the record encoding of one pipeline's process operator, checked on the driver."""

    def __init__(self, spark: SparkSession, pipeline: Pipeline, prepared_schema: T.StructType):
        if not isinstance(pipeline.operator, ProcessOperator):
            raise DefinitionError(f"pipeline {pipeline.name!r} has no process operator")
        self.pipeline = pipeline
        self.function_path = pipeline.operator.function
        function = load_process_function(self.function_path)
        fields = {f.name: f for f in prepared_schema.fields}
        for col in [*pipeline.key_columns, pipeline.event_time]:
            if col not in fields:
                raise DefinitionError(f"column {col!r} is not in the records; columns: {sorted(fields)}")
        if not isinstance(fields[pipeline.event_time].dataType, T.TimestampType):
            raise DefinitionError(f"event_time column {pipeline.event_time!r} must be a timestamp")
        self.keys = list(pipeline.key_columns)
        self.user_columns = [n for n in fields if not n.startswith("_")]
        self.ts_columns = [n for n in self.user_columns if isinstance(fields[n].dataType, T.TimestampType)]
        self.encoded_schema = T.StructType(
            [
                T.StructField(n, T.LongType() if n in self.ts_columns else fields[n].dataType, True)
                for n in self.user_columns
                if n not in self.keys
            ]
        )
        try:
            out = T._parse_datatype_string(function.output_schema)
        except Exception as exc:  # noqa: BLE001 - Spark raises several parse error types
            raise DefinitionError(
                f"process function {self.function_path!r}: output_schema {function.output_schema!r} is not Spark "
                f"DDL ('name type, ...'): {exc}"
            ) from exc
        clash = sorted({f.name for f in out.fields} & set(self.keys))
        if clash:
            raise DefinitionError(
                f"process function {self.function_path!r}: output columns {clash} clash with the key columns "
                "(which are added to every output row)"
            )
        self.output_columns = [f.name for f in out.fields]
        self.output_schema = T.StructType([fields[k] for k in self.keys] + list(out.fields))
        self.output_ts = [f.name for f in out.fields if isinstance(f.dataType, T.TimestampType)]
        self.state_schema = T.StructType(
            [
                *(fields[k] for k in self.keys),
                T.StructField(STATE, T.StringType(), True),
                T.StructField(TIMERS, T.ArrayType(T.LongType(), False), True),
                T.StructField(ROWS, T.LongType(), True),
                T.StructField(MAX_TS, T.TimestampType(), True),
            ]
        )
        self.pass_schema = T.StructType(
            [
                *self.output_schema.fields,
                T.StructField(KIND, T.StringType(), False),
                *self.state_schema.fields[len(self.keys) :],
            ]
        )

    def driver(self) -> KeyDriver:
        """A fresh driver (called in Python workers: it imports the user's class there)."""
        return KeyDriver(
            load_process_function(self.function_path),
            self.keys,
            self.output_columns,
            self.ts_columns,
            self.pipeline.event_time,
        )

    def encoded_columns(self) -> list:
        """Record columns as the driver receives them: timestamps as microseconds."""
        return [
            (F.unix_micros(F.col(c)) if c in self.ts_columns else F.col(c)).alias(c)
            for c in self.user_columns
            if c not in self.keys
        ]

    def encode_row(self, row: dict) -> dict:
        """An output row for Arrow: timestamps as microseconds (naive datetimes are UTC)."""
        for c in self.output_ts:
            if isinstance(row.get(c), datetime):
                row[c] = to_us(row[c])
        return row

    # --- backlog and increments ---------------------------------------------------------------
    def backlog_pass(self, on_time: DataFrame, final_watermark_us: int | None) -> DataFrame:
        """Output rows and per-key state rows (``_kind``) of the backlog, grouped by key."""
        return self.increment_pass(on_time, None, final_watermark_us)

    def increment_pass(
        self, on_time: DataFrame | None, previous: DataFrame | None, watermark_us: int | None
    ) -> DataFrame:
        """Output rows and the new state rows of the keys in ``on_time`` or ``previous``.

        ``previous`` holds state rows (:attr:`state_schema`) the keys start from: a key's state and
        pending timers, as the backlog or an earlier increment left them. Per key: its rows version by
        version (timers due by the version's W(v) first), then its timers due by ``watermark_us`` (the
        watermark after these versions). The backlog is the pass with no previous state; a live micro-batch
        passes the keys it has records for and the keys whose timers the new watermark makes due."""
        spark = (on_time if on_time is not None else previous).sparkSession
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
        et = self.pipeline.event_time
        record_cols = [c for c in self.user_columns if c not in self.keys]
        encoded_types = {f.name: f.dataType for f in self.encoded_schema.fields}
        parts = []
        if previous is not None:
            parts.append(
                previous.select(
                    *self.keys,
                    F.lit(0).alias(_ORDER),
                    F.lit(None).cast("long").alias(VERSION),
                    F.lit(None).cast("long").alias(WATERMARK_US),
                    *(F.lit(None).cast(encoded_types[c]).alias(c) for c in record_cols),
                    F.col(STATE),
                    F.col(TIMERS),
                    F.col(ROWS).cast("long").alias(ROWS),
                    F.unix_micros(F.col(MAX_TS)).alias(_MAX_US),
                )
            )
        if on_time is not None:
            parts.append(
                on_time.select(
                    *self.keys,
                    F.lit(1).alias(_ORDER),
                    F.col(VERSION).cast("long"),
                    F.col(WATERMARK_US).cast("long"),
                    *self.encoded_columns(),
                    F.lit(None).cast("string").alias(STATE),
                    F.lit(None).cast("array<long>").alias(TIMERS),
                    F.lit(None).cast("long").alias(ROWS),
                    F.lit(None).cast("long").alias(_MAX_US),
                )
            )
        both = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        ordered = both.repartition(partitions, *self.keys).sortWithinPartitions(*self.keys, _ORDER, VERSION, et)
        logic = self
        arrow_schema = to_arrow_schema(self.pass_schema, timezone="UTC")
        empty = {c: None for c in self.pass_schema.names}
        engine = {_ORDER, VERSION, WATERMARK_US, STATE, TIMERS, ROWS, _MAX_US}

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            driver = logic.driver()
            keys = logic.keys
            pending: list[dict] = []

            def records() -> Iterator[dict]:
                for batch in batches:
                    yield from batch.to_pylist()

            for key, rows in group_runs(records(), lambda r: tuple(r[k] for k in keys)):
                seen, max_us = 0, None
                if rows[0][_ORDER] == 0:  # the key's previous state comes first
                    before = rows.pop(0)
                    driver.start(key, before[STATE], before[TIMERS] or ())
                    seen, max_us = before[ROWS] or 0, before[_MAX_US]
                else:
                    driver.start(key, None, ())
                for _, version_rows in group_runs(rows, lambda r: r[VERSION]):
                    watermark = version_rows[0][WATERMARK_US]
                    user_rows = [{c: v for c, v in r.items() if c not in engine} for r in version_rows]
                    produced = driver.fire_due(watermark) + driver.process(user_rows)
                    pending.extend({**empty, **logic.encode_row(o), KIND: OUT} for o in produced)
                    top = max(r[et] for r in version_rows)
                    max_us = top if max_us is None else max(max_us, top)
                pending.extend({**empty, **logic.encode_row(o), KIND: OUT} for o in driver.fire_due(watermark_us))
                state, timers = driver.state()
                row = {**empty, **dict(zip(keys, key, strict=True)), KIND: STATE_ROW, STATE: state, TIMERS: timers}
                pending.append({**row, ROWS: seen + len(rows), MAX_TS: max_us})
                if len(pending) >= _ARROW_CHUNK:
                    yield pa.RecordBatch.from_pylist(pending, schema=arrow_schema)
                    pending = []
            if pending:
                yield pa.RecordBatch.from_pylist(pending, schema=arrow_schema)

        return ordered.mapInArrow(run, self.pass_schema)

    def outputs(self, passed: DataFrame) -> DataFrame:
        return passed.filter(F.col(KIND) == OUT).select(*self.output_schema.names)

    def states(self, passed: DataFrame) -> DataFrame:
        return passed.filter(F.col(KIND) == STATE_ROW).select(*self.state_schema.names)
