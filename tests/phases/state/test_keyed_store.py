"""Spark's state store as the live phase's keyed state (phases._internal.state.keyed_store, the JVM helper in jvm/).

The first test pins every Spark-internal class and signature the helper uses: when a Spark release changes one, it
fails naming it, before anything runs into a NoSuchMethodError in a micro-batch."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from phases._internal.errors import StateStoreError
from phases._internal.runtime import jvm_deps
from phases._internal.state.keyed_store import (
    CombinedLayout,
    LiveStateStore,
    OrderedLayout,
    RowLayout,
    SessionLayout,
    new_store_partitions,
)

# (class, method, parameter classes) the helper calls; "<init>" = a constructor.
STATE = "org.apache.spark.sql.execution.streaming.state"
INTERNAL_API = [
    (
        "org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo",
        "<init>",
        ["java.lang.String", "java.util.UUID", "long", "long", "int", "scala.Option", "scala.Option"],
    ),
    (
        f"{STATE}.package$StateStoreOps",
        "mapPartitionsWithStateStore",
        [
            "org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo",
            "org.apache.spark.sql.types.StructType",
            "org.apache.spark.sql.types.StructType",
            f"{STATE}.KeyStateEncoderSpec",
            "org.apache.spark.sql.internal.SessionState",
            "scala.Option",
            "boolean",
            "scala.collection.immutable.Map",
            "boolean",
            "scala.Function2",
            "scala.reflect.ClassTag",
        ],
    ),
    (f"{STATE}.NoPrefixKeyStateEncoderSpec", "<init>", ["org.apache.spark.sql.types.StructType"]),
    (
        f"{STATE}.RangeKeyScanStateEncoderSpec",
        "<init>",
        ["org.apache.spark.sql.types.StructType", "scala.collection.immutable.Seq"],
    ),
    (f"{STATE}.StateStore", "remove", ["org.apache.spark.sql.catalyst.expressions.UnsafeRow", "java.lang.String"]),
    (f"{STATE}.StateStoreIterator", "close", []),
    # Sessions (SessionStateStore): a prefix-scanned family and an ordered one.
    (f"{STATE}.PrefixKeyScanStateEncoderSpec", "<init>", ["org.apache.spark.sql.types.StructType", "int"]),
    (f"{STATE}.StateStore", "prefixScan", ["org.apache.spark.sql.catalyst.expressions.UnsafeRow", "java.lang.String"]),
    (
        f"{STATE}.StateStore",
        "createColFamilyIfAbsent",
        [
            "java.lang.String",
            "org.apache.spark.sql.types.StructType",
            "org.apache.spark.sql.types.StructType",
            f"{STATE}.KeyStateEncoderSpec",
            "boolean",
            "boolean",
        ],
    ),
    (f"{STATE}.StateStore", "get", ["org.apache.spark.sql.catalyst.expressions.UnsafeRow", "java.lang.String"]),
    (
        f"{STATE}.StateStore",
        "put",
        [
            "org.apache.spark.sql.catalyst.expressions.UnsafeRow",
            "org.apache.spark.sql.catalyst.expressions.UnsafeRow",
            "java.lang.String",
        ],
    ),
    (f"{STATE}.StateStore", "commit", []),
    (f"{STATE}.StateStore", "abort", []),
    (f"{STATE}.StateStore", "iterator", ["java.lang.String"]),
    (f"{STATE}.StateStoreCoordinatorRef", "getLocation", [f"{STATE}.StateStoreProviderId"]),
    ("org.apache.spark.sql.classic.SparkSession", "cloneSession", []),
    (
        "org.apache.spark.sql.classic.SparkSession",
        "internalCreateDataFrame",
        ["org.apache.spark.rdd.RDD", "org.apache.spark.sql.types.StructType", "boolean"],
    ),
    ("org.apache.spark.sql.classic.StreamingQueryManager", "stateStoreCoordinator", []),
    # StoreSupport.frameOf: a store update's rows as a plan that states its row count and size.
    (
        "org.apache.spark.sql.execution.LogicalRDD",
        "<init>",
        [
            "scala.collection.immutable.Seq",
            "org.apache.spark.rdd.RDD",
            "org.apache.spark.sql.catalyst.plans.physical.Partitioning",
            "scala.collection.immutable.Seq",
            "boolean",
            "scala.Option",
            "org.apache.spark.sql.classic.SparkSession",
            "scala.Option",
            "scala.Option",
        ],
    ),
    (
        "org.apache.spark.sql.catalyst.plans.logical.Statistics",
        "<init>",
        ["scala.math.BigInt", "scala.Option", "org.apache.spark.sql.catalyst.expressions.AttributeMap", "boolean"],
    ),
    (
        "org.apache.spark.sql.catalyst.plans.logical.statsEstimation.EstimationUtils",
        "getSizePerRow",
        ["scala.collection.immutable.Seq", "org.apache.spark.sql.catalyst.expressions.AttributeMap"],
    ),
    (
        "org.apache.spark.sql.classic.Dataset",
        "ofRows",
        ["org.apache.spark.sql.classic.SparkSession", "org.apache.spark.sql.catalyst.plans.logical.LogicalPlan"],
    ),
    ("org.apache.spark.sql.catalyst.types.DataTypeUtils", "toAttributes", ["org.apache.spark.sql.types.StructType"]),
    ("org.apache.spark.sql.classic.Dataset", "queryExecution", []),
    (f"{STATE}.RocksDBStateStoreProvider", "<init>", []),
    # StoreProfile: a task's figures after its commit; StoreBase.unload.
    (f"{STATE}.StateStore$", "isLoaded", [f"{STATE}.StateStoreProviderId"]),
    (f"{STATE}.StateStore$", "doMaintenanceAndUnload", [f"{STATE}.StateStoreProviderId"]),
    (f"{STATE}.StateStoreProviderId", "<init>", [f"{STATE}.StateStoreId", "java.util.UUID"]),
    (f"{STATE}.StateStoreId", "<init>", ["java.lang.String", "long", "int", "java.lang.String"]),
    (f"{STATE}.StateStore", "metrics", []),
    (f"{STATE}.StateStoreMetrics", "customMetrics", []),
    (f"{STATE}.StateStoreCustomMetric", "name", []),
    # The grouped route (StoreSupport.hashPartitions): the plan nodes it looks through to a hash partitioning.
    ("org.apache.spark.sql.execution.adaptive.AdaptiveSparkPlanExec", "executedPlan", []),
    ("org.apache.spark.sql.execution.adaptive.AdaptiveSparkPlanExec", "isFinalPlan", []),
    ("org.apache.spark.sql.execution.adaptive.QueryStageExec", "plan", []),
    ("org.apache.spark.sql.execution.WholeStageCodegenExec", "child", []),
    ("org.apache.spark.sql.execution.InputAdapter", "child", []),
    ("org.apache.spark.sql.execution.CollectMetricsExec", "child", []),
    ("org.apache.spark.sql.execution.FilterExec", "child", []),
    ("org.apache.spark.sql.execution.ProjectExec", "projectList", []),
    ("org.apache.spark.sql.execution.columnar.InMemoryTableScanExec", "relation", []),
    ("org.apache.spark.sql.execution.columnar.InMemoryRelation", "cachedPlan", []),
    ("org.apache.spark.sql.execution.columnar.InMemoryRelation", "output", []),
    ("org.apache.spark.sql.execution.exchange.Exchange", "child", []),
    ("org.apache.spark.sql.catalyst.plans.physical.HashPartitioning", "partitionIdExpression", []),
    ("org.apache.spark.sql.catalyst.plans.physical.HashPartitioning", "numPartitions", []),
]
# The RocksDB settings (changelogCheckpointing.enabled, trackTotalNumberOfRows) are read by prefix, not registered:
# the layout test below checks that changelog checkpointing took effect.
SQL_CONFS = ["spark.sql.streaming.stateStore.providerClass", "spark.sql.streaming.stateStore.unloadOnCommit"]


def test_the_internal_state_store_api_the_helper_uses_is_there(spark):
    jvm = spark._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    primitives = {
        "long": jvm.java.lang.Long.TYPE,
        "int": jvm.java.lang.Integer.TYPE,
        "boolean": jvm.java.lang.Boolean.TYPE,
    }

    def cls(name):
        if name in primitives:
            return primitives[name]
        try:
            return jvm.java.lang.Class.forName(name, False, loader)
        except Exception as exc:  # noqa: BLE001 - reported with the class name
            pytest.fail(f"Spark {spark.version}: class {name} (used by jvm/ KeyedStateStore) is gone: {exc}")

    gateway = spark.sparkContext._gateway
    missing = []
    for owner, method, params in INTERNAL_API:
        types = gateway.new_array(jvm.java.lang.Class, len(params))
        for i, p in enumerate(params):
            types[i] = cls(p)
        try:
            if method == "<init>":
                cls(owner).getDeclaredConstructor(types)
            else:
                cls(owner).getMethod(method, types)
        except Exception:  # noqa: BLE001 - collected and reported together
            missing.append(f"{owner}.{method}({', '.join(params)})")
    assert not missing, f"Spark {spark.version} changed the state-store API the helper (jvm/) uses: {missing}"
    for key in SQL_CONFS:
        assert spark.conf.isModifiable(key), f"Spark {spark.version}: SQL conf {key} (set by the helper) is gone"
    # The helper was built against the Spark the session runs.
    assert spark.version == "4.2.0", "the helper is built against spark-sql 4.2.0 (jvm/pom.xml); rebuild and re-pin"


def test_the_helper_jar_is_current_with_its_sources(tmp_path):
    # A changed source makes the cached jar stale, and the session refuses it with the way out.
    sources = tmp_path / "jvm"
    sources.mkdir()
    (sources / "pom.xml").write_text((jvm_deps.HELPER_SOURCES / "pom.xml").read_text())
    with pytest.raises(Exception, match="older than its sources"):
        jvm_deps.helper_jar(sources=sources)
    assert jvm_deps.helper_jar().endswith("phases-state-helper.jar")


def _partials(spark, rows):
    return spark.createDataFrame(rows, "key string, n long, total long, last timestamp")


COMBINE = [
    "t.n + s.n",
    "CASE WHEN t.total IS NULL THEN s.total WHEN s.total IS NULL THEN t.total ELSE t.total + s.total END",
    "greatest(t.last, s.last)",
]


AB = CombinedLayout(("a", "b"), ("n",))  # a two-column key


def _open(spark, path, partitions=3):
    schema = _partials(spark, []).schema
    return CombinedLayout(("key",), ("n", "total", "last")).open(spark, str(path), schema, partitions, None)


def _rows(df):
    return sorted(tuple(r) for r in df.collect())


def test_updates_combine_per_key_and_a_replay_writes_the_same_version(spark, tmp_path):
    from datetime import datetime

    t1, t2 = datetime(2026, 1, 1, 0, 0, 1), datetime(2026, 1, 1, 0, 0, 2)
    store = _open(spark, tmp_path / "store")
    handoff = store.write(_partials(spark, [("a", 2, 10, t1), ("b", 1, None, t1)]))
    handoff.release()
    assert handoff.version == 1
    batch = _partials(spark, [("a", 1, 5, t2), ("c", 1, 7, t2), ("b", 1, 3, t1)])
    first = store.update(batch, COMBINE, 1)
    expected = [("a", 3, 15, t2), ("b", 2, 3, t1), ("c", 1, 7, t2)]
    assert (first.version, first.changed_keys, _rows(first.rows)) == (2, 3, expected)
    assert first.new_keys == 1  # "c": the only key version 1 did not hold
    first.release()
    # A replayed micro-batch loads version 1 again and writes the same version 2.
    again = store.update(batch, COMBINE, 1)
    assert _rows(again.rows) == expected
    again.release()
    assert _rows(store.read(1)) == [("a", 2, 10, t1), ("b", 1, None, t1)]
    assert _rows(store.read(2)) == expected
    # A new opening (a restart: another run id, nothing loaded) reads the same versions from the files.
    reopened = _open(spark, tmp_path / "store")
    assert _rows(reopened.read(2)) == expected
    nxt = reopened.update(_partials(spark, [("a", 1, 1, t1), ("d", 1, 1, t1), ("d", 1, 2, t1)]), COMBINE, 2)
    assert _rows(nxt.rows) == [("a", 4, 16, t2), ("d", 2, 3, t1)]
    assert nxt.new_keys == 1  # a new key's second row finds the first one: counted once
    nxt.release()


def test_a_key_always_meets_its_own_state_whatever_the_batch_holds(spark, tmp_path):
    store = _open(spark, tmp_path / "store", partitions=4)
    keys = [f"k{i}" for i in range(200)]
    store.write(_partials(spark, [(k, 1, 1, None) for k in keys])).release()
    # Batches with other key sets, row orders and input partitionings: every key's count adds up.
    for version, chunk in enumerate([keys[::3], keys[1::2], keys[5:150], keys], start=1):
        batch = _partials(spark, [(k, 1, 1, None) for k in reversed(chunk)]).repartition(7)
        store.update(batch, COMBINE, version).release()
    counts = {r["key"]: r["n"] for r in store.read(5).collect()}
    expected = {k: 2 + (k in keys[::3]) + (k in keys[1::2]) + (k in keys[5:150]) for k in keys}
    assert counts == expected


def test_an_ordered_store_closes_exactly_the_rows_at_or_below_the_bound_and_keeps_the_rest(spark, tmp_path):
    """Windows' store: keyed by (end, key), stored in the order of end. An update combines first, then removes and
    returns every row whose end is at or below the bound (also one this update just changed), in every partition,
    whatever the key order; a replay of the same version closes the same rows."""
    schema = "end long, key string, n long"
    ordered = OrderedLayout(("end", "key"), ("n",), "end")
    store = ordered.open(spark, str(tmp_path / "w"), spark.createDataFrame([], schema).schema, 3, None)
    ends = [-5, 0, 7, 10, 11, 2**40, 30]
    start = [(e, f"k{i}", 1) for i, e in enumerate(ends)] + [(10, "z", 1), (11, "z", 1)]
    store.write(spark.createDataFrame(start, schema).repartition(5)).release()
    batch = spark.createDataFrame([(10, "z", 4), (12, "new", 1), (11, "z", 2)], schema)
    first = store.update_and_close(batch, ["t.n + s.n"], 1, 10)
    closed = [(-5, "k0", 1), (0, "k1", 1), (7, "k2", 1), (10, "k3", 1), (10, "z", 5)]
    assert (first.version, first.changed_keys, _rows(first.rows)) == (2, 5, closed)
    first.release()
    again = store.update_and_close(batch, ["t.n + s.n"], 1, 10)
    assert _rows(again.rows) == closed
    again.release()
    left = [(11, "k4", 1), (11, "z", 3), (12, "new", 1), (30, "k6", 1), (2**40, "k5", 1)]
    assert _rows(store.read(2)) == left
    # Nothing at or below the bound: nothing closed; no bound: nothing closed either.
    nothing = store.update_and_close(spark.createDataFrame([], schema), ["t.n + s.n"], 2, 10)
    assert (nothing.changed_keys, _rows(store.read(3))) == (0, left)
    nothing.release()
    # Closing is an ordered store's operation: a combining store without an order has none.
    assert not hasattr(_open(spark, tmp_path / "keyed"), "update_and_close")


def test_an_order_column_must_be_a_long_key_column(spark, tmp_path):
    schema = spark.createDataFrame([], "end timestamp, key string, n long").schema
    with pytest.raises(StateStoreError, match="must be a long"):
        OrderedLayout(("end", "key"), ("n",), "end").open(spark, str(tmp_path / "a"), schema, 2, None)
    with pytest.raises(StateStoreError, match="is not a key column"):
        OrderedLayout(("key",), ("n",), "n").open(spark, str(tmp_path / "b"), schema, 2, None)


def test_a_session_store_merges_a_keys_open_sessions_by_sparks_rule_and_closes_by_end(spark, tmp_path):
    """Sessions' store: a record's own session [start, end) merges with the key's open sessions when one starts at or
    before the other's end (Spark's session_window rule: touching sessions merge); one record can bridge two stored
    sessions. The sessions ending at or before the bound are removed and returned; a replay returns the same."""
    schema = spark.createDataFrame([], "key string, s long, e long, n long").schema
    store = SessionLayout(("key",), ("n",), "s", "e").open(spark, str(tmp_path / "s"), schema, 3, None)
    handoff = [("a", 0, 10, 1), ("a", 20, 30, 1), ("b", 5, 15, 2), ("c", 100, 110, 1)]
    store.write(spark.createDataFrame(handoff, schema)).release()
    assert _rows(store.read(1)) == sorted(handoff)
    # a: 8 joins [0, 10); 18 then touches [0, 18) and [20, 30): all three become [0, 30). b: 15 touches [5, 15).
    # d: a new key, two records 4 apart (gap 10): one session.
    batch = [("a", 8, 18, 1), ("a", 18, 28, 1), ("b", 15, 25, 1), ("d", 40, 50, 1), ("d", 44, 54, 1)]
    frame = spark.createDataFrame(batch, schema).repartition(4)
    first = store.update_and_close(frame, ["t.n + s.n"], 1, 30)
    closed = [("a", 0, 30, 4), ("b", 5, 25, 3)]
    assert (first.version, first.changed_keys, _rows(first.rows)) == (2, 2, closed)
    first.release()
    again = store.update_and_close(frame, ["t.n + s.n"], 1, 30)
    assert _rows(again.rows) == closed
    again.release()
    assert _rows(store.read(2)) == [("c", 100, 110, 1), ("d", 40, 54, 2)]
    # A record after a stored session's end (not touching) opens a session of its own; nothing is due at 53.
    later = store.update_and_close(spark.createDataFrame([("c", 111, 121, 1)], schema), ["t.n + s.n"], 2, 53)
    assert later.changed_keys == 0
    later.release()
    assert _rows(store.read(3)) == [("c", 100, 110, 1), ("c", 111, 121, 1), ("d", 40, 54, 2)]
    # A new opening (a restart) reads the same version from the files, with both of its column families.
    reopened = SessionLayout(("key",), ("n",), "s", "e").open(spark, str(tmp_path / "s"), schema, 3, None)
    last = reopened.update_and_close(spark.createDataFrame([], schema), ["t.n + s.n"], 3, 200)
    assert _rows(last.rows) == [("c", 100, 110, 1), ("c", 111, 121, 1), ("d", 40, 54, 2)]
    last.release()
    assert _rows(reopened.read(4)) == []


def test_a_timer_store_looks_up_the_batchs_keys_and_the_due_ones_and_replaces_their_timers(spark, tmp_path):
    """Process functions' store: state rows by key, timers (epoch ms) in a time-ordered index. A lookup returns the
    rows of the batch's keys (known ones) and of the keys with a timer due at the bound (microseconds), commits
    nothing; a replace moves a key's index entries with its new timers, so an old timer is never due again."""
    schema = spark.createDataFrame([], "key string, state string, timers array<bigint>, n long").schema
    timed = RowLayout(("key",), ("state", "timers", "n"), "timers")
    store = timed.open(spark, str(tmp_path / "t"), schema, 3, None)
    start = [("a", "{}", [5, 50], 1), ("b", None, [20], 1), ("c", "{}", [], 1), ("d", "{}", None, 1)]
    store.write(spark.createDataFrame(start, schema)).release()
    keys = spark.createDataFrame([("c",), ("zz",), ("c",)], "key string")

    def looked_up(version, due_at):
        found = store.lookup(keys, version, due_at)
        rows = sorted((r["key"], tuple(r["timers"] or ())) for r in found.rows.collect())
        assert (found.changed_keys, found.version) == (len(rows), version)
        found.release()
        return rows

    assert looked_up(1, None) == [("c", ())]
    assert looked_up(1, 19_999) == [("a", (5, 50)), ("c", ())]  # 20 ms is not due at 19,999 µs
    assert looked_up(1, 20_000) == [("a", (5, 50)), ("b", (20,)), ("c", ())]
    # a fired its 5 ms timer and set 60; b has none left. Its old entries go: a is due at 50 ms only by 50, not 5.
    replaced = spark.createDataFrame([("a", "{}", [50, 60], 2), ("b", "{}", [], 2)], schema)
    update = store.replace(replaced, 1)
    assert update.version == 2
    update.release()
    assert looked_up(2, 49_999) == [("c", ())]
    assert looked_up(2, 60_000) == [("a", (50, 60)), ("c", ())]
    assert sorted(r["key"] for r in store.read(2).collect()) == ["a", "b", "c", "d"]
    # Looking rows up is a whole-row store's operation: a combining store has none.
    assert not hasattr(_open(spark, tmp_path / "keyed"), "lookup")
    # Without a timers column (an interval join's held rows): lookups of the batch's keys only.
    plain = RowLayout(("key",), ("state", "timers", "n")).open(spark, str(tmp_path / "r"), schema, 2, None)
    plain.write(spark.createDataFrame(start, schema)).release()
    found = plain.lookup(keys, 1, None)
    assert [r["key"] for r in found.rows.collect()] == ["c"]
    found.release()
    plain.replace(spark.createDataFrame([("c", "x", None, 5)], schema), 1).release()
    assert sorted((r["key"], r["n"]) for r in plain.read(2).collect()) == [("a", 1), ("b", 1), ("c", 5), ("d", 1)]
    with pytest.raises(StateStoreError, match="no timers column"):
        plain.lookup(keys, 2, 10)


