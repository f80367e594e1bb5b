"""Source schema changes while the live phase runs: an added nullable column and a Delta type widening are
taken up (the live phase goes on, results equal the reference); a change the operator cannot take stops it
with an error naming the column, the change and the way out, and it resumes once the user acted."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from phases._internal.backlog.runner import BacklogRunner
from phases._internal.definition import Aggregation, KeyedAggregate
from phases._internal.errors import SchemaChangeError
from phases._internal.live.runner import LiveRunner
from tests import reference
from tests.conftest import make_pipeline
from tests.helpers import append_version, assert_results_equal, sink_rows, ts, write_source
from tests.phases.live.test_live import BACKLOG, DELAY_S, S

INT_SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("value", T.IntegerType()),
    ]
)


def test_a_column_added_while_live_runs_is_taken_up(spark, tmp_path):
    source = str(tmp_path / "source")
    write_source(spark, source, BACKLOG)
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    BacklogRunner(spark, p).run()
    live = LiveRunner.from_manifest(spark, p)
    live.start()
    try:
        rows = [("a", 120 * S, 5, "x"), ("d", 130 * S, 6, None)]
        data = [(k, ts(t), v, e) for k, t, v, e in rows]
        df = spark.createDataFrame(data, "key string, ts timestamp, value long, extra string")
        df.write.format("delta").mode("append").option("mergeSchema", "true").save(source)
        live.process_available()
        live.raise_if_failed()
    finally:
        live.stop()
    expected, _ = reference.run({**BACKLOG, 3: [r[:3] for r in rows]}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)


def _int_source(spark, path: str) -> None:
    writer = spark.createDataFrame([], INT_SCHEMA).write.format("delta")
    writer.option("delta.enableChangeDataFeed", "true").option("delta.enableTypeWidening", "true").save(path)
    for v in sorted(BACKLOG):
        data = [(k, ts(t), val) for k, t, val in BACKLOG[v]]
        spark.createDataFrame(data, INT_SCHEMA).write.format("delta").mode("append").save(path)


def test_an_int_to_bigint_widening_while_live_runs_is_taken_up(spark, tmp_path):
    source = str(tmp_path / "source")
    _int_source(spark, source)
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S)
    BacklogRunner(spark, p).run()
    live = LiveRunner.from_manifest(spark, p)
    live.start()
    try:
        spark.sql(f"ALTER TABLE delta.`{source}` ALTER COLUMN value TYPE BIGINT")
        big = [("a", 120 * S, 2**40), ("b", 125 * S, 3)]
        data = [(k, ts(t), v) for k, t, v in big]
        spark.createDataFrame(data, "key string, ts timestamp, value long").write.format("delta").mode("append").save(
            source
        )
        live.process_available()
        live.raise_if_failed()
    finally:
        live.stop()
    expected, _ = reference.run({**BACKLOG, 4: big}, DELAY_S * S)
    assert_results_equal(sink_rows(spark, p.sink.path), expected)
    sink_types = {f.name: f.dataType for f in spark.read.format("delta").load(p.sink.path).schema.fields}
    assert sink_types["hi"] == T.LongType()


def test_a_change_the_operator_cannot_take_names_the_column_and_the_way_out(spark, tmp_path):
    source = str(tmp_path / "source")
    _int_source(spark, source)
    xor = KeyedAggregate(aggregations=[Aggregation(name="xor", kind="reduce", column="value", reduce="acc ^ x")])
    p = make_pipeline(source, str(tmp_path / "run"), delay_s=DELAY_S, operator=xor)
    BacklogRunner(spark, p).run()
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    spark.sql(f"ALTER TABLE delta.`{source}` ALTER COLUMN value TYPE DOUBLE")  # a widening Delta allows
    with pytest.raises(SchemaChangeError) as err:
        LiveRunner.from_manifest(spark, p).start(available_now=True)
    msg = str(err.value)
    assert "'value'" in msg and "int" in msg and "double" in msg and "reset=True" in msg


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_column_added_to_one_input_of_a_join_while_live_runs_is_taken_up(spark, tmp_path, side):
    """Two-input operators keep each input's rows in their state: an input's new nullable column reaches the
    state's rows and the sink's columns, and rows held from before the change meet rows that carry it."""
    from tests.phases.operators.test_two_input import SECOND, _join, _pairs

    left_src, right_src = str(tmp_path / "left"), str(tmp_path / "right")
    write_source(spark, left_src, {1: [("a", 10 * SECOND, 1)]})
    write_source(spark, right_src, {1: [("b", 10 * SECOND, 2)]})
    p = make_pipeline(left_src, str(tmp_path / "p"), delay_s=DELAY_S, operator=_join(right_src))
    BacklogRunner(spark, p).run()
    live = LiveRunner.from_manifest(spark, p)
    live.start()
    changed, other = (left_src, right_src) if side == "left" else (right_src, left_src)
    try:
        rows = [("a", ts(15 * SECOND), 3, "x")]
        df = spark.createDataFrame(rows, "key string, ts timestamp, value long, extra string")
        df.write.format("delta").mode("append").option("mergeSchema", "true").save(changed)
        live.process_available()
        append_version(spark, other, [("a", 12 * SECOND, 4)])  # meets the new row
        live.process_available()
        live.raise_if_failed()
    finally:
        live.stop()
    if side == "left":  # left rows: (a, 10 s, 1) from the backlog, (a, 15 s, 3, x); right row (a, 12 s, 4)
        expected = [("a", 10 * SECOND, 1, 12 * SECOND, 4), ("a", 15 * SECOND, 3, 12 * SECOND, 4)]
    else:  # left rows (a, 10 s, 1) from the backlog and (a, 12 s, 4); right row (a, 15 s, 3, x)
        expected = [("a", 10 * SECOND, 1, 15 * SECOND, 3), ("a", 12 * SECOND, 4, 15 * SECOND, 3)]
    assert _pairs(spark, p.sink.path) == sorted(expected, key=repr)
    column = "extra" if side == "left" else "right_extra"
    sink = spark.read.format("delta").load(p.sink.path)
    assert column in sink.columns
    carried = sorted(r[column] for r in sink.collect() if r[column] is not None)
    assert carried == ["x"] * (1 if side == "left" else 2)


def test_an_int_to_bigint_widening_of_a_join_input_while_live_runs_is_taken_up(spark, tmp_path):
    """The widened column is inside the rows the join holds: the state's nested field and the sink's column
    widen, and a held int row meets a row of the other input after the change."""
    from tests.phases.operators.test_two_input import SECOND, _join, _pairs

    left_src, right_src = str(tmp_path / "left"), str(tmp_path / "right")
    writer = spark.createDataFrame([], INT_SCHEMA).write.format("delta")
    writer.option("delta.enableChangeDataFeed", "true").option("delta.enableTypeWidening", "true").save(left_src)
    spark.createDataFrame([("a", ts(10 * SECOND), 1)], INT_SCHEMA).write.format("delta").mode("append").save(left_src)
    write_source(spark, right_src, {1: [("b", 10 * SECOND, 2)]})
    p = make_pipeline(left_src, str(tmp_path / "p"), delay_s=DELAY_S, operator=_join(right_src))
    BacklogRunner(spark, p).run()
    live = LiveRunner.from_manifest(spark, p)
    live.start()
    try:
        spark.sql(f"ALTER TABLE delta.`{left_src}` ALTER COLUMN value TYPE BIGINT")
        big = spark.createDataFrame([("a", ts(12 * SECOND), 2**40)], "key string, ts timestamp, value long")
        big.write.format("delta").mode("append").save(left_src)
        live.process_available()
        append_version(spark, right_src, [("a", 15 * SECOND, 3)])  # meets the held int row and the big one
        live.process_available()
        live.raise_if_failed()
    finally:
        live.stop()
    expected = [("a", 10 * SECOND, 1, 15 * SECOND, 3), ("a", 12 * SECOND, 2**40, 15 * SECOND, 3)]
    assert _pairs(spark, p.sink.path) == sorted(expected, key=repr)
    sink_types = {f.name: f.dataType for f in spark.read.format("delta").load(p.sink.path).schema.fields}
    assert sink_types["value"] == T.LongType()


def test_sparks_streaming_drivers_print_no_error_when_a_query_stops_for_a_schema_change(spark):
    """A schema change stops the live query on purpose (it is taken up and the query resumes): Spark's drivers used to
    print "ERROR MicroBatchExecution ... terminated with error" and the JVM stack on the console. The session keeps
    them at FATAL. The loggers are named after Spark 4.2's classes: a renamed class fails here."""
    from phases._internal.runtime.session import STREAM_EXECUTION_LOGGERS

    jvm = spark._jvm
    for name in STREAM_EXECUTION_LOGGERS:
        jvm.java.lang.Class.forName(name)
        assert str(jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel()) == "FATAL", name
