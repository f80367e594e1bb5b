"""The type checker over the engine and its Dagster layer (pyright, pinned in pyproject.toml; configured in its
``[tool.pyright]``): clean, and it tells the declared definition from where it runs (a ``Pipeline`` given where a
``Placement`` is wanted is an error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYRIGHT = [sys.executable, "-m", "pyright", "--outputjson"]


def _pyright(*paths: str, cwd: Path = ROOT) -> list[dict]:
    # The pinned version, without its check for a newer release on PyPI.
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
    done = subprocess.run([*PYRIGHT, *paths], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    report = json.loads(done.stdout)
    return report["generalDiagnostics"]


def test_the_engine_and_the_dagster_layer_type_check_clean():
    found = _pyright()
    shown = [f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message'].splitlines()[0]}" for d in found]
    assert not found, "pyright:\n" + "\n".join(shown[:50])


def test_a_definition_given_where_a_placement_is_wanted_is_a_type_error(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from phases import LiveRunner, Pipeline, Placement, inspect\n"
        "def run(spark, pipeline: Pipeline, where: Placement) -> None:\n"
        "    LiveRunner.at(spark, where)\n"
        "    LiveRunner.at(spark, pipeline)\n"
        "    inspect.latest_handoff(spark, pipeline)\n"
    )
    (tmp_path / "pyrightconfig.json").write_text(
        json.dumps({"pythonVersion": "3.11", "typeCheckingMode": "basic", "extraPaths": [str(ROOT)]})
    )
    found = _pyright(str(probe), "--pythonpath", sys.executable, cwd=tmp_path)
    lines = sorted(d["range"]["start"]["line"] + 1 for d in found)
    assert lines == [4, 5], [d["message"] for d in found]
    assert all('"Pipeline"' in d["message"] and '"Placement"' in d["message"] for d in found)