def _planned_rows(df) -> int | None:
    count = df._jdf.queryExecution().optimizedPlan().stats().rowCount()
    return int(str(count.get())) if count.isDefined() else None


def test_a_store_updates_rows_state_their_count_so_a_join_with_a_large_table_broadcasts_them(spark, tmp_path):
    # A live micro-batch MERGEs the changed keys into its sink. Rows without statistics count as the largest size
    # to Spark's planner: the MERGE planned a sort-merge join and shuffled the whole sink to find 2,000 keys.
    store = _open(spark, tmp_path / "store")
    store.write(_partials(spark, [("a", 2, 10, None), ("b", 1, None, None)])).release()
    update = store.update(_partials(spark, [("a", 1, 5, None), ("c", 1, 7, None), ("a", 1, 1, None)]), COMBINE, 1)
    try:
        assert _planned_rows(update.rows) == update.changed_keys == 2
        table = str(tmp_path / "table")
        spark.range(200_000).selectExpr("cast(id AS string) AS key", "id AS v").write.format("delta").save(table)
        joined = spark.read.format("delta").load(table).join(update.rows, "key")
        adaptive = spark.conf.get("spark.sql.adaptive.enabled")
        spark.conf.set("spark.sql.adaptive.enabled", "false")  # the plan from the statistics alone
        try:
            plan = joined._jdf.queryExecution().executedPlan().toString()
        finally:
            spark.conf.set("spark.sql.adaptive.enabled", adaptive)
        assert "BroadcastHashJoin" in plan and "SortMergeJoin" not in plan, plan
    finally:
        update.release()
    sessions_schema = spark.createDataFrame([], "key string, s long, e long, n long").schema
    sessions = SessionLayout(("key",), ("n",), "s", "e").open(spark, str(tmp_path / "s"), sessions_schema, 2, None)
    sessions.write(spark.createDataFrame([("a", 0, 10, 1), ("b", 0, 50, 1)], sessions_schema)).release()
    closed = sessions.update_and_close(spark.createDataFrame([], sessions_schema), ["t.n + s.n"], 1, 20)
    assert _planned_rows(closed.rows) == closed.changed_keys == 1
    closed.release()
    rows_schema = spark.createDataFrame([], "key string, state string, timers array<bigint>, n long").schema
    whole = RowLayout(("key",), ("state", "timers", "n")).open(spark, str(tmp_path / "r"), rows_schema, 2, None)
    whole.write(spark.createDataFrame([("a", "x", None, 1), ("b", "y", None, 1)], rows_schema)).release()
    found = whole.lookup(spark.createDataFrame([("b",), ("z",)], "key string"), 1, None)
    assert _planned_rows(found.rows) == found.changed_keys == 1
    found.release()


