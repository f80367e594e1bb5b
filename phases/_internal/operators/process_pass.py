"""A process operator's schemas and its one pass, used by the backlog, catch-up increments and every live
micro-batch (:mod:`phases._internal.live.micro_batch`).

The pass feeds :class:`~phases._internal.operators.process_function.KeyDriver` *encoded* records: the key columns, the
record's source version (``_commit_version``), the watermark of that version (``_watermark_us``, W(v)) and the user
columns with timestamps as microseconds.

The records, and the previous state rows of the keys concerned (none in the backlog), are hash-partitioned
by key and sorted by key, state first, then version and event time; one ``mapInArrow`` call per partition
walks the keys in order, one key's state in memory at a time (FLIP-140's single-key state), fires the key's
timers before each version's rows and, at the end of the key, up to the watermark after the pass (the final
backlog watermark, FLIP-327; live, the watermark after the micro-batch). It emits output rows and one state
row per key (state JSON, pending timers, rows processed, greatest event time) in the same pass; the caller
writes them apart."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime
from operator import itemgetter

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from phases._internal.definition import Pipeline, ProcessOperator
from phases._internal.errors import DefinitionError
from phases._internal.lateness import VERSION, WATERMARK_US
from phases._internal.operators.aggregation import MAX_TS
from phases._internal.operators.process_function import KeyDriver, load_process_function, to_us

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
        clash = sorted({f.name for f in out.fields} & set(self.keys))  # pyright: ignore[reportAttributeAccessIssue]
        if clash:
            raise DefinitionError(
                f"process function {self.function_path!r}: output columns {clash} clash with the key columns "
                "(which are added to every output row)"
            )
        self.output_columns = [f.name for f in out.fields]  # pyright: ignore[reportAttributeAccessIssue]
        self.output_schema = T.StructType([fields[k] for k in self.keys] + list(out.fields))  # pyright: ignore[reportAttributeAccessIssue]
        self.output_ts = [f.name for f in out.fields if isinstance(f.dataType, T.TimestampType)]  # pyright: ignore[reportAttributeAccessIssue]
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
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))  # pyright: ignore[reportArgumentType]
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

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return pass_partition(logic, batches, watermark_us)

        return ordered.mapInArrow(run, self.pass_schema)

    def outputs(self, passed: DataFrame) -> DataFrame:
        return passed.filter(F.col(KIND) == OUT).select(*self.output_schema.names)

    def states(self, passed: DataFrame) -> DataFrame:
        return passed.filter(F.col(KIND) == STATE_ROW).select(*self.state_schema.names)


def pass_partition(
    logic: ProcessLogic, batches: Iterator[pa.RecordBatch], watermark_us: int | None
) -> Iterator[pa.RecordBatch]:
    """One partition of the pass: ``batches`` of :meth:`ProcessLogic.increment_pass`'s sorted input (a key's previous
    state row first, then its records by version and event time) in, output and state rows (:attr:`ProcessLogic.
    pass_schema`) out, ``_ARROW_CHUNK`` rows a batch.

    The framework's own cost per record is what this adds to the user's function: the batches are read column by
    column into tuples (not a dict per row with every engine column), keys and versions are grouped by C-level
    ``itemgetter`` runs, a record becomes the user's dict of its own columns only, and rows already ordered by event
    time are ordered by value only where two share an event time (:meth:`KeyDriver.process`)."""
    driver = logic.driver()
    keys, et = logic.keys, logic.pipeline.event_time
    names: list[str] | None = None
    pending: list[dict] = []
    empty = {c: None for c in logic.pass_schema.names}
    arrow_schema = to_arrow_schema(logic.pass_schema, timezone="UTC")

    def records() -> Iterator[tuple]:
        nonlocal names
        for batch in batches:
            if names is None:
                names = batch.schema.names
            yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)

    stream = records()
    first = next(stream, None)
    if first is None:
        return
    at = {n: i for i, n in enumerate(names)}  # pyright: ignore[reportArgumentType]
    key_of = itemgetter(*(at[k] for k in keys)) if len(keys) > 1 else (lambda r, i=at[keys[0]]: (r[i],))
    version_of = itemgetter(at[VERSION])
    i_order, i_watermark, i_et = at[_ORDER], at[WATERMARK_US], at[et]
    i_state, i_timers, i_rows, i_max = at[STATE], at[TIMERS], at[ROWS], at[_MAX_US]
    # What the user's function sees of a record: the key and record columns, in the input's order.
    engine = {_ORDER, VERSION, WATERMARK_US, STATE, TIMERS, ROWS, _MAX_US}
    user = [n for n in names if n not in engine]  # pyright: ignore[reportGeneralTypeIssues]
    user_values = itemgetter(*(at[n] for n in user)) if len(user) > 1 else (lambda r, i=at[user[0]]: (r[i],))

    def out_rows(produced: list[dict]) -> None:
        for o in produced:
            row = dict(empty)
            row.update(logic.encode_row(o))
            row[KIND] = OUT  # pyright: ignore[reportArgumentType]
            pending.append(row)

    rows_of_keys = itertools.groupby(itertools.chain((first,), stream), key=key_of)
    for key, key_rows in rows_of_keys:
        rows = list(key_rows)
        seen, max_us = 0, None
        if rows[0][i_order] == 0:  # the key's previous state comes first
            before = rows.pop(0)
            driver.start(key, before[i_state], before[i_timers] or ())
            seen, max_us = before[i_rows] or 0, before[i_max]
        else:
            driver.start(key, None, ())
        for _, version_rows in itertools.groupby(rows, key=version_of):
            version_rows = list(version_rows)
            watermark = version_rows[0][i_watermark]
            user_rows = [dict(zip(user, user_values(r), strict=True)) for r in version_rows]
            out_rows(driver.fire_due(watermark))
            out_rows(driver.process(user_rows, by_event_time=True))
            top = version_rows[-1][i_et]  # sorted by event time within the version
            max_us = top if max_us is None else max(max_us, top)
        out_rows(driver.fire_due(watermark_us))
        state, timers = driver.state()
        row = dict(empty)
        row.update(zip(keys, key, strict=True))
        row[KIND], row[STATE], row[TIMERS], row[ROWS], row[MAX_TS] = STATE_ROW, state, timers, seen + len(rows), max_us  # pyright: ignore[reportArgumentType]
        pending.append(row)
        if len(pending) >= _ARROW_CHUNK:
            yield pa.RecordBatch.from_pylist(pending, schema=arrow_schema)
            pending = []
    if pending:
        yield pa.RecordBatch.from_pylist(pending, schema=arrow_schema)
