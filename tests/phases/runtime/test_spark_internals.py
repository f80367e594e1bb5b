"""Pins every function of :mod:`phases._internal.spark_internals` (the engine's one home for Spark's and Delta's
internals) against a real session and real files: when a Spark or Delta release changes one of them, a test here names
it. The checkpoint parsers are also fed changed files, to show that a changed format is refused by name rather than
misread."""

from __future__ import annotations

import uuid

import pytest
from pyspark.sql import Observation
from pyspark.sql import functions as F

from phases._internal import spark_internals as si
from phases._internal.errors import SparkInternalsChanged
from tests.helpers import append_version, create_source, produce


def _noop_query(spark, stream, checkpoint: str) -> None:
    query = stream.writeStream.foreachBatch(lambda df, _id: None).option("checkpointLocation", checkpoint).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def test_the_offset_and_commit_logs_of_a_delta_source_are_read_as_the_engine_reads_them(spark, tmp_path):
    source, checkpoint = str(tmp_path / "src"), str(tmp_path / "checkpoint")
    create_source(spark, source)
    append_version(spark, source, [("a", 1, 1)])
    append_version(spark, source, [("b", 2, 2)])
    stream = spark.readStream.format("delta").option("readChangeFeed", "true").option("startingVersion", 1)
    _noop_query(spark, stream.load(source), checkpoint)

    assert si.checkpoint_batch_ids(spark, checkpoint, si.OFFSETS) == [0]
    assert si.checkpoint_batch_ids(spark, checkpoint, si.COMMITS) == [0]
    entry = si.read_offset_log(spark, checkpoint, 0)
    assert "batchWatermarkMs" in entry.metadata
    [offset] = entry.delta_offsets()
    table_id = spark.sql(f"DESCRIBE DETAIL delta.`{source}`").first()["id"]
    assert offset.table_id == table_id
    assert offset.reservoir_version == 3 and offset.index == -1  # every version below 3 read whole
    assert "nextBatchWatermarkMs" in si.read_commit_log(spark, checkpoint, 0)

    removed = si.remove_commit(spark, checkpoint, 0)
    assert removed.endswith("/commits/0")
    assert si.checkpoint_batch_ids(spark, checkpoint, si.COMMITS) == []
    assert si.checkpoint_batch_ids(spark, str(tmp_path / "nothing"), si.OFFSETS) == []


@pytest.mark.slow
def test_the_offset_log_of_a_kafka_source_names_each_partitions_end_offset(spark, kafka, tmp_path):
    topic = f"internals-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    produce(kafka.bootstrap_servers, topic, [(0, b"x"), (0, b"y"), (1, b"z")])
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    checkpoint = str(tmp_path / "checkpoint")
    _noop_query(spark, stream, checkpoint)
    entry = si.read_offset_log(spark, checkpoint, si.checkpoint_batch_ids(spark, checkpoint, si.OFFSETS)[-1])
    assert entry.kafka_offsets(topic) == {0: 2, 1: 1}
    assert entry.kafka_offsets("another-topic") is None and entry.delta_offsets() == []


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('v2\n{"batchWatermarkMs":0}\n{"reservoirId":"t","reservoirVersion":3,"index":-1}', "starts with 'v2'"),
        ('v1\n{"batchWatermarkMs":0}\nnot json', "not JSON"),
        ('v1\n["metadata as a list"]', "not the offset log"),
        ("", "(nothing)"),
    ],
)
def test_a_changed_offset_log_format_is_refused_by_name(text, named):
    with pytest.raises(SparkInternalsChanged, match=named.replace("(", r"\(").replace(")", r"\)")):
        si.parse_offset_log(text, "offsets/7")


def test_a_delta_offset_without_a_field_the_engine_reads_is_refused_by_name():
    entry = si.parse_offset_log('v1\n{"batchWatermarkMs":0}\n{"reservoirVersion":3,"index":-1}\n-', "offsets/7")
    assert entry.sources[1] is None  # "-": a source with no offset yet
    with pytest.raises(SparkInternalsChanged, match=r"without \['reservoirId'\]"):
        entry.delta_offsets()