def test_an_update_puts_each_touched_key_once_and_reports_where_its_task_time_went(spark, tmp_path):
    store = _open(spark, tmp_path / "store", partitions=2)
    store.write(_partials(spark, [(f"k{i}", 1, 1, None) for i in range(50)])).release()
    # A fresh opening (a restart) loads version 1 from its snapshot: no changelog to replay.
    reopened = _open(spark, tmp_path / "store", partitions=2)
    batch = _partials(spark, [("k1", 1, 1, None)] * 4 + [("new", 1, 1, None)] * 3 + [("k2", 1, 1, None)])
    update = reopened.update(batch, COMBINE, 1)
    profile = update.profile_summary()
    update.release()
    # 8 rows of 3 keys: each key read from the store once and written once, with its newest value.
    assert (profile["tasks"], profile["gets"], profile["puts"]) == (2, 3, 3)
    assert profile["rows_ms"] >= 0 and profile["commit_ms"] >= 0 and profile["load_ms"] >= 0
    assert update.profile["rocksdbNumReplayChangelogFiles"] == 0
    assert _rows(reopened.read(2))[:3] == [("k0", 1, 1, None), ("k1", 5, 5, None), ("k10", 1, 1, None)]
    # The next opening replays version 2's changelog on top of the snapshot.
    again = _open(spark, tmp_path / "store", partitions=2).update(_partials(spark, [("new", 1, 1, None)]), COMBINE, 2)
    assert again.profile["rocksdbNumReplayChangelogFiles"] >= 1 and _rows(again.rows) == [("new", 4, 4, None)]
    again.release()


