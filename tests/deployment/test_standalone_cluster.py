"""The cluster tier: a real Spark standalone master and two one-core workers on 127.0.0.1 (from the installed
PySpark distribution), and the keyed and process-function pipelines' backlog → switch → live flow on it through
``SparkResource(master="spark://...")``, equal to the reference.

The executors get what a cluster user ships, nothing more: Delta's and Kafka's jars through ``spark.jars``, the
engine and the user's functions as a zip through ``py_files``, and a worker Python that has the third-party
packages (pyspark, pandas, pyarrow, protobuf) but not this project; the workers run in their own folders.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phases._internal.runtime import shipping
from phases._internal.runtime.local_cluster import LocalSparkCluster
from tests.helpers import SHORT_LIVED_JVM_OPTIONS


def _worker_python(folder: Path) -> str:
    """A bare venv whose site-packages reach the project venv's third-party packages through a .pth line, which
    adds that folder to sys.path without running its .pth files: the project's editable install stays out."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    [target] = list((folder / "lib").glob("python3*/site-packages"))
    (target / "third_party.pth").write_text(site + "\n")
    python = str(folder / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import pyspark, pandas, pyarrow\ntry:\n import phases\nexcept ImportError: print('clean')"],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "clean", (probe.stdout, probe.stderr)
    return python


@pytest.mark.slow
def test_keyed_and_process_pipelines_run_end_to_end_on_a_standalone_cluster(tmp_path, monkeypatch):
    # Every JVM of the tier (master, workers, their executors, the driver) inherits it: each lives for one short flow.
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", SHORT_LIVED_JVM_OPTIONS)
    started = time.perf_counter()
    python = _worker_python(tmp_path / "worker-venv")
    archive = shipping.package_archive(tmp_path / "ship", ["phases", "tests"])
    with LocalSparkCluster(tmp_path / "cluster", workers=2, cores=1) as cluster:
        up = time.perf_counter() - started
        settings = {
            "master": cluster.master_url,
            "root": f"file:{tmp_path / 'tables'}",
            "python": python,
            "py_files": [archive],
            "conf": {"spark.driver.host": "127.0.0.1", "spark.executor.memory": "1g", "spark.cores.max": "2"},
        }
        child = subprocess.run(
            [sys.executable, "-m", "tests.deployment.flows", json.dumps(settings)],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-6000:]
        report = json.loads(child.stdout.strip().splitlines()[-1])
        assert report["executors"] == 2, report
        apps = cluster.status().get("completedapps", []) + cluster.status().get("activeapps", [])
        assert any(app.get("name") == "two-phase-pipelines" for app in apps), apps
    print(f"cluster tier: cluster up in {up:.1f} s; flows {report['seconds']}")
