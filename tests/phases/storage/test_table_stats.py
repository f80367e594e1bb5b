"""A Delta table's head version read from its log with delta-rs, no JVM: what the switch sensor probes every
few seconds. Tables here are written by delta-rs itself, so these tests run in ``make test-fast``."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from phases._internal.errors import SourceError
from phases._internal.sources.lag import delta_lag
from phases._internal.storage import table_stats


def _append(path: str, n: int) -> None:
    write_deltalake(path, pa.table({"key": [f"k{i}" for i in range(n)], "value": list(range(n))}), mode="append")


def test_head_version_follows_each_commit_and_is_none_without_a_table(tmp_path):
    path = str(tmp_path / "source")
    assert table_stats.head_version(path) is None  # nothing there
    (tmp_path / "source").mkdir()
    assert table_stats.head_version(path) is None  # a folder, no log
    for expected in range(3):
        _append(path, 2)
        assert table_stats.head_version(path) == expected
        assert table_stats.head_version(f"file:{path}") == expected  # a file: URI names the same table
        assert table_stats.head_version(f"file://{path}") == expected


def test_the_sensor_lag_counts_versions_after_the_handoff_and_names_an_unreadable_log(tmp_path):
    path = str(tmp_path / "source")
    for _ in range(4):
        _append(path, 1)
    lag = delta_lag("source", path, handoff_version=1, watermark_us=None)
    assert (lag.behind, lag.error) == (2, None)
    (tmp_path / "source" / "_delta_log" / "00000000000000000004.json").write_text("not json\n")
    with pytest.raises(SourceError, match="cannot read the Delta log"):
        table_stats.head_version(path)
    broken = delta_lag("source", path, handoff_version=1, watermark_us=None)
    assert broken.behind is None and "cannot read the Delta log" in broken.error
    missing = delta_lag("source", str(tmp_path / "gone"), handoff_version=1, watermark_us=None)
    assert missing.behind is None and "no Delta log" in missing.error


def test_a_log_delta_rs_cannot_read_makes_the_backlog_scan_instead_and_says_so(tmp_path):
    from phases._internal.sources import version_bounds

    path = str(tmp_path / "source")
    for _ in range(3):
        _append(path, 1)
    (tmp_path / "source" / "_delta_log" / "00000000000000000002.json").write_text("not json\n")
    with pytest.warns(UserWarning, match="cannot read the Delta log.*scan instead"):
        assert version_bounds.read(f"file:{path}", 0, 2, "ts", ["key"]) is None


def test_the_version_that_added_a_data_file_is_found_in_the_log(tmp_path):
    from deltalake import DeltaTable

    path = str(tmp_path / "source")
    added = {}
    for version in range(4):
        _append(path, 2)
        before = set().union(*added.values()) if added else set()
        names = {f.rsplit("/", 1)[-1] for f in DeltaTable(path).file_uris()}
        added[version] = names - before
    [one] = added[2]
    assert table_stats.version_adding(path, one, 0, 3) == 2
    assert table_stats.version_adding(path, one, 1, 2) == 2
    assert table_stats.version_adding(path, one, 3, 3) is None  # added before the range
    [first] = added[0]
    assert table_stats.version_adding(f"file://{path}", first, 0, 3) == 0
    assert table_stats.version_adding(path, "no-such-file.parquet", 0, 3) is None