def _start_rows(spark, layout: str):
    """A layout of each kind, its schema and version-1 rows (one per key), in no particular order."""
    import random

    rnd = random.Random(7)
    keys = [f"k{rnd.randrange(10**6):06d}-{i}" for i in range(600)]
    if layout == "combined":
        schema, rows = (
            "key string, n long, total long",
            [(k, i % 5, i * 7 if i % 3 else None) for i, k in enumerate(keys)],
        )
        spec = CombinedLayout(("key",), ("n", "total"))
    elif layout == "ordered":
        schema, rows = "end long, key string, n long", [(rnd.randrange(-(2**40), 2**40), k, 1) for k in keys]
        spec = OrderedLayout(("end", "key"), ("n",), "end")
    elif layout == "sessions":
        schema = "key string, s long, e long, n long"
        rows = [(k, s, s + 10, 1) for k in keys[:300] for s in (0, 100 + rnd.randrange(1000))]
        spec = SessionLayout(("key",), ("n",), "s", "e")
    else:
        schema = "key string, state string, timers array<bigint>, n long"
        rows = [(k, "{}", sorted(rnd.sample(range(10**6), i % 3)) or None, i) for i, k in enumerate(keys)]
        spec = RowLayout(("key",), ("state", "timers", "n"), "timers")
    frame = spark.createDataFrame(rows, schema)
    return spec, frame.schema, frame.repartition(5)


