"""The README's user guide example runs as written (in a fresh directory): the guide cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def guide_example() -> str:
    text = README.read_text()
    match = re.search(r"<!-- guide:example -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert match, "README.md has no '<!-- guide:example -->' python block"
    return match.group(1)


def test_the_readme_guide_example_runs_end_to_end(spark, tmp_path):
    code = guide_example()
    assert 'root = "/tmp/two-phase-guide"' in code
    code = code.replace('root = "/tmp/two-phase-guide"', f'root = "{tmp_path}"')
    exec(compile(code, str(README), "exec"), {"__name__": "readme_guide"})