@pytest.mark.parametrize("text", ['v2\n{"nextBatchWatermarkMs":0}', "v1", 'v1\n{"nextBatch'])
def test_a_changed_commit_log_format_is_refused_by_name(text):
    with pytest.raises(SparkInternalsChanged, match="commit log"):
        si.parse_commit_log(text, "commits/7")


def test_the_session_handles_and_the_sql_internals(spark, tmp_path):
    assert si.jvm(spark).java.lang.Runtime.getRuntime().availableProcessors() >= 1
    assert si.java_session(spark).version() == spark.version
    frame = spark.range(3)
    assert si.frame_of(si.java_frame(frame), spark).count() == 3
    assert si.hadoop_configuration(spark).get("fs.defaultFS") is not None
    fs, path = si.hadoop_path(spark, str(tmp_path / "f.txt"))
    (tmp_path / "f.txt").write_text("one\ntwo\n")
    assert fs.exists(path) and si.read_hadoop_text(spark, str(tmp_path / "f.txt")) == "one\ntwo"
    assert si.read_text(spark, f"file:{tmp_path / 'f.txt'}") == "one\ntwo"  # a URI: through Hadoop
    si.set_logger_level(spark, "phases.pinned.logger", "FATAL")
    si.parse_sql_expression(spark, "(acc + x)")
    from pyspark.errors import ParseException

    with pytest.raises(ParseException):
        si.parse_sql_expression(spark, "(acc +* x)")
    assert si.analysed_root_node(frame.groupBy().count()) == "Aggregate"
    assert si.analysed_root_node(frame.select("id")) == "Project"
    # A Column through the JVM and back (the Protobuf helper's expressions), and a Java list of byte arrays.
    doubled = si.column_of(si.java_column(F.col("id") * 2))
    assert [r[0] for r in frame.select(doubled).collect()] == [0, 2, 4]
    listed = si.java_list(spark, [bytearray(b"ab"), 7, "x"])
    assert listed.size() == 3 and bytes(listed.get(0)) == b"ab" and listed.get(1) == 7 and listed.get(2) == "x"


def test_a_local_copy_holds_the_rows_and_reads_nothing(spark, tmp_path):
    """The held-back rows a live micro-batch keeps for the next one: every column type the engine carries, nulls
    included, equal after the copy; the copy's plan is a local relation (no scan, so no Delta file listing)."""
    source = str(tmp_path / "src")
    create_source(spark, source)
    append_version(spark, source, [("a", 1, 1), ("b", 2, None), (None, 3, 3)])
    frame = spark.read.format("delta").load(source).withColumn("n", F.struct(F.col("value").alias("v"), F.lit(1.5)))
    copy = si.local_copy(frame, 3)
    assert copy is not None and sorted(copy.collect(), key=repr) == sorted(frame.collect(), key=repr)
    assert copy.schema == frame.schema
    assert si.analysed_root_node(copy) == "LocalRelation"
    assert si.local_copy(frame, 2) is None  # more rows than asked for


def test_an_observation_tells_whether_its_node_reported(spark):
    seen = Observation("pinned")
    frame = spark.range(5).observe(seen, F.count(F.lit(1)).alias("n"))
    frame.collect()
    assert si.observation_has_row(seen) and seen.get["n"] == 5
    # Adaptive execution drops a subtree it finds empty, and the observed node with it.
    empty = Observation("pinned-empty")
    joined = spark.range(5).filter("id < 0").observe(empty, F.count(F.lit(1)).alias("n")).join(spark.range(5), "id")
    joined.collect()
    assert isinstance(si.observation_has_row(empty), bool)


def test_the_status_store_shows_stages_with_their_fields(spark):
    group = f"pinned-{uuid.uuid4().hex[:8]}"
    spark.sparkContext.setJobGroup(group, "phases: pinned stage")
    try:
        spark.range(1000).repartition(2).count()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        spark.sparkContext.setJobDescription(None)
    tracker = spark.sparkContext.statusTracker()
    stage_ids = [s for job in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(job).stageIds]
    stages = [found for found in (si.stage_attempt(spark, s) for s in stage_ids) if found is not None]
    assert stages, f"no stage of the job group {group} in the status store (stage ids {stage_ids})"
    assert all(stage.status in ("COMPLETE", "SKIPPED") and stage.name for stage in stages), stages
    ran = [stage for stage in stages if stage.status == "COMPLETE"]
    assert ran and all(s.description == "phases: pinned stage" for s in ran), ran
    assert all(s.tasks_done == s.tasks_total > 0 and s.submitted_ms is not None for s in ran), ran
    assert all(isinstance(stage, si.StageView) for stage in si.active_stages(spark))
    assert si.stage_attempt(spark, 10**9) is None