@pytest.mark.parametrize("layout", ["combined", "ordered", "sessions", "rows with timers"])
def test_version_1_loaded_in_bulk_holds_what_a_put_per_row_writes(spark, tmp_path, layout):
    """Version 1 is written as sorted SST files that RocksDB ingests, not a put per row. With a 2 KiB chunk each
    task writes several files whose key ranges overlap; read back, from memory and by a new opening from the
    uploaded snapshot, the store holds exactly what puts write (every column family: a session's end index, a
    row's timers, which a lookup then finds due)."""
    spec, schema, start = _start_rows(spark, layout)
    stores = {}
    for bulk in ("true", "false"):
        spark.conf.set("spark.phases.storeBulkStart", bulk)
        spark.conf.set("spark.phases.storeBulkChunkBytes", "2048")
        try:
            store = spec.open(spark, str(tmp_path / bulk), schema, 2, None)
            written = store.write(start)
            profile = written.profile
            written.release()
        finally:
            spark.conf.unset("spark.phases.storeBulkStart")
            spark.conf.unset("spark.phases.storeBulkChunkBytes")
        if bulk == "true":
            assert profile.get("rocksdbPutCount", 0) == 0 and profile["bulkRows"] >= start.count()
            assert profile["bulkFiles"] > 2  # several files a task
        else:
            assert profile["rocksdbPutCount"] >= start.count() and "bulkRows" not in profile
        stores[bulk] = store
    expected = _rows(start)
    assert _rows(stores["true"].read(1)) == _rows(stores["false"].read(1)) == expected
    reopened = spec.open(spark, str(tmp_path / "true"), schema, 2, None)
    assert _rows(reopened.read(1)) == expected
    # The families beyond the default one were ingested too: the next update sees them.
    if layout == "sessions":
        closed = reopened.update_and_close(spark.createDataFrame([], schema), ["t.n + s.n"], 1, 10)
        assert _rows(closed.rows) == [r for r in expected if r[2] <= 10]
        closed.release()
    elif layout == "rows with timers":
        due = reopened.lookup(spark.createDataFrame([], "key string"), 1, 500_000 * 1000)
        assert sorted(r["key"] for r in due.rows.collect()) == sorted(
            r[0] for r in expected if r[2] and min(r[2]) <= 500_000
        )
        due.release()
    elif layout == "ordered":
        closed = reopened.update_and_close(spark.createDataFrame([], schema), ["t.n + s.n"], 1, 0)
        assert _rows(closed.rows) == [r for r in expected if r[0] <= 0]
        closed.release()


