"""The manual speaks of the product: every relative link and every repository path it names resolves, and its prose
cites no work session and no scratch file outside the repository (code examples may use any path). The code's own
docstrings and comments name only paths that exist."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# Folders of the repository a page names paths under ("`phases/_internal/handoff/manifest.py`", "`tests/phases/`").
REPOSITORY_FOLDERS = (
    "phases",
    "phases_dagster",
    "assets",
    "resources",
    "scripts",
    "benchmarks",
    "tests",
    "docs",
    "jvm",
    ".ci",
)
# The repository's Python sources whose docstrings and comments are checked like the manual.
SOURCES = sorted(
    path for folder in REPOSITORY_FOLDERS if (ROOT / folder).is_dir() for path in (ROOT / folder).rglob("*.py")
)
_FOLDER = "|".join(re.escape(folder) for folder in REPOSITORY_FOLDERS)
_PATH_IN_TEXT = re.compile(r"(?<![\w/.])((?:" + _FOLDER + r")/[\w/.-]*\w/?)")

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\n]+)`")
_SESSION = re.compile(r"\bsessions? \d+\b", re.I)


def _prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return _FENCE.sub("", page.read_text())


def _named_paths(text: str) -> list[str]:
    """Inline-code spans that name a file or folder of the repository (``phases/_internal/live/runner.py``,
    ``tests/phases/live/test_live.py::test_x``), without a test id or line suffix."""
    named = []
    for span in _CODE.findall(text):
        candidate = span.split("::")[0].split(" ")[0].rstrip(".,:;")
        if "/" not in candidate or any(c in candidate for c in "*<>{}$=(") or "://" in candidate:
            continue
        is_file_or_folder = candidate.endswith("/") or re.search(r"\.[a-z]+$", candidate.split("/")[-1])
        if candidate.split("/")[0] in REPOSITORY_FOLDERS and is_file_or_folder:
            named.append(candidate)
    return named


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(page: Path) -> None:
    missing = [path for path in _named_paths(_prose(page)) if not (ROOT / path).exists()]
    assert not missing, f"{page.relative_to(ROOT)} names repository paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_build_diary(page: Path) -> None:
    prose = _prose(page)
    found = [m.group(0) for m in _SESSION.finditer(prose)] + re.findall(r"/tmp/\S*", prose)
    assert not found, (
        f"{page.relative_to(ROOT)} cites work sessions or scratch files: {found}. Name a date and a commit, and "
        "cite a committed script (benchmarks/), or leave the figure out."
    )


def _paths_in_code_text(source: str) -> list[tuple[int, str]]:
    """(line, path) of the repository files and folders that the docstrings and comments of ``source`` name."""
    named = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        is_docstring = token.type == tokenize.STRING and token.string.lstrip("rbuRBU").startswith(('"""', "'''"))
        if token.type != tokenize.COMMENT and not is_docstring:
            continue
        for path in _PATH_IN_TEXT.findall(token.string):
            path = path.rstrip(".")
            if any(c in path for c in "*<>{}$") or not (path.endswith("/") or re.search(r"\.[a-z]+$", path)):
                continue
            named.append((token.start[0], path))
    return named


def test_paths_named_in_docstrings_and_comments_exist() -> None:
    missing = [
        f"{source.relative_to(ROOT)}:{line}: {path}"
        for source in SOURCES
        for line, path in _paths_in_code_text(source.read_text())
        if not (ROOT / path).exists()
    ]
    assert len(SOURCES) > 100, "the scan found no source"
    assert not missing, "docstrings and comments name paths that do not exist:\n" + "\n".join(missing)


def test_the_checks_find_what_they_look_for() -> None:
    """The patterns above catch what they are for (so a passing run means something)."""
    assert _named_paths("see `phases/_internal/live/runner.py` and `tests/x.py::test_y`") == [
        "phases/_internal/live/runner.py",
        "tests/x.py",
    ]
    assert _SESSION.search("measured in session 18") and not _SESSION.search("the Spark session's 8 partitions")
    assert _FENCE.sub("", "text\n```python\nroot = '/tmp/x'\n```\nmore") == "text\n\nmore"
    quotes = '"' * 3  # a docstring in the sample, without one in this file
    code = f"{quotes}See phases_dagster/live.py.{quotes}\nx = 'tests/not_prose.py'  # and tests/phases/\n"
    assert _paths_in_code_text(code) == [(1, "phases_dagster/live.py"), (2, "tests/phases/")]


FACTS = ROOT / "docs" / "FACTS.md"
_CITATION = re.compile(r"`((?:tests|benchmarks/profiles)/[\w/.-]+\w)(?:::(\w+))?`")
_DATED = re.compile(r"\((?:[^()]*\s)?20\d\d-\d\d-\d\d\b[^()]*\)")  # a profile's file name may hold its date


def _fact_entries(text: str) -> list[str]:
    """The top-level list items of the facts page, each joined into one line."""
    entries: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("- "):
            entries.append([line[2:]])
        elif entries and line.startswith("  ") and line.strip():
            entries[-1].append(line.strip())
        elif (not line.strip() or line.startswith("#")) and entries and entries[-1]:
            entries.append([])  # the entry before ends here
    return [" ".join(e) for e in entries if e]


def _citation_problems(entry: str) -> list[str]:
    """What is wrong with one fact's citations: none, a path that is missing, or a test it names that is not there."""
    cited = _CITATION.findall(entry)
    if not cited:
        return ["cites no test (tests/...) or profile (benchmarks/profiles/...)"]
    problems = []
    for path, test in cited:
        if not (ROOT / path).exists():
            problems.append(f"cites {path}, which does not exist")
        elif test and not re.search(rf"^(?:async )?def {test}\(", (ROOT / path).read_text(), re.M):
            problems.append(f"cites {path}::{test}, which that file does not define")
    if _DATED.search(entry):
        problems.append(f"is dated ({_DATED.search(entry).group(0)}): a dated observation belongs in docs/history.md")
    return problems


def test_every_fact_names_the_test_or_profile_that_shows_it() -> None:
    entries = _fact_entries(FACTS.read_text())
    wrong = [f"{entry[:90]}...: {p}" for entry in entries for p in _citation_problems(entry)]
    assert len(entries) > 50, "the facts page's entries were not found"
    assert not wrong, "facts without a valid citation:\n" + "\n".join(wrong)


def test_the_facts_check_finds_what_it_looks_for() -> None:
    page = "# T\n\n## S\n- A fact. Shown by `tests/test_docs.py`.\n  More of it.\n- Another (2026-11-22).\n"
    first, second = _fact_entries(page)
    assert first == "A fact. Shown by `tests/test_docs.py`. More of it." and not _citation_problems(first)
    assert _citation_problems(second) == ["cites no test (tests/...) or profile (benchmarks/profiles/...)"]
    assert _citation_problems("X. `tests/test_docs.py::test_nothing_like_this` (seen 2026-11-22)") == [
        "cites tests/test_docs.py::test_nothing_like_this, which that file does not define",
        "is dated ((seen 2026-11-22)): a dated observation belongs in docs/history.md",
    ]
    assert not _citation_problems("X. `tests/test_docs.py::test_the_facts_check_finds_what_it_looks_for`.")