def test_the_scheduler_counts_every_job_it_submits(spark):
    before = si.jobs_submitted(spark)
    spark.range(10).collect()  # one job
    spark.range(1000).repartition(2).count()  # adaptive execution: a job per stage
    between = si.jobs_submitted(spark)
    assert between - before >= 2, (before, between)
    spark.range(10).collect()
    assert si.jobs_submitted(spark) == between + 1


def test_the_scheduler_counts_every_stage_it_creates(spark):
    before = si.stages_submitted(spark)
    spark.range(1000).repartition(2).count()  # a shuffle: at least two stages
    assert si.stages_submitted(spark) - before >= 2
    assert si.stage_attempt(spark, before) is not None  # the ids the count hands out are the store's stage ids


def test_the_codegen_count_grows_by_a_compiled_class_and_not_by_a_cached_one(spark):
    query = f"id * {uuid.uuid4().int % 100_000 + 11} + 7 AS x"  # a constant of its own: a class not compiled yet
    mode = "spark.sql.codegen.factoryMode"
    suites = spark.conf.get(mode, None)  # the suite's JVM interprets (tests/conftest.py); the product generates code
    try:
        spark.conf.set(mode, "NO_CODEGEN")  # interpreted: whole-stage code generation is off too, nothing compiles
        before = si.codegen_compilations(spark)
        spark.range(3).selectExpr(f"id * {uuid.uuid4().int % 100_000 + 11} + 5 AS x").collect()
        assert si.codegen_compilations(spark) == before
        spark.conf.set(mode, "FALLBACK")
        before = si.codegen_compilations(spark)
        spark.range(3).selectExpr(query).collect()
        compiled = si.codegen_compilations(spark)
        assert compiled > before
        spark.range(3).selectExpr(query).collect()
        assert si.codegen_compilations(spark) == compiled, "the same query compiled again: the codegen cache missed"
    finally:
        if suites is None:
            spark.conf.unset(mode)
        else:
            spark.conf.set(mode, suites)


def test_the_processes_the_jvm_starts_are_recorded(spark, tmp_path):
    jvm = si.jvm(spark)
    command = spark.sparkContext._gateway.new_array(jvm.java.lang.String, 1)
    command[0] = "true"
    with si.processes_started(spark, tmp_path) as commands:
        jvm.java.lang.ProcessBuilder(command).start().waitFor()
    assert commands == ["true"]


def test_delta_transactions_and_log_checkpoint(spark, tmp_path):
    path = str(tmp_path / "t")
    for version in (0, 3):
        spark.range(2).write.format("delta").mode("append").option("txnAppId", "app").option(
            "txnVersion", version
        ).save(path)
    assert si.delta_transactions(spark, path, ["app", "other"]) == {"app": 3}
    si.checkpoint_delta_log(spark, path)
    assert (tmp_path / "t" / "_delta_log" / "00000000000000000001.checkpoint.parquet").exists()


