"""Fetches the JVM jars the project needs from Maven Central into a project-local cache, and builds the engine's
own JVM helper.

The bundles:

- ``spark``: what the SparkSession loads besides pyspark's own jars (``spark.jars``): Delta, and the Kafka
  connector (``spark-sql-kafka-0-10``, with the Kafka client it was built against). Only artifacts Spark does
  not already ship are copied, so no second Hadoop, Jackson or Scala library lands on Spark's classpath.
- ``kafka-broker``: Apache Kafka's broker (KRaft mode) with every dependency, run in a JVM of its own
  (:mod:`phases._internal.runtime.local_kafka`) for the demo and the tests; it never shares a classpath with Spark.
- ``schema-registry``: Apicurio Registry, the application as its project publishes it on Maven Central (a Quarkus
  application, ``apicurio-registry-app`` with the classifier ``all``), unpacked; run in a JVM of its own with in-memory
  storage (:mod:`phases._internal.runtime.local_registry`), it serves the Confluent Schema Registry API.

The helper (``jvm/``, Scala 2.13, Spark provided): Spark's state store used as a library by the live phase
(:mod:`phases._internal.state.keyed_store`). ``mvn package`` builds it into ``.jars/helper/``; a stamp of its sources'
hash says whether the cached jar is current.

Spark's own ``spark.jars.packages`` resolution (Ivy) does not work through this kind of machine's network
set-up, Maven does; so the setup step runs ``mvn dependency:copy-dependencies`` on a generated pom per
bundle. Run ``python -m phases.setup`` (the Makefile's setup does). It is idempotent: a stamp file per
bundle records the coordinates that were fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phases._internal.errors import SetupError

# delta-spark 4.4.1 (PyPI) has no 4.4.1 JVM artifact for Spark 4.2 on Maven Central; 4.4.0 is the newest.
DELTA_COORDINATE = "io.delta:delta-spark_4.2_2.13:4.4.0"
SPARK_KAFKA_COORDINATE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
# Avro values of Kafka topics decoded and encoded in the JVM (from_avro, to_avro); Avro itself is in pyspark/jars.
SPARK_AVRO_COORDINATE = "org.apache.spark:spark-avro_2.13:4.2.0"
# Protobuf values of Kafka topics, decoded and encoded by the engine's helper (spark-protobuf 4.2.0 is not on Maven
# Central); the same version the helper is compiled against (jvm/pom.xml).
PROTOBUF_COORDINATE = "com.google.protobuf:protobuf-java:4.33.5"
# The local schema registry: Apicurio Registry 3.3.3 (Java 21 or newer: :func:`registry_java`).
REGISTRY_COORDINATE = "io.apicurio:apicurio-registry-app:3.3.3:tar.gz:all"
KAFKA_BROKER_COORDINATES = (
    "org.apache.kafka:kafka_2.13:4.1.1",
    # The broker logs through SLF4J; without a binding it would say nothing at all.
    "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3",
)
# Of the Spark bundle's artifacts, these are copied; everything else they depend on is in pyspark/jars.
_SPARK_GROUPS = ("io.delta", "io.unitycatalog")
_SPARK_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-avro_2.13",
    "protobuf-java",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)


def _checkout() -> Path | None:
    """The repository checkout the engine runs from (the helper's sources, ``jvm/``, beside ``phases/``); None for an
    installed package."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "jvm" / "pom.xml").is_file() else None


CHECKOUT = _checkout()
# The jar cache: PHASES_JAR_DIR; in a checkout its .jars/; installed, the user's cache folder.
_USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "two-phase-pipelines"
DEFAULT_JAR_DIR = Path(os.environ.get("PHASES_JAR_DIR") or (CHECKOUT / ".jars" if CHECKOUT else _USER_CACHE / "jars"))
_STAMP = ".coordinates.json"


@dataclass(frozen=True)
class Bundle:
    """A set of Maven coordinates fetched with their dependencies into one folder of the jar cache."""

    name: str
    coordinates: tuple[str, ...]
    folder: str  # under the jar cache; "" = the cache itself
    keep: Callable[[str, str], bool]  # (group id, artifact id) -> copy it?

    def directory(self, jar_dir: Path) -> Path:
        return jar_dir / self.folder if self.folder else jar_dir


SPARK = Bundle(
    "spark",
    (DELTA_COORDINATE, SPARK_KAFKA_COORDINATE, SPARK_AVRO_COORDINATE, PROTOBUF_COORDINATE),
    "",
    lambda group, artifact: group in _SPARK_GROUPS or artifact in _SPARK_ARTIFACTS,
)
KAFKA_BROKER = Bundle("kafka-broker", KAFKA_BROKER_COORDINATES, "kafka-broker", lambda group, artifact: True)
# s3a:// tables: Hadoop's S3A connector of the Hadoop release pyspark ships (hadoop-client-api 3.5.0) and the AWS
# SDK v2 bundle it was built against (~690 MB). Loaded only by sessions that ask for it (SparkSettings.s3a).
HADOOP_AWS_COORDINATE = "org.apache.hadoop:hadoop-aws:3.5.0"
S3A = Bundle(
    "s3a",
    (HADOOP_AWS_COORDINATE,),
    "s3a",
    lambda group, artifact: artifact in ("hadoop-aws", "wildfly-openssl") or group.startswith("software.amazon"),
)
BUNDLES = (SPARK, KAFKA_BROKER, S3A)
# Only for `make bench-peers` (not part of the setup): Flink's Parquet format, for the Flink peer benchmark.
FLINK_PEERS = Bundle(
    "flink-peers",
    ("org.apache.flink:flink-sql-parquet:2.3.0",),
    "flink-peers",
    lambda group, artifact: artifact == "flink-sql-parquet",
)


def _pom(coordinates: tuple[str, ...]) -> str:
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


def jar_paths(jar_dir: Path = DEFAULT_JAR_DIR, bundle: Bundle = SPARK) -> list[str]:
    """The cached jars of ``bundle``; raises SetupError naming the fix when they are not cached."""
    folder = bundle.directory(jar_dir)
    stamp = folder / _STAMP
    wanted = sorted(bundle.coordinates)
    if not stamp.exists() or json.loads(stamp.read_text()) != wanted:
        raise SetupError(
            f"JVM jars for {wanted} are not cached in {folder}. Run the setup step "
            "(`make setup`, or `python -m phases.setup`) on a machine that reaches Maven Central."
        )
    return sorted(str(p) for p in folder.glob("*.jar"))


def fetch(jar_dir: Path = DEFAULT_JAR_DIR, bundle: Bundle = SPARK) -> list[str]:
    """Fetches ``bundle``'s jars unless the cache already holds exactly its coordinates. Returns their paths."""
    try:
        return jar_paths(jar_dir, bundle)
    except SetupError:
        pass
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(
            "Maven (`mvn`) is needed once to fetch the JVM jars from Maven Central and is not on PATH. "
            "Install it (Debian: `apt-get install -y maven`) and run the setup step again."
        )
    folder = bundle.directory(jar_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        pom = Path(work) / "pom.xml"
        pom.write_text(_pom(bundle.coordinates))
        staging = Path(work) / "jars"
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-Dmdep.useRepositoryLayout=true",  # group/artifact/version/file.jar: keep() sees the group
            "-DexcludeScope=provided",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise SetupError(
                f"Could not fetch {list(bundle.coordinates)} from Maven Central (mvn exited {proc.returncode}). "
                f"Check that this machine reaches Maven Central (https://repo.maven.apache.org). Maven said:\n{tail}"
            )
        for old in folder.glob("*.jar"):
            old.unlink()
        for jar in staging.rglob("*.jar"):
            parts = jar.relative_to(staging).parts  # group parts..., artifact, version, file
            group, artifact = ".".join(parts[:-3]), parts[-3]
            if bundle.keep(group, artifact):
                shutil.copy2(jar, folder / jar.name)
    (folder / _STAMP).write_text(json.dumps(sorted(bundle.coordinates)))
    return jar_paths(jar_dir, bundle)


REGISTRY_FOLDER = "schema-registry"


def registry_app(jar_dir: Path = DEFAULT_JAR_DIR) -> Path:
    """The unpacked local schema registry (its ``quarkus-run.jar``); raises SetupError naming the fix when it is not
    fetched."""
    folder = jar_dir / REGISTRY_FOLDER
    stamp, app = folder / _STAMP, folder / "quarkus-run.jar"
    if not app.is_file() or not stamp.is_file() or json.loads(stamp.read_text()) != [REGISTRY_COORDINATE]:
        raise SetupError(
            f"the local schema registry ({REGISTRY_COORDINATE}) is not fetched into {folder}. Run the setup step "
            "(`make setup`, or `python -m phases.setup`) on a machine that reaches Maven Central."
        )
    return app


def fetch_registry(jar_dir: Path = DEFAULT_JAR_DIR) -> Path:
    """Fetches and unpacks the local schema registry (about 160 MB) unless it is there already."""
    import tarfile

    try:
        return registry_app(jar_dir)
    except SetupError:
        pass
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(
            "Maven (`mvn`) is needed once to fetch the local schema registry from Maven Central and is not on PATH. "
            "Install it (Debian: `apt-get install -y maven`) and run the setup step again."
        )
    folder = jar_dir / REGISTRY_FOLDER
    with tempfile.TemporaryDirectory() as work:
        cmd = [mvn, "-B", "-q", "dependency:copy", f"-Dartifact={REGISTRY_COORDINATE}", f"-DoutputDirectory={work}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=work)
        archives = list(Path(work).glob("*.tar.gz"))
        if proc.returncode != 0 or not archives:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise SetupError(
                f"Could not fetch {REGISTRY_COORDINATE} from Maven Central (mvn exited {proc.returncode}). Check "
                f"that this machine reaches Maven Central (https://repo.maven.apache.org). Maven said:\n{tail}"
            )
        staged = Path(work) / "unpacked"
        with tarfile.open(archives[0]) as tar:
            tar.extractall(staged, filter="data")
        if not (staged / "quarkus-run.jar").is_file():
            raise SetupError(f"{REGISTRY_COORDINATE} holds no quarkus-run.jar: not the application layout expected")
        if folder.exists():
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), folder)
    (folder / _STAMP).write_text(json.dumps([REGISTRY_COORDINATE]))
    return registry_app(jar_dir)


# The helper's sources: the checkout's jvm/, or the copy an installed package puts under its prefix (pyproject's
# data-files).
HELPER_SOURCES = CHECKOUT / "jvm" if CHECKOUT else Path(sys.prefix) / "share" / "two-phase-pipelines" / "jvm"
HELPER_JAR = "phases-state-helper.jar"


def _helper_hash(sources: Path = HELPER_SOURCES) -> str:
    digest = hashlib.sha256()
    for path in sorted([sources / "pom.xml", *(sources / "src").rglob("*")]):
        if path.is_file():
            digest.update(str(path.relative_to(sources)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def helper_jar(jar_dir: Path = DEFAULT_JAR_DIR, sources: Path = HELPER_SOURCES) -> str:
    """The built helper jar; raises SetupError naming the fix when it is missing or older than its sources."""
    folder = jar_dir / "helper"
    jar, stamp = folder / HELPER_JAR, folder / _STAMP
    if not jar.exists() or not stamp.exists():
        raise SetupError(
            f"the engine's JVM helper is not built in {folder}. Run the setup step (`make setup`, or "
            "`python -m phases.setup`); it builds jvm/ with Maven."
        )
    if (sources / "pom.xml").exists() and json.loads(stamp.read_text()) != _helper_hash(sources):
        raise SetupError(
            f"the engine's JVM helper in {folder} is older than its sources in {sources}. Run the setup step "
            "(`make setup`, or `python -m phases.setup`) to rebuild it."
        )
    return str(jar)


def build_helper(jar_dir: Path = DEFAULT_JAR_DIR, sources: Path = HELPER_SOURCES) -> str:
    """Builds the helper with Maven (Scala 2.13 against Spark, provided) unless the cached jar is current."""
    try:
        return helper_jar(jar_dir, sources)
    except SetupError:
        pass
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(
            "Maven (`mvn`) is needed to build the engine's JVM helper (jvm/) and is not on PATH. Install it "
            "(Debian: `apt-get install -y maven`) and run the setup step again."
        )
    folder = jar_dir / "helper"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        cmd = [mvn, "-B", "-q", "-f", str(sources / "pom.xml"), "package", f"-Dhelper.output={work}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
            raise SetupError(
                f"Could not build the engine's JVM helper ({sources}; mvn exited {proc.returncode}). Maven resolves "
                "scala-maven-plugin, scala-compiler and spark-sql from Maven Central: check that this machine "
                f"reaches https://repo.maven.apache.org. Maven said:\n{tail}"
            )
        # Copied beside, then renamed over the cached jar: a JVM running with the old one keeps reading its file.
        staged = folder / f".{HELPER_JAR}.new"
        shutil.copy2(Path(work) / HELPER_JAR, staged)
        os.replace(staged, folder / HELPER_JAR)
    (folder / _STAMP).write_text(json.dumps(_helper_hash(sources)))
    return helper_jar(jar_dir, sources)


def main() -> int:
    for bundle in BUNDLES:
        try:
            paths = fetch(bundle=bundle)
        except SetupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{len(paths)} JVM jars ({bundle.name}) cached in {bundle.directory(DEFAULT_JAR_DIR)}")
    try:
        print(f"the local schema registry: {fetch_registry().parent}")
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"the engine's JVM helper: {build_helper()}")
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
