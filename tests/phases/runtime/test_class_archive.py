"""The setup's JVM class archive (:mod:`phases._internal.runtime.class_archive`): a local session's driver maps it (a
JVM told to start only with it, ``-Xshare:on``, fails otherwise: this pins HotSpot's dynamic archive and the class path
the archive was written for), its name follows the jars, and the setup keeps a current one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from phases._internal.runtime import class_archive, jvm_deps
from phases.setup import build_class_archive

MAPPED = """
from phases._internal.runtime.session import SparkSettings, build_session
spark = build_session(SparkSettings(shuffle_partitions=2, extra_conf={"spark.driver.extraJavaOptions": "-Xshare:on"}))
print("rows", spark.range(5).count())
"""


@pytest.mark.spark
def test_a_local_session_starts_from_the_setups_archive():
    path = class_archive.archive_path()
    assert path is not None and path.is_file(), f"no class archive at {path}: the setup step builds it"
    assert class_archive.java_options() == f"-XX:SharedArchiveFile={path} {class_archive.QUIET}"
    child = subprocess.run([sys.executable, "-c", MAPPED], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0 and "rows 5" in child.stdout, child.stderr[-3000:]
    # The JVM's own archive lines are off: nothing about it reaches the program's output.
    assert "cds" not in child.stdout.lower() and "shared archive" not in (child.stdout + child.stderr).lower()


@pytest.mark.spark
def test_a_current_archive_is_kept_and_a_changed_jar_names_another(tmp_path):
    path = class_archive.archive_path()
    assert path is not None and path.is_file()
    before = path.stat().st_mtime_ns
    assert build_class_archive() == path and path.stat().st_mtime_ns == before

    # A copy of the jar cache names the same jars (by path, size and time) elsewhere: another archive, not built yet.
    jar_dir = tmp_path / "jars"
    shutil.copytree(
        jvm_deps.DEFAULT_JAR_DIR, jar_dir, ignore=shutil.ignore_patterns(class_archive.FOLDER, "s3a", "kafka-broker")
    )
    other = class_archive.archive_path(jar_dir)
    assert other is not None and other != path and other.parent == jar_dir / class_archive.FOLDER
    assert class_archive.java_options(jar_dir) == ""
    helper = jar_dir / "helper" / jvm_deps.HELPER_JAR
    os.utime(helper, ns=(helper.stat().st_atime_ns, helper.stat().st_mtime_ns + 1))
    assert class_archive.archive_path(jar_dir) not in (other, path)


def test_without_the_setups_jars_there_is_no_archive(tmp_path):
    assert class_archive.archive_path(tmp_path / "empty") is None
    assert class_archive.java_options(tmp_path / "empty") == ""