def test_the_internals_version_1s_bulk_load_reaches_by_reflection_are_there(spark):
    """The bulk load reaches RocksDB, the provider's encoders and the column-family prefix through members that
    have no public API: a Spark release that renames one fails here, naming it (and a backlog would fail naming
    ``spark.phases.storeBulkStart=false``, the way round)."""
    missing = list(spark._jvm.org.apache.spark.sql.phases.StartLoad.missingInternals())
    assert not missing, f"Spark {spark.version}: the state store's bulk start cannot reach {missing}"


# Keys over a three-byte alphabet share long stretches and differ late, or only in length (b"" against b"\x00"): what
# the packed prefix cannot tell apart and the whole comparison must.
_KEY_BYTES = st.tuples(
    st.sampled_from([b"", b"\x00" * 8, b"\xff" * 7, b"\x01" * 9, b"\x05" * 23]),
    st.lists(st.sampled_from([0x00, 0x01, 0xFF]), max_size=6).map(bytes),
).map(b"".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_KEY_BYTES, st.binary(max_size=12)).map(lambda b: b"\x00\x01prefix" + b), max_size=300))
def test_the_bulk_loads_order_is_rocksdbs_bytewise_order_and_stable(spark, keys):
    """Keys with a long common prefix, of every length, with duplicates: the order is unsigned bytewise and
    equal keys keep their put order (the last one put is the one written)."""
    order = list(spark._jvm.org.apache.spark.sql.phases.StartLoad.sortedOrder([bytearray(k) for k in keys]))
    assert order == sorted(range(len(keys)), key=lambda i: keys[i])


def _replayed(update) -> int:
    profile = update.profile
    update.release()
    return profile["rocksdbNumReplayChangelogFiles"]


def test_an_unloaded_store_has_uploaded_its_newest_snapshot_so_a_reopening_replays_only_what_follows(spark, tmp_path):
    """A stopped live phase unloads its store: the snapshot its commits queued (every minDeltasForSnapshot versions) is
    uploaded then, not at Spark's next maintenance (60 s by default), and a restart replays only the changelogs
    after it."""
    key = "spark.sql.streaming.stateStore.minDeltasForSnapshot"
    spark.conf.set(key, "3")
    try:
        batch = _partials(spark, [("k1", 1, 1, None), ("k2", 1, 1, None)])
        store = _open(spark, tmp_path / "store", partitions=2)
        store.write(_partials(spark, [(f"k{i}", 1, 1, None) for i in range(20)])).release()
        for version in range(1, 6):  # versions 2..6; version 4 is 3 versions after version 1's snapshot
            store.update(batch, COMBINE, version).release()
        assert store.unload() == 2
        assert store.unload() == 0  # nothing loaded any more
        zips = {f.name for p in ("0", "1") for f in (tmp_path / "store" / "0" / p).iterdir() if f.suffix == ".zip"}
        assert "4.zip" in zips
        reopened = _open(spark, tmp_path / "store", partitions=2)
        # Per partition, 5 and 6 after the snapshot of 4 (summed over the 2 partitions); 2..6 without the upload.
        assert _replayed(reopened.update(batch, COMBINE, 6)) == 4
        # The unloaded opening still works: its next update loads the store again.
        again = store.update(batch, COMBINE, 6)
        assert _rows(again.rows)[0] == ("k1", 7, 7, None)
        again.release()
    finally:
        spark.conf.unset(key)


