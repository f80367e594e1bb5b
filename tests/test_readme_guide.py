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


def test_the_readme_example_is_an_excerpt_of_the_executed_guide():
    """Every line of the README's short example appears, in order, in the guide's example that the test above runs."""
    short = [line for line in guide_block("short", README).splitlines() if line.strip()]
    full = iter(line for line in guide_example().splitlines() if line.strip())
    missing = [line for line in short if not any(line == other for other in full)]
    assert len(short) > 10 and not missing, missing


@pytest.mark.slow
def test_the_readme_user_test_file_passes_with_only_the_installed_plugin(tmp_path):
    """The guide's test file of a user's pipeline, run as its own pytest session in an empty folder: no
    conftest of this project, so its fixtures can only come from the installed ``pytest11`` plugin."""
    import subprocess
    import sys

    (tmp_path / "test_my_pipeline.py").write_text(guide_block("user-test"))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_pipeline.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout, run.stdout[-2000:]
