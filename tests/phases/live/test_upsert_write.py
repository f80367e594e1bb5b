"""An upsert sink's ways of writing a micro-batch's changed keys: a MERGE, a rewrite of the whole table (its other rows
plus the changed ones, one overwrite), or, when no changed key is in the table, an append. All leave the same table;
``auto`` picks the append only when every changed key is new, the rewrite only when a MERGE would rewrite nearly every
file."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from phases._internal.storage import table_stats, tables

SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType()),
        T.StructField("part", T.IntegerType()),
        T.StructField("n", T.LongType()),
        T.StructField("total", T.LongType()),
    ]
)
KEYS = ["key", "part"]


def _table(spark, path, rows, files: int = 1) -> None:
    spark.createDataFrame(rows, SCHEMA).repartition(files).write.format("delta").mode("overwrite").save(str(path))


def _sorted(spark, path) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).collect())


keys = st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 3))


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    before=st.dictionaries(keys, st.tuples(st.integers(1, 9), st.integers(-50, 50)), max_size=20),
    changed=st.dictionaries(keys, st.tuples(st.integers(1, 9), st.integers(-50, 50)), min_size=1, max_size=20),
    files=st.integers(1, 3),
)
def test_a_rewrite_leaves_the_table_a_merge_leaves(spark, tmp_path_factory, before, changed, files):
    base = tmp_path_factory.mktemp("upsert")
    start = [(k, p, n, t) for (k, p), (n, t) in before.items()]
    rows = spark.createDataFrame([(k, p, n, t) for (k, p), (n, t) in changed.items()], SCHEMA)
    ways = {}
    # An append only for changes of keys the table does not hold (the state store says so; never otherwise).
    new_only = not set(changed) & set(before)
    for write in ("merge", "rewrite", "append") if new_only else ("merge", "rewrite"):
        path = base / write
        _table(spark, path, start, files)
        tables.upsert_marked(spark, str(path), rows, KEYS, "app", 7, write=write, changed=len(changed))
        ways[write] = _sorted(spark, path)
        assert table_stats.has_marked_write(str(path), "app", 7)  # the write's mark, either way
    expected = sorted({**{(k, p): (n, t) for k, p, n, t in start}, **changed}.items())
    assert ways["merge"] == ways["rewrite"] == ways.get("append", ways["merge"])
    assert ways["merge"] == [(k, p, n, t) for (k, p), (n, t) in expected]


def test_a_rewrite_keeps_the_tables_schema_and_properties(spark, tmp_path):
    path = str(tmp_path / "sink")
    _table(spark, path, [("a", 0, 1, 1), ("b", 0, 1, 2)])
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.autoOptimize.autoCompact' = 'true')")
    changed = spark.createDataFrame([("a", 0, 2, 5), ("c", 1, 1, 3)], SCHEMA)
    tables.upsert_marked(spark, path, changed, KEYS, "app", 0, write="rewrite", changed=2)
    assert _sorted(spark, path) == [("a", 0, 2, 5), ("b", 0, 1, 2), ("c", 1, 1, 3)]
    assert table_stats.properties(path)["delta.autoOptimize.autoCompact"] == "true"
    assert spark.read.format("delta").load(path).schema == SCHEMA
    with pytest.raises(ValueError, match=r"write 'replace': valid values are \['merge', 'rewrite', 'append'\]"):
        tables.upsert_marked(spark, path, changed, KEYS, "app", 1, write="replace")


def test_auto_appends_only_new_keys_and_rewrites_only_when_a_merge_would_rewrite_nearly_every_file(spark, tmp_path):
    path = str(tmp_path / "sink")
    _table(spark, path, [(f"k{i}", 0, 1, i) for i in range(40)], files=4)
    files = table_stats.data_files(path)[0]
    assert files == 4
    per_file = tables.REWRITE_UPDATES_PER_FILE
    # Five updated keys a file: a MERGE would leave fewer than 1 % of the files alone.
    assert tables.upsert_write(path, "auto", changed=per_file * files, new=0) == "rewrite"
    assert tables.upsert_write(path, "auto", changed=per_file * files - 1, new=0) == "merge"
    # New keys touch no file: only the updated ones count; with none updated, the new keys' rows are appended.
    assert tables.upsert_write(path, "auto", changed=per_file * files + 10, new=11) == "merge"
    assert tables.upsert_write(path, "auto", changed=3, new=3) == "append"
    assert tables.upsert_write(path, "auto", changed=3, new=2) == "merge"
    # Not known how many are new: a MERGE.
    assert tables.upsert_write(path, "auto", changed=10_000, new=None) == "merge"
    # A setting other than auto is taken as it is.
    assert tables.upsert_write(path, "merge", changed=10_000, new=0) == "merge"
    assert tables.upsert_write(path, "rewrite", changed=1, new=1) == "rewrite"
    # A table of one data file holds every updated key: a MERGE would rewrite it all.
    one = str(tmp_path / "one")
    _table(spark, one, [(f"k{i}", 0, 1, i) for i in range(40)], files=1)
    assert tables.upsert_write(one, "auto", changed=2, new=1) == "rewrite"
    # A sink with its change data feed on: a rewrite would record every row as deleted and inserted again (an append
    # records the new rows only).
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    assert tables.upsert_write(path, "auto", changed=10_000, new=0) == "merge"
    assert tables.upsert_write(path, "auto", changed=10, new=10) == "append"
    spark.sql(f"ALTER TABLE delta.`{one}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    assert tables.upsert_write(one, "auto", changed=2, new=1) == "merge"