def test_the_stores_rocksdb_block_cache_is_64_mib_unless_the_session_sets_one(spark):
    jvm = spark._jvm.org.apache.spark.sql.phases.StoreSupport
    key = "spark.sql.streaming.stateStore.rocksdb.blockCacheSizeMB"
    assert jvm.storeSession(spark._jsparkSession, False).conf().get(key) == "64"
    spark.conf.set(key, "16")
    try:
        assert jvm.storeSession(spark._jsparkSession, False).conf().get(key) == "16"
    finally:
        spark.conf.unset(key)


def test_a_version_the_store_never_wrote_is_a_state_store_error(spark, tmp_path):
    store = _open(spark, tmp_path / "store")
    store.write(_partials(spark, [("a", 1, 1, None)])).release()
    with pytest.raises(StateStoreError, match=r"could not go from version 5 to 6"):
        store.update(_partials(spark, [("a", 1, 1, None)]), COMBINE, 5)


def test_a_combine_expression_of_another_type_is_refused(spark, tmp_path):
    store = _open(spark, tmp_path / "store")
    bad = ["t.n + s.n", "CAST(t.total AS double)", "greatest(t.last, s.last)"]
    with pytest.raises(StateStoreError, match="combine expression of total is double"):
        store.update(_partials(spark, [("a", 1, 1, None)]), bad, 0)


def test_the_store_lives_in_sparks_layout_under_its_path(spark, tmp_path):
    store = _open(spark, tmp_path / "store", partitions=2)
    rows = spark.range(10).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.lit(1).cast("long").alias("n"),
        F.lit(None).cast("long").alias("total"),
        F.lit(None).cast("timestamp").alias("last"),
    )
    store.write(rows).release()
    partitions = sorted(p.name for p in (tmp_path / "store" / "0").iterdir() if p.is_dir())
    assert partitions == ["0", "1"]
    files = {f.name for f in (tmp_path / "store" / "0" / "0").iterdir()}
    # Version 1 (the handoff's whole state) is a snapshot: a load takes its files instead of replaying a put per key.
    assert "1.zip" in files and "1.changelog" not in files
    # Later versions: RocksDB with changelog checkpointing, each version a changelog file of the changed keys
    # (snapshots come from Spark's maintenance thread, in the background).
    store.update(rows.limit(3), COMBINE, 1).release()
    assert any("2.changelog" in {f.name for f in (tmp_path / "store" / "0" / p).iterdir()} for p in partitions)
    assert _rows(store.read(2)) == sorted(
        (f"k{i}", 2 if f"k{i}" in {r["key"] for r in rows.limit(3).collect()} else 1, None, None) for i in range(10)
    )


@pytest.fixture
def no_coalescing(spark):
    """Adaptive execution keeps a shuffle's partitions as they are (with a few rows it would merge them into one)."""
    key = "spark.sql.adaptive.coalescePartitions.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    yield
    spark.conf.set(key, before)


ROUTE = "spark.phases.storeRoute"


def _keyed_rows(spark, n=300):
    """Two key columns of two types, nulls among them, and the store's value columns."""
    return spark.range(n).select(
        F.when(F.col("id") % 7 == 0, None)
        .otherwise(F.concat(F.lit("k"), (F.col("id") % 50).cast("string")))
        .alias("a"),
        (F.col("id") % 3).cast("int").alias("b"),
        F.lit(1).cast("long").alias("n"),
    )


def _counts(spark, path, partitions, version):
    schema = T.StructType(
        [T.StructField("a", T.StringType()), T.StructField("b", T.IntegerType()), T.StructField("n", T.LongType())]
    )
    store = AB.open(spark, str(path), schema, partitions, None)
    return {(r["a"], r["b"]): r["n"] for r in store.read(version).collect()}


