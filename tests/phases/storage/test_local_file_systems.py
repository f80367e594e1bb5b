"""The helper's local file systems (``LocalFileSystems.scala``), which a local session uses for ``file:`` paths: the
same answers as Hadoop's own ``LocalFileSystem`` and ``LocalFs``, without starting a ``chmod`` or ``readlink``
process per file. Pins the Hadoop behaviour they rely on: if a Hadoop release moves the permission or link-status
call elsewhere, the process count here is no longer zero."""

from __future__ import annotations

import os
import stat

import pytest

from phases._internal import spark_internals as si
from phases._internal.runtime.session import (
    HADOOP_FILE_CONTEXT_FS,
    HADOOP_FILE_SYSTEM,
    LOCAL_FILE_CONTEXT_FS,
    LOCAL_FILE_SYSTEM,
)
from tests.helpers import append_version, create_source

SHELL_COMMANDS = {"chmod", "readlink", "stat", "ls"}


def _file_systems(spark, file_system: str, file_context_fs: str):
    """(FileSystem, FileContext) for ``file:`` with the given classes, uncached."""
    jvm = si.jvm(spark)
    conf = jvm.org.apache.hadoop.conf.Configuration(si.hadoop_configuration(spark))
    conf.set("fs.file.impl", file_system)
    conf.set("fs.AbstractFileSystem.file.impl", file_context_fs)
    uri = jvm.java.net.URI("file:///")
    return jvm.org.apache.hadoop.fs.FileSystem.newInstance(
        uri, conf
    ), jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf)


def _processes_started(spark, tmp_path, work) -> list[str]:
    with si.processes_started(spark, tmp_path) as commands:
        work()
    return commands


def _shell(commands: list[str]) -> list[str]:
    return [c for c in commands if c.split(" ", 1)[0] in SHELL_COMMANDS]


def test_a_local_session_opens_file_paths_with_the_helpers_file_systems(spark):
    jvm = si.jvm(spark)
    conf, uri = si.hadoop_configuration(spark), jvm.java.net.URI("file:///")
    assert jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf).getClass().getName() == LOCAL_FILE_SYSTEM
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf)
    assert context.getDefaultFileSystem().getClass().getName() == LOCAL_FILE_CONTEXT_FS


def test_writing_a_file_and_renaming_it_into_place_starts_no_process_where_hadoops_own_start_several(spark, tmp_path):
    """What Spark's checkpoint files and Delta's commits do: create a temporary file with a permission through
    FileContext, rename it into place without overwrite; and a data file through FileSystem."""
    jvm = si.jvm(spark)
    create_flags = jvm.java.util.EnumSet.of(jvm.org.apache.hadoop.fs.CreateFlag.CREATE)
    no_options = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.CreateOpts, 0)
    no_rename = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
    no_rename[0] = jvm.org.apache.hadoop.fs.Options.Rename.NONE

    def write(classes: tuple[str, str], folder: str):
        fs, context = _file_systems(spark, *classes)
        base = tmp_path / folder
        base.mkdir()

        def work():
            tmp = jvm.org.apache.hadoop.fs.Path(f"file://{base}/.0.json.tmp")
            out = context.create(tmp, create_flags, no_options)
            out.write(b"{}")
            out.close()
            context.rename(tmp, jvm.org.apache.hadoop.fs.Path(f"file://{base}/0.json"), no_rename)
            data = fs.create(jvm.org.apache.hadoop.fs.Path(f"file://{base}/part-0.parquet"), True)
            data.close()

        return _processes_started(spark, tmp_path, work)

    hadoops = _shell(write((HADOOP_FILE_SYSTEM, HADOOP_FILE_CONTEXT_FS), "hadoop"))
    ours = _shell(write((LOCAL_FILE_SYSTEM, LOCAL_FILE_CONTEXT_FS), "helper"))
    assert len(hadoops) >= 3, f"Hadoop's own classes started {hadoops}: the recording sees no process any more"
    assert ours == [], f"the helper's file systems started {ours}"
    for folder in ("hadoop", "helper"):
        names = sorted(os.listdir(tmp_path / folder))
        assert names == [".0.json.crc", ".part-0.parquet.crc", "0.json", "part-0.parquet"], names
        assert stat.S_IMODE(os.stat(tmp_path / folder / "part-0.parquet").st_mode) == 0o644  # 0666 less the umask


def test_a_delta_commit_and_a_streaming_checkpoint_start_no_shell_process(spark, tmp_path):
    source, checkpoint = str(tmp_path / "source"), str(tmp_path / "checkpoint")
    create_source(spark, source)

    def work():
        append_version(spark, source, [("a", 1, 1)])
        stream = spark.readStream.format("delta").load(source)
        query = stream.writeStream.foreachBatch(lambda df, _id: None).option("checkpointLocation", checkpoint).start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    started = _processes_started(spark, tmp_path, work)
    assert os.path.exists(f"{checkpoint}/commits/0") and os.path.exists(
        f"{source}/_delta_log/00000000000000000001.json"
    )
    assert _shell(started) == [], started


