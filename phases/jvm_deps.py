"""Fetches the JVM jars Spark needs (Delta) from Maven Central into a project-local cache.

Spark's own ``spark.jars.packages`` resolution (Ivy) does not work through this kind of machine's
network set-up, Maven does; so the setup step runs ``mvn dependency:copy-dependencies`` on a generated
pom and hands the resulting jars to ``spark.jars``. Only the artifacts Spark does not already ship are
copied (group ids below), so no second Hadoop, Jackson or Scala library lands on the classpath.

Run ``python -m phases.jvm_deps`` (the Makefile's setup does). It is idempotent: a stamp file records
the coordinates that were fetched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from phases.errors import SetupError

# delta-spark 4.4.1 (PyPI) has no 4.4.1 JVM artifact for Spark 4.2 on Maven Central; 4.4.0 is the newest.
DELTA_COORDINATE = "io.delta:delta-spark_4.2_2.13:4.4.0"
# Artifacts of these groups are copied; everything else they depend on is already in pyspark/jars.
INCLUDED_GROUPS = ("io.delta", "io.unitycatalog")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JAR_DIR = Path(os.environ.get("PHASES_JAR_DIR", PROJECT_ROOT / ".jars"))
_STAMP = ".coordinates.json"


def _pom(coordinates: list[str]) -> str:
    deps = []
    for coordinate in coordinates:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>local.phases</groupId><artifactId>jvm-deps</artifactId><version>1</version>"
        f"<dependencies>{''.join(deps)}</dependencies></project>"
    )


def jar_paths(jar_dir: Path = DEFAULT_JAR_DIR, coordinates: list[str] | None = None) -> list[str]:
    """The cached jars for ``coordinates``; raises SetupError naming the fix when they are not cached."""
    wanted = coordinates or [DELTA_COORDINATE]
    stamp = jar_dir / _STAMP
    if not stamp.exists() or json.loads(stamp.read_text()) != sorted(wanted):
        raise SetupError(
            f"JVM jars for {wanted} are not cached in {jar_dir}. Run the setup step "
            "(`make setup`, or `python -m phases.jvm_deps`) on a machine that reaches Maven Central."
        )
    return sorted(str(p) for p in jar_dir.glob("*.jar"))


def fetch(jar_dir: Path = DEFAULT_JAR_DIR, coordinates: list[str] | None = None) -> list[str]:
    """Fetches the jars unless the cache already holds exactly these coordinates. Returns their paths."""
    wanted = sorted(coordinates or [DELTA_COORDINATE])
    try:
        return jar_paths(jar_dir, wanted)
    except SetupError:
        pass
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(
            "Maven (`mvn`) is needed once to fetch the Delta jars from Maven Central and is not on PATH. "
            "Install it (Debian: `apt-get install -y maven`) and run the setup step again."
        )
    jar_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        pom = Path(work) / "pom.xml"
        pom.write_text(_pom(wanted))
        staging = Path(work) / "jars"
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            f"-DincludeGroupIds={','.join(INCLUDED_GROUPS)}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise SetupError(
                f"Could not fetch {wanted} from Maven Central (mvn exited {proc.returncode}). "
                f"Check that this machine reaches Maven Central. Maven said:\n{tail}"
            )
        for old in jar_dir.glob("*.jar"):
            old.unlink()
        for jar in staging.glob("*.jar"):
            shutil.copy2(jar, jar_dir / jar.name)
    (jar_dir / _STAMP).write_text(json.dumps(wanted))
    return jar_paths(jar_dir, wanted)


def main() -> int:
    try:
        paths = fetch()
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(paths)} JVM jars cached in {DEFAULT_JAR_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
