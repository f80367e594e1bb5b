"""The Python guide's examples (``docs/guide.md``) run as written (in a fresh directory): the guide cannot rot. The
README's short example is an excerpt of the guide's, line for line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide.md"


def guide_block(name: str, page: Path = GUIDE) -> str:
    text = page.read_text()
    match = re.search(rf"<!-- guide:{name} -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert match, f"{page.name} has no '<!-- guide:{name} -->' python block"
    return match.group(1)


def guide_example() -> str:
    return guide_block("example")


def test_the_readme_guide_example_runs_end_to_end(spark, tmp_path):
    code = guide_example()
    assert 'root = "/tmp/two-phase-guide"' in code
    code = code.replace('root = "/tmp/two-phase-guide"', f'root = "{tmp_path}"')
    exec(compile(code, str(GUIDE), "exec"), {"__name__": "readme_guide"})


def test_the_guides_chained_pipelines_run_end_to_end(spark, tmp_path):
    code = guide_block("chain")
    assert 'root = "/tmp/two-phase-chain"' in code
    code = code.replace('root = "/tmp/two-phase-chain"', f'root = "{tmp_path}"')
    exec(compile(code, str(GUIDE), "exec"), {"__name__": "readme_guide_chain"})


def test_the_readme_example_is_an_excerpt_of_the_executed_guide():
    """Every line of the README's short example appears, in order, in the guide's example that the test above runs."""
    short = [line for line in guide_block("short", README).splitlines() if line.strip()]
    full = iter(line for line in guide_example().splitlines() if line.strip())
    missing = [line for line in short if not any(line == other for other in full)]
    assert len(short) > 10 and not missing, missing


class _Outcomes:
    """A pytest plugin that counts the outcomes of a session's test calls."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.outcomes.append((report.nodeid, report.outcome))


@pytest.mark.slow
def test_the_readme_user_test_file_passes_with_only_the_installed_plugin(spark, tmp_path, monkeypatch):
    """The guide's test file of a user's pipeline, run as its own pytest session in an empty folder outside the
    project: no conftest of this project, so its fixtures can only come from the installed ``pytest11`` plugin. The
    session runs in this process (``pytest.main``), so the plugin's ``phases_spark`` finds this suite's SparkSession
    running, uses it, and leaves it running. (Not ``pytester``: it unloads the modules the inner session imported,
    and Dagster's serialisation registry refuses their second import.)"""
    import sys

    folder = tmp_path / "user-project"
    folder.mkdir()
    (folder / "test_my_pipeline.py").write_text(guide_block("user-test"))
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the inner session prepends the folder
    outcomes = _Outcomes()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_my_pipeline.py"], plugins=[outcomes])
    assert code == pytest.ExitCode.OK, outcomes.outcomes
    assert [outcome for _, outcome in outcomes.outcomes] == ["passed"] * 3, outcomes.outcomes
    assert not spark.sparkContext._jsc.sc().isStopped()
