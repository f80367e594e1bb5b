"""A class-data-sharing archive of the classes a local Spark driver loads (Spark, Hadoop, Scala, Delta, the Kafka
connector, the engine's helper), built once per JDK and jar set by the setup step and mapped by every local session
:func:`phases._internal.runtime.session.build_session` starts.

A JVM started from the archive does not read, parse and verify those classes again: a Dagster run, a relaunched live
phase or a redeploy's process starts and runs its first queries sooner (HotSpot's dynamic AppCDS archive, JDK 13 and
later: ``-XX:ArchiveClassesAtExit`` writes it, ``-XX:SharedArchiveFile`` maps it). The archive is only a start-up
cache: the JVM checks it against its own version and class path, and a JVM that cannot use it (another JDK, a jar
changed, a class path of its own) starts without it, as it would with no archive, and says nothing.

:mod:`phases.setup` builds it (``python -m phases.setup``, after the jars; the Makefile's setup does); the archive's
name is a hash of the JDK and the jars it was built from.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from phases._internal.errors import SetupError
from phases._internal.runtime import jvm_deps

FOLDER = "class-archive"
# The JVM's own lines about the archive (a JVM that cannot use it says why on standard output) are off: the archive
# is a cache, and a user's program owns the driver's output.
QUIET = "-Xlog:cds*=off -Xlog:class+path*=off"


def _java() -> Path | None:
    """The java executable Spark's launcher starts: $JAVA_HOME/bin/java, else the first on PATH (resolved)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _identity(path: Path) -> str:
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def archive_path(jar_dir: Path = jvm_deps.DEFAULT_JAR_DIR, jars: list[str] | None = None) -> Path | None:
    """Where the archive for this JDK and these jars is (or would be) kept; None when there is no java or the jars
    are not set up. ``jars``: the Spark bundle's jars and the helper's, when the caller has them already (a session
    start has; looking the helper up again hashes its sources again)."""
    import pyspark

    java = _java()
    if java is None:
        return None
    if jars is None:
        try:
            jars = [*jvm_deps.jar_paths(jar_dir), jvm_deps.helper_jar(jar_dir)]
        except SetupError:
            return None
    spark_jars = Path(pyspark.__file__).parent / "jars"
    digest = hashlib.sha256()
    for part in [_identity(java), pyspark.__version__, str(spark_jars), *sorted(_identity(Path(j)) for j in jars)]:
        digest.update(part.encode())
        digest.update(b"\0")
    libjvm = next(iter(java.parent.parent.glob("lib/server/libjvm.*")), None)
    if libjvm is not None:
        digest.update(_identity(libjvm).encode())
    return jar_dir / FOLDER / f"classes-{digest.hexdigest()[:16]}.jsa"


def java_options(jar_dir: Path = jvm_deps.DEFAULT_JAR_DIR, jars: list[str] | None = None) -> str:
    """The driver's JVM options that map the current archive; '' when none is built."""
    path = archive_path(jar_dir, jars)
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"
