"""File-system checks through Hadoop's FileSystem, so that any URI Spark can write to works."""

from __future__ import annotations

from pyspark.sql import SparkSession


def _fs_path(spark: SparkSession, path: str):
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    return p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), p


def exists(spark: SparkSession, path: str) -> bool:
    fs, p = _fs_path(spark, path)
    return bool(fs.exists(p))


def delete(spark: SparkSession, path: str) -> None:
    fs, p = _fs_path(spark, path)
    if fs.exists(p):
        fs.delete(p, True)


def has_files(spark: SparkSession, pattern: str) -> bool:
    """True when the glob ``pattern`` matches at least one file."""
    fs, p = _fs_path(spark, pattern)
    found = fs.globStatus(p)
    return found is not None and len(found) > 0


def read_text(spark: SparkSession, path: str) -> str:
    """The whole text file at ``path`` (local paths directly, other URIs through Hadoop's FileSystem)."""
    if "://" not in path and not path.startswith("file:"):
        with open(path, encoding="utf-8") as f:
            return f.read()
    jvm = spark.sparkContext._jvm
    fs, p = _fs_path(spark, path)
    stream = fs.open(p)
    try:
        reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))
        lines = []
        line = reader.readLine()
        while line is not None:
            lines.append(line)
            line = reader.readLine()
        return "\n".join(lines)
    finally:
        stream.close()


def list_names(spark: SparkSession, path: str) -> list[str]:
    """Names of the entries directly under ``path`` (empty when it does not exist)."""
    fs, p = _fs_path(spark, path)
    if not fs.exists(p):
        return []
    return sorted(str(status.getPath().getName()) for status in fs.listStatus(p))
