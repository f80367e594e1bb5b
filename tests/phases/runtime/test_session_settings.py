"""The session's settings that follow from where it runs (no JVM started)."""

from __future__ import annotations

from phases._internal.runtime.session import SparkSettings, snapshot_partitions


def test_delta_replays_a_tables_log_in_one_task_per_core_locally_and_one_per_shuffle_partition_on_a_cluster():
    assert snapshot_partitions(SparkSettings(master="local[2]", shuffle_partitions=8)) == 2
    assert snapshot_partitions(SparkSettings(master="local[6,3]", shuffle_partitions=8)) == 6
    assert snapshot_partitions(SparkSettings(master="spark://127.0.0.1:7077", shuffle_partitions=16)) == 16
    # At least 2 tasks, whatever the master.
    assert snapshot_partitions(SparkSettings(master="local", shuffle_partitions=1)) == 2