def test_the_helpers_file_systems_answer_as_hadoops_own(spark, tmp_path):
    """Permissions, link status of a file, a folder, a symbolic link and a missing path; a rename onto an existing
    file without overwrite is refused (Delta's commits rely on it)."""
    jvm = si.jvm(spark)
    fs_path = jvm.org.apache.hadoop.fs.Path
    perm = jvm.org.apache.hadoop.fs.permission.FsPermission
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "file")
    no_rename = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
    no_rename[0] = jvm.org.apache.hadoop.fs.Options.Rename.NONE

    def answers(classes: tuple[str, str], tag: str) -> dict:
        fs, context = _file_systems(spark, *classes)
        seen = {}
        # Qualified (as Spark and Delta pass them) and plain: Hadoop reads a link only of a plain path.
        for name in ("file", "folder", "link"):
            for prefix in ("file://", ""):
                status = context.getFileLinkStatus(fs_path(f"{prefix}{tmp_path}/{name}"))
                link = str(status.getSymlink()) if status.isSymlink() else None
                seen[prefix + name] = (status.isFile(), status.isDirectory(), status.isSymlink(), link, status.getLen())
                status = fs.getFileLinkStatus(fs_path(f"{prefix}{tmp_path}/{name}"))
                seen[f"fs {prefix}{name}"] = (
                    status.isFile(),
                    status.isDirectory(),
                    status.isSymlink(),
                    status.getLen(),
                )
        with pytest.raises(Exception, match="FileNotFoundException"):
            context.getFileLinkStatus(fs_path(f"file://{tmp_path}/missing"))
        target = tmp_path / f"perm-{tag}"
        for mode in (0o640, 0o755, 0o600, 0o1777):
            fs.create(fs_path(f"file://{target}"), True).close()
            fs.setPermission(fs_path(f"file://{target}"), perm.createImmutable(mode))
            seen[f"mode {mode:o}"] = oct(stat.S_IMODE(os.stat(target).st_mode))
        folder = tmp_path / f"made-{tag}"
        assert fs.mkdirs(fs_path(f"file://{folder}"), perm.createImmutable(0o750))
        seen["mkdirs"] = oct(stat.S_IMODE(os.stat(folder).st_mode))
        (tmp_path / f"from-{tag}").write_text("y")
        with pytest.raises(Exception, match="FileAlreadyExistsException"):
            context.rename(fs_path(f"file://{tmp_path}/from-{tag}"), fs_path(f"file://{tmp_path}/file"), no_rename)
        assert (tmp_path / "file").read_text() == "x"
        return seen

    hadoops = answers((HADOOP_FILE_SYSTEM, HADOOP_FILE_CONTEXT_FS), "hadoop")
    ours = answers((LOCAL_FILE_SYSTEM, LOCAL_FILE_CONTEXT_FS), "helper")
    assert ours == hadoops
    assert hadoops["link"][2] and not hadoops["file://link"][2], hadoops  # a plain path's link is seen as one
    assert hadoops["mode 640"] == "0o640" and hadoops["mode 1777"] == "0o1777" and hadoops["file"][0], hadoops


def test_a_local_glob_matched_by_the_os_answers_as_hadoops_glob_status(spark, tmp_path):
    """``fs.has_files`` matches a plain path's last name in its folder without the JVM: the same answer as Hadoop's
    ``globStatus`` for the names it takes (dot-files, folders and a missing folder included)."""
    from phases._internal.storage import fs

    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    (log / ".00001.json.tmp").write_text("")
    (log / "00000.crc").write_text("")
    patterns = [f"{log}/*.json", f"{log}/*.crc", f"{log}/0000?.crc", f"{tmp_path}/missing/*.json", f"{tmp_path}/*"]
    (tmp_path / "t" / "x.json").mkdir()
    patterns += [f"{tmp_path}/t/*.json", f"{log}/.*.tmp"]

    def hadoop(pattern: str) -> bool:
        found = si.hadoop_path(spark, pattern)[0].globStatus(si.hadoop_path(spark, pattern)[1])
        return found is not None and len(found) > 0

    answers = [(p, fs.has_files(spark, p), hadoop(p)) for p in patterns]
    assert [(p, ours) for p, ours, _ in answers] == [(p, theirs) for p, _, theirs in answers]
    assert [ours for _, ours, _ in answers] == [False, True, True, False, True, True, True]