def test_an_arrow_batch_to_python_is_bounded_by_rows_alone_unless_a_byte_limit_is_set(spark):
    """The engine's session sets ``maxBytesPerBatch`` to Int.MaxValue, the one value at which Spark 4.2 skips its
    measure of the batch after every row (``BatchedPythonArrowInput``): batches of ``maxRecordsPerBatch`` rows however
    large they are. A byte limit that Spark still honours splits the same rows, so a release that changes the meaning
    of that value (or drops the setting) fails here."""
    from phases._internal.runtime.session import ARROW_BATCH_BYTES, NO_BYTE_LIMIT

    assert spark.conf.get(ARROW_BATCH_BYTES) in (str(NO_BYTE_LIMIT), f"{NO_BYTE_LIMIT}b")
    frame = spark.range(0, 4_000, 1, 1).select(
        "id", F.repeat(F.lit("x"), 1_000).alias("text"), F.array("id").alias("a")
    )

    def sizes(batches):
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"rows": [batch.num_rows]})

    def batch_rows() -> list[int]:
        return [r.rows for r in frame.mapInArrow(sizes, "rows long").collect()]

    records = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(records)
    spark.conf.set(records, "4000")
    try:
        assert batch_rows() == [4_000]  # 4 MB in one batch: no byte limit
        spark.conf.set(ARROW_BATCH_BYTES, str(1 << 20))
        limited = batch_rows()
        assert len(limited) > 1 and sum(limited) == 4_000, limited  # a 1 MiB limit splits them
    finally:
        spark.conf.set(records, before)
        spark.conf.set(ARROW_BATCH_BYTES, str(NO_BYTE_LIMIT))


def _yarn_defaults(conf) -> list[str]:
    """The keys of Hadoop configuration ``conf`` whose value came from YARN's defaults file."""
    return [e.getKey() for e in _entries(conf) if _source(conf, e.getKey()) == "yarn-default.xml"]


def test_the_sessions_hadoop_configuration_holds_no_yarn_defaults_and_every_other_value(spark):
    """Spark's context registers yarn-default.xml with every Hadoop configuration; the session drops those keys (they
    are serialized into every scan and write task) and keeps every other property's value, in the configurations
    Spark SQL and Delta derive from it too."""
    from phases._internal.runtime.session import drop_yarn_defaults

    jvm = spark.sparkContext._jvm
    session_conf = spark.sparkContext._jsc.hadoopConfiguration()
    loaded = jvm.org.apache.hadoop.conf.Configuration()  # every registered default resource, as Spark loads them
    yarn = _yarn_defaults(loaded)
    assert len(yarn) > 400 and all(k.startswith("yarn.") for k in yarn), len(yarn)
    assert _yarn_defaults(session_conf) == []
    assert _yarn_defaults(spark._jsparkSession.sessionState().newHadoopConf()) == []
    assert session_conf.size() < loaded.size() - 400, (session_conf.size(), loaded.size())
    # Hadoop's and MapReduce's defaults stay, every one with its value unless Spark or the session set it.
    defaults = {"core-default.xml", "mapred-default.xml"}
    kept = {e.getKey(): e.getValue() for e in _entries(loaded) if _source(loaded, e.getKey()) in defaults}
    assert len(kept) > 400 and "mapreduce.job.maps" in kept, len(kept)
    assert all(session_conf.getRaw(k) is not None for k in kept)
    same_source = {k: v for k, v in kept.items() if _source(session_conf, k) in defaults}
    assert len(same_source) > 400 and {k: session_conf.getRaw(k) for k in same_source} == same_source
    assert drop_yarn_defaults(spark) == 0  # nothing left to drop
    # The helper on a configuration of its own: it drops exactly YARN's defaults and changes no other value.
    before = {e.getKey(): e.getValue() for e in _entries(loaded)}
    assert jvm.org.apache.spark.sql.phases.HadoopDefaults.dropYarnDefaults(loaded) == len(yarn)
    after = {e.getKey(): e.getValue() for e in _entries(loaded)}
    assert after == {k: v for k, v in before.items() if k not in set(yarn)}


def _source(conf, key: str) -> str | None:
    sources = conf.getPropertySources(key)
    return sources[0] if sources else None


def _entries(conf) -> list:
    out, it = [], conf.iterator()
    while it.hasNext():
        out.append(it.next())
    return out


def test_an_empty_frame_made_in_the_jvm_has_the_schema_and_no_rows(spark):
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("key", T.StringType(), False),
            T.StructField("at", T.TimestampType(), True),
            T.StructField("values", T.ArrayType(T.LongType()), True),
            T.StructField("inner", T.StructType([T.StructField("x", T.DoubleType())]), True),
        ]
    )
    empty = si.empty_frame(spark, schema)
    assert empty.schema == schema
    assert empty.collect() == []
    assert empty.union(spark.createDataFrame([("a", None, [1], (0.5,))], schema)).count() == 1
