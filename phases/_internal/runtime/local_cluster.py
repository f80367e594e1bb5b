"""A Spark standalone cluster on 127.0.0.1, from the installed PySpark distribution: one master and N
workers (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), each a JVM of its
own, with fresh work directories. Nothing is downloaded. The tests' cluster tier runs on it.

    with LocalSparkCluster(work_dir, workers=2, cores=1) as cluster:
        SparkSettings(master=cluster.master_url, ...)

The workers start in their own work directories, never the caller's, so an executor finds only what the
application ships (``spark.jars``, ``addPyFile``), as on a real cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from phases._internal.errors import SetupError
from phases._internal.runtime import watchdog
from phases._internal.runtime.local_kafka import free_port


def spark_home() -> Path:
    """The PySpark distribution's folder (it holds ``bin/spark-class`` and ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class LocalSparkCluster:
    """A standalone master and ``workers`` workers of ``cores`` cores and ``memory`` each, on loopback ports.
    Which Python the executors run is the application's choice (:class:`phases._internal.runtime.session.SparkSettings`
    ``python``): Spark sends it with every Python task."""

    def __init__(
        self,
        work_dir: str | os.PathLike,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1536m",
        daemon_heap: str = "256m",
    ):
        if workers < 1 or cores < 1:
            raise SetupError(f"a cluster needs one worker and one core at least (workers={workers}, cores={cores})")
        self.work_dir = Path(work_dir)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_heap = daemon_heap
        self.port = free_port()
        self.ui_port = free_port()
        self._processes: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for inherited in ("PYTHONPATH", "SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS"):
            env.pop(inherited, None)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY=self.daemon_heap,
            SPARK_LOG_DIR=str(self.work_dir / "logs"),
            SPARK_NO_DAEMONIZE="1",
            # spark-class reads SPARK_CONF_DIR's log4j2.properties: keep the daemons' logs in their files, quiet.
            SPARK_CONF_DIR=str(self.work_dir / "conf"),
        )
        return env

    def _launch(self, name: str, main: str, *args: str) -> subprocess.Popen:
        folder = self.work_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        out = open(self.work_dir / f"{name}.out", "ab")  # noqa: SIM115 - the child keeps it
        try:
            process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), main, *args],
                cwd=folder,
                env=self._env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            out.close()
        watchdog.guard(process.pid, grace_s=10.0)  # stops it if this process dies without stop()
        self._processes.append(process)
        return process

    def start(self, timeout: float = 120.0) -> LocalSparkCluster:
        """Starts the master, then the workers, and waits until the master counts every worker alive."""
        if self._processes:
            return self
        if shutil.which("java") is None:
            raise SetupError("Java is needed to run a Spark cluster and is not on PATH; run `make setup`")
        if self.work_dir.exists():
            shutil.rmtree(self.work_dir)
        (self.work_dir / "conf").mkdir(parents=True)
        (self.work_dir / "conf" / "log4j2.properties").write_text(
            "rootLogger.level = warn\nrootLogger.appenderRef.stdout.ref = console\n"
            "appender.console.type = Console\nappender.console.name = console\n"
            "appender.console.layout.type = PatternLayout\n"
            "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
        )
        self._launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for i in range(self.workers):
            self._launch(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(self.work_dir / f"worker-{i}" / "work"),
                "--webui-port",
                str(free_port()),
                self.master_url,
            )
        self._wait_workers(timeout)
        return self

    def status(self) -> dict:
        """The master's own account (``/json``): its workers, their state and cores, running applications."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            return json.loads(response.read())

    def _wait_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.poll() is not None:
                    self.stop()
                    raise SetupError(
                        f"a Spark daemon exited with code {process.returncode} while the cluster started; see the "
                        f"*.out files in {self.work_dir}"
                    )
            try:
                alive = [w for w in self.status().get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) >= self.workers:
                    return
            except OSError:
                pass  # the master's web UI is not up yet
            time.sleep(0.5)
        self.stop()
        raise SetupError(
            f"the Spark master at {self.master_url} did not count {self.workers} workers alive within {timeout:.0f} s;"
            f" see the *.out files in {self.work_dir}"
        )

    def stop(self, timeout: float = 30.0) -> None:
        """Stops the workers, then the master (SIGTERM, SIGKILL after ``timeout``)."""
        for process in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self._processes):
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self._processes = []

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
