"""Where the suite's time goes, from a JUnit report of ``make test``: seconds per test module, longest first, then
the longest tests.

    make test ARGS="--junitxml=.artifacts/junit.xml"
    .venv/bin/python -m scripts.suite_profile .artifacts/junit.xml [--tests 40]

The report's times are each test's own (set-up, call and tear-down); with two test processes the wall is about half
their sum when both stay busy to the end (``LONGEST_MODULES`` in ``tests/conftest.py`` sends the longest first).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def times_of(report: Path) -> list[tuple[str, str, float]]:
    """(module path, test name, seconds) of every test case in the JUnit report."""
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        # pytest writes the module's dotted path, then the class if any: keep the file's part.
        parts = module.split("/")
        while len(parts) > 1 and not (ROOT / Path(*parts)).with_suffix(".py").exists():
            parts.pop()
        out.append(("/".join(parts) + ".py", case.get("name", ""), float(case.get("time", 0) or 0)))
    return out


def render(times: list[tuple[str, str, float]], longest: int) -> str:
    per_module: dict[str, float] = defaultdict(float)
    for module, _, seconds in times:
        per_module[module] += seconds
    total = sum(per_module.values())
    lines = [f"{len(times)} tests, {total:,.0f} s of test time", "", "seconds  module"]
    lines += [f"{seconds:7.0f}  {module}" for module, seconds in sorted(per_module.items(), key=lambda kv: -kv[1])]
    lines += ["", f"the {longest} longest tests", "seconds  test"]
    ranked = sorted(times, key=lambda t: -t[2])[:longest]
    lines += [f"{seconds:7.1f}  {module}::{name}" for module, name, seconds in ranked]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="the JUnit XML that pytest --junitxml wrote")
    parser.add_argument("--tests", type=int, default=40, help="how many of the longest tests to list (default 40)")
    args = parser.parse_args(argv)
    if not args.report.is_file():
        print(f'no JUnit report at {args.report}: run make test ARGS="--junitxml={args.report}" first', file=sys.stderr)
        return 2
    print(render(times_of(args.report), args.tests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
