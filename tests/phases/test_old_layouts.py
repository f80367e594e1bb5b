"""What earlier releases left on disk is still read (:mod:`phases.storage.old_layouts`), until the module's removal
date."""

from __future__ import annotations

from datetime import date

from phases.storage import old_layouts, progress_log


def test_the_old_layouts_module_is_removed_by_its_date():
    assert date.today() <= old_layouts.REMOVE_AFTER, (
        f"phases/storage/old_layouts.py was to be removed after {old_layouts.REMOVE_AFTER}: delete it and its callers "
        "(grep old_layouts), and this test"
    )


def test_a_run_with_its_progress_in_a_delta_table_has_started_and_resumes_from_the_last_row(spark, tmp_path):
    run = str(tmp_path / "live" / "run1")
    assert not progress_log.live_started(spark, run)
    assert old_layouts.progress_table_record(spark, run) is None
    rows = [(-1, 3, None, None, None), (0, 5, 1_000_000, None, None)]
    schema = "batch_id long, complete_below long, running_max_us long, closed_us long, held_version long"
    spark.createDataFrame(rows, schema).write.format("delta").save(f"{run}/{old_layouts.PROGRESS_TABLE}")
    assert progress_log.live_started(spark, run)
    record = old_layouts.progress_table_record(spark, run)
    assert record["batch_id"] == 0 and record["complete_below"] == 5 and record["running_max_us"] == 1_000_000


def test_a_two_query_run_has_started_once_its_operator_query_committed(spark, tmp_path):
    checkpoints = tmp_path / "checkpoints" / "run1"
    assert not old_layouts.two_query_run_started(spark, str(checkpoints))
    (checkpoints / old_layouts.TWO_QUERY_OPERATOR / "commits").mkdir(parents=True)
    (checkpoints / old_layouts.TWO_QUERY_OPERATOR / "commits" / "0").write_text("v1\n{}\n")
    assert old_layouts.two_query_run_started(spark, str(checkpoints))


def test_a_quarantine_table_of_an_earlier_release_gets_the_columns_it_lacks(spark, tmp_path):
    from phases.storage import quarantine

    path = str(tmp_path / "quarantine")
    old = [f for f in quarantine.SCHEMA.fields if not f.name.startswith("kafka_")]
    spark.createDataFrame(
        [], "struct<" + ",".join(f"`{f.name}`:{f.dataType.simpleString()}" for f in old) + ">"
    ).write.format("delta").save(path)
    quarantine.ensure(spark, path)
    assert sorted(spark.read.format("delta").load(path).columns) == sorted(f.name for f in quarantine.SCHEMA.fields)