@pytest.mark.parametrize("partitions", [2, 4])
def test_rows_an_aggregation_hashed_by_the_keys_reach_the_store_without_a_shuffle_where_a_shuffle_puts_them(
    spark, tmp_path, no_coalescing, partitions
):
    """The backlog's aggregation, cached, is in `spark.sql.shuffle.partitions` hash partitions of the keys: a store
    of a divisor of that many partitions takes them as they are. Every key must be where a shuffle would put it,
    or a later update would not meet its state: an update of every key after the write finds each stored count."""
    spark.conf.set("spark.sql.shuffle.partitions", "8")
    try:
        rows = _keyed_rows(spark)
        state = rows.groupBy("a", "b").agg(F.sum("n").alias("n")).persist()
        state.count()
        schema = state.schema
        grouped = AB.open(spark, str(tmp_path / "grouped"), schema, partitions, None)
        written = grouped.write(state)
        written.release()
        assert written.route == "grouped"
        expected = {(r["a"], r["b"]): r["n"] for r in state.collect()}
        update = grouped.update(state, ["t.n + s.n"], 1)
        update.release()
        assert _counts(spark, tmp_path / "grouped", partitions, 2) == {k: 2 * n for k, n in expected.items()}
        # Other hash partitionings (cached too): the keys in another order, another column, or a count of partitions
        # that is a multiple of the store's or not; and one whose shuffle has not run (adaptive execution may still
        # merge its partitions).
        local = spark.createDataFrame(state.collect(), schema)
        others = [
            (local.repartition(8, "b", "a").persist(), "shuffled"),
            (local.repartition(8, "a").persist(), "shuffled"),
            (local.repartition(6, "a", "b").persist(), "grouped" if partitions == 2 else "shuffled"),
            (local.repartition(8, "a", "b"), "shuffled"),
        ]
        for other, route in others:
            other.count()
            path = tmp_path / f"other-{uuid.uuid4().hex}"
            update = AB.open(spark, str(path), schema, partitions, None).write(other)
            update.release()
            other.unpersist()
            assert update.route == route
            assert _counts(spark, path, partitions, 1) == expected
        state.unpersist()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")


def test_rows_in_partitions_of_another_hash_are_found_misrouted_and_shuffled(spark, tmp_path):
    """The grouped route checks every row's partition by Spark's rule: rows it must not take (forced here onto rows
    in round-robin partitions) fail the attempt, which is run again over the shuffle, and nothing is lost."""
    rows = _keyed_rows(spark).dropDuplicates(["a", "b"]).repartition(4)
    expected = {(r["a"], r["b"]): r["n"] for r in rows.collect()}
    spark.conf.set(ROUTE, "group")
    try:
        store = AB.open(spark, str(tmp_path / "store"), rows.schema, 2, None)
        update = store.write(rows)
        update.release()
    finally:
        spark.conf.unset(ROUTE)
    assert update.route == "shuffled after a misrouted row"
    assert _counts(spark, tmp_path / "store", 2, 1) == expected
    store.update(rows, ["t.n + s.n"], 1).release()
    assert _counts(spark, tmp_path / "store", 2, 2) == {k: 2 * n for k, n in expected.items()}


def test_an_unknown_store_route_is_refused_with_the_valid_ones(spark, tmp_path):
    spark.conf.set(ROUTE, "fast")
    try:
        with pytest.raises(StateStoreError, match="valid values: auto, shuffle, group"):
            _open(spark, tmp_path / "store").write(_partials(spark, [("a", 1, 1, None)]))
    finally:
        spark.conf.unset(ROUTE)


def test_a_run_keeps_the_partitions_its_store_was_written_with_and_a_new_one_takes_the_task_slots(spark, tmp_path):
    """A store's partitions are chosen once: a restart on another number of cores keeps the run's layout (else it
    would rewrite its state); a new run's store takes the session's task slots; a changed schema is a new layout."""
    schema = _partials(spark, []).schema
    root = str(tmp_path / "live")

    def live(partitions=None, schema=schema):
        return LiveStateStore(spark, root, CombinedLayout(("key",), ("n", "total", "last")), schema, partitions)

    fresh = live()
    assert fresh.partitions == new_store_partitions(spark) == 2  # the tests' session: local[2]
    written = live(partitions=5)
    written.write_start(_partials(spark, [("a", 1, 1, None)]))
    assert live().partitions == 5 and live().layout == written.layout
    wider = T.StructType([T.StructField(f.name, T.DoubleType() if f.name == "total" else f.dataType) for f in schema])
    assert live(schema=wider).partitions == 2


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["keyed", "tumbling"])
def test_kill_9_during_the_backlogs_store_write_then_a_rerun_and_the_live_phase_equal_the_reference(
    spark, tmp_path, kind
):
    """The backlog process dies after the store's partitions committed version 1 and before the store is marked
    whole and the manifest written. The next backlog (taking the dead holder's lease over) removes the dead
    run's folder, writes its own; the live phase then equals the reference (keys; windows, open ones handed over)."""
    import os
    import subprocess
    import sys

    from phases._internal.backlog.runner import BacklogRunner
    from phases._internal.coordination import leases
    from phases._internal.live.runner import LiveRunner
    from tests.helpers import append_version, write_source
    from tests.phases.live.test_live_splits import _assert_sink, _expected, _pipeline

    second = 1_000_000
    source = str(tmp_path / "source")
    backlog = {1: [("a", 100 * second, 1), ("b", 90 * second, 2)]}
    write_source(spark, source, backlog)
    p = _pipeline(kind, source, str(tmp_path / "run"))
    child = subprocess.run(
        [sys.executable, "-m", "tests.phases.backlog.backlog_child", p.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    dead_runs = os.listdir(tmp_path / "run" / "live")
    assert len(dead_runs) == 1 and not (tmp_path / "run" / "manifests").exists()
    with pytest.raises(leases.LeaseHeld, match="take_over=True"):
        BacklogRunner(spark, p).run()
    handoff = BacklogRunner(spark, p, take_over=True).run()
    assert os.listdir(tmp_path / "run" / "live") == [handoff.manifest_id]  # the dead run's folder is gone
    live_versions = {2: [("a", 110 * second, 3), ("c", 120 * second, 4)], 3: [("b", 200 * second, 5)]}
    for v in sorted(live_versions):
        append_version(spark, source, live_versions[v])
    LiveRunner.from_manifest(spark, p).start(available_now=True)
    _assert_sink(spark, kind, p, _expected(kind, {**backlog, **live_versions}))
