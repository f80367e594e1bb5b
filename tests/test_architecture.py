"""The engine's import graph, read from the source with ``ast`` (function-level and ``TYPE_CHECKING`` imports
included): no import cycle inside ``phases/``, no Dagster import in ``phases/`` (assets -> resources -> phases), and
every public name of the package importable (no JVM)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "phases"
INTERNAL = "phases._internal"  # everything but the public modules: private


def _modules(package: str = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imported(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in the module, at any depth."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module of the package it imports: line}. ``from a.b import c`` counts as an import of ``a.b.c``
    when that is a module, else of ``a.b`` (the nearest module, as Python resolves it), and as an import of each
    package Python initialises on the way (``a``, ``a.b``: their ``__init__`` runs first), except the importer's own
    packages, which are already initialising when it runs."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        if path.name == "__init__.py":
            own.add(name)
        for target, line in _imported(name, path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if not target:
                continue
            parts = target.split(".")
            for package in (".".join(parts[:i]) for i in range(1, len(parts))):
                if package in modules and package not in own:
                    graph[name].setdefault(package, line)
            if target != name:
                graph[name].setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_reader_sees_function_level_and_type_checking_imports(tmp_path):
    """The scan must see the imports that closed the old circle: one inside a function, one under
    ``TYPE_CHECKING``; a scan that missed them would pass on any tree."""
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from phases._internal.backlog import runner\n"
        "def f():\n    from phases._internal import operators\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    names = {module for module, _ in _imported("phases.example", path)}
    assert {"phases._internal.backlog.runner", "phases._internal.operators"} <= names


def test_a_circle_through_a_package_init_is_found(tmp_path, monkeypatch):
    """The circle a Spark worker once hit: a step module imports one piece of the operators package, whose
    ``__init__`` imports every kind, one of which imports the step module back (an ImportError in a worker that
    imported the step module first)."""
    pkg = tmp_path / "phases"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "steps").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "__init__.py").write_text("from phases.ops import join\n")
    (pkg / "ops" / "fold.py").write_text("")
    (pkg / "ops" / "join.py").write_text("from phases.steps.partition import load\n")
    (pkg / "steps" / "__init__.py").write_text("")
    (pkg / "steps" / "partition.py").write_text("from phases.ops.fold import fold\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert cycles(import_graph()) == [["phases.ops", "phases.ops.join", "phases.steps.partition"]]


def test_the_cycle_finder_finds_a_circle_of_three():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_engine_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 40, "the scan found too few modules: it no longer matches the tree"
    found = cycles(graph)
    detail = [
        f"{' -> '.join(c)}: "
        + "; ".join(f"{a} imports {b} (line {graph[a][b]})" for a in c for b in graph[a] if b in c)
        for c in found
    ]
    assert not found, "import cycles in phases/:\n" + "\n".join(detail)


def test_the_engine_does_not_import_dagster():
    """Dependencies point one way: assets -> resources -> phases. The engine runs without Dagster."""
    offenders = [
        f"{name} line {line}: {module}"
        for name, path in _modules().items()
        for module, line in _imported(name, path)
        if module == "dagster" or module.startswith(("dagster.", "dagster_", "assets", "resources", "phases_dagster"))
    ]
    assert not offenders, offenders


def test_the_definition_imports_no_operator_kind():
    """The definition models carry the flags their validation needs; the kinds import the definition, never
    the other way round."""
    graph = import_graph()
    definition = [
        m for m in graph if m == "phases._internal.definition" or m.startswith("phases._internal.definition.")
    ]
    assert definition
    wrong = {m: sorted(t for t in graph[m] if t.startswith("phases._internal.operators")) for m in definition}
    assert not any(wrong.values()), wrong


def test_every_engine_error_is_declared_in_errors():
    """One error family, in one module: a class anywhere else in ``phases/`` that derives from an exception is
    misfiled."""
    errors = ROOT / PACKAGE / "_internal" / "errors.py"
    family = {"Exception", "BaseException", "ValueError", "RuntimeError", "TypeError", "KeyError", "OSError"}
    family |= {n.name for n in ast.walk(ast.parse(errors.read_text())) if isinstance(n, ast.ClassDef)}
    assert "PhasesError" in family
    misfiled = []
    for name, path in _modules().items():
        if path == errors:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", None)) for b in node.bases}
                if bases & family or node.name.endswith(("Error", "Exception")):
                    misfiled.append(f"{name}.{node.name} (line {node.lineno})")
    assert not misfiled, misfiled


@pytest.mark.parametrize("name", __import__("phases").__all__)
def test_every_public_name_is_importable_from_the_package(name):
    import phases

    assert getattr(phases, name) is not None


def test_the_public_names_and_their_type_checking_imports_agree():
    """``phases.__all__`` (loaded on first use) and the ``TYPE_CHECKING`` imports that type checkers read name the
    same objects."""
    import phases

    tree = ast.parse((ROOT / PACKAGE / "__init__.py").read_text())
    checked = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for imp in node.body
        if isinstance(imp, ast.ImportFrom)
        for alias in imp.names
    }
    assert checked == set(phases.__all__) == set(phases._MODULE_OF)


def test_the_longest_modules_named_for_scheduling_exist():
    """``tests/conftest.py`` sends these modules first to the two test processes: a renamed one would silently
    drop out of the order."""
    from tests.conftest import LONGEST_MODULES

    assert [path for path in LONGEST_MODULES if not (ROOT / path).is_file()] == []


# The engine's layers, lowest first. A module may import its own layer and the layers below it, never one above:
# a leaf helper that a lower layer needs lives in that layer or below it. (Within a layer the cycle test above
# keeps the imports acyclic.) ``phases`` itself (the public names) and the testing kit sit on top.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "phases._internal",
        "phases._internal.errors",
        "phases._internal.uris",
        "phases._internal.reduce_fold",
        "phases._internal.spark_internals",
    ),
    ("phases._internal.definition",),
    ("phases._internal.placement",),
    ("phases._internal.records", "phases._internal.lateness", "phases._internal.runtime"),
    ("phases._internal.storage", "phases._internal.topics"),
    ("phases._internal.coordination",),
    ("phases._internal.state",),
    ("phases._internal.handoff",),
    ("phases._internal.deployment",),
    ("phases._internal.sources",),
    ("phases._internal.steps",),
    ("phases._internal.tagging", "phases._internal.schema_changes"),
    ("phases._internal.operators",),
    ("phases._internal.backlog", "phases._internal.live"),
    ("phases._internal.redeploy",),
    (
        "phases.testing",
        "phases.pytest_plugin",
        "phases.inspect",
        "phases.feed",
        "phases.setup",
        "phases.local",
        "phases",
    ),
)


def layer_of(module: str) -> int:
    """The layer of ``module``: that of the longest unit in :data:`LAYERS` it is or lies under."""
    best, rank = "", None
    for i, units in enumerate(LAYERS):
        for unit in units:
            # The two packages themselves: their __init__ only.
            under = module.startswith(unit + ".") and unit not in (PACKAGE, INTERNAL)
            if (module == unit or under) and len(unit) > len(best):
                best, rank = unit, i
    if rank is None:
        raise AssertionError(f"{module} is in no layer of tests/test_architecture.py LAYERS: add its unit there")
    return rank


def back_arrows(graph: dict[str, dict[str, int]]) -> list[str]:
    return [
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)}) at line {line}"
        for a, targets in sorted(graph.items())
        for b, line in sorted(targets.items())
        if layer_of(b) > layer_of(a)
    ]


def test_every_module_of_the_engine_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_the_layer_check_finds_an_import_that_runs_back_up():
    """The three back-arrows the layers replaced would each be found."""
    graph = {
        "phases._internal.steps.partition_ops": {"phases._internal.operators.aggregation": 29},
        "phases._internal.handoff.manifest": {"phases._internal.live.resume": 21},
        "phases._internal.definition.pipeline": {"phases._internal.storage": 29},
        "phases._internal.operators.aggregation": {"phases._internal.reduce_fold": 34},
    }
    assert len(back_arrows(graph)) == 3


def test_imports_run_down_the_layers_only():
    found = back_arrows(import_graph())
    assert not found, "imports that run back up the layers (move the helper down):\n" + "\n".join(found)


def test_the_dagster_resources_use_the_engine_not_the_assets():
    """Dependencies point one way in the Dagster factory too: assets, checks and sensors -> resources -> engine."""
    offenders = [
        f"{name} line {line}: {module}"
        for name, path in _modules("phases_dagster/resources").items()
        for module, line in _imported(name, path)
        if module.startswith("phases_dagster") and not module.startswith("phases_dagster.resources")
    ]
    assert _modules("phases_dagster/resources"), "the scan found no resources module"
    assert not offenders, offenders


# The engine's public modules; everything else is under phases._internal (private by its name).
PUBLIC_MODULES = (
    "phases",
    "phases.inspect",
    "phases.testing",
    "phases.feed",
    "phases.setup",
    "phases.pytest_plugin",
    "phases.local",
)


def public_engine_names() -> set[str]:
    """The public modules and the names in their ``__all__``."""
    import importlib

    names = set(PUBLIC_MODULES)
    for module in PUBLIC_MODULES:
        names |= {f"{module}.{name}" for name in getattr(importlib.import_module(module), "__all__", ())}
    return names


def non_public_engine_names(imports: list[tuple[str, int]]) -> list[str]:
    """The engine names among ``imports`` ((module.name, line) pairs) that are not public (a private one, a part of
    its path starting with ``_``, says so)."""
    public = public_engine_names()
    return [
        f"line {line}: {module}" + (" (private)" if any(p.startswith("_") for p in module.split(".")) else "")
        for module, line in imports
        if (module == "phases" or module.startswith("phases.")) and module not in public
    ]


def test_every_engine_module_but_the_public_ones_is_private():
    """A module of ``phases/`` is one of :data:`PUBLIC_MODULES` or lies under ``phases._internal``."""
    stray = [m for m in _modules() if m not in PUBLIC_MODULES and not (m == INTERNAL or m.startswith(INTERNAL + "."))]
    assert not stray, f"engine modules neither public nor under {INTERNAL}: {stray}"


def test_the_public_name_check_finds_an_engine_module_and_a_private_name():
    found = non_public_engine_names(
        [
            ("phases.Pipeline", 1),
            ("phases.inspect.table_stats", 2),
            ("phases._internal.storage.fs", 3),
            ("phases.inspect.fs", 4),
        ]
    )
    assert found == ["line 3: phases._internal.storage.fs (private)", "line 4: phases.inspect.fs"]


def test_the_dagster_layer_and_the_demos_code_location_use_only_the_engines_public_names():
    """``phases_dagster`` stands on what any orchestrator may use (the names of ``phases``, ``phases.inspect``, ...),
    and so does the demo's code location (``assets/``), as a user's would."""
    modules = {**_modules("phases_dagster"), **_modules("assets")}
    assert len(modules) > 10, "the scan found no Dagster module"
    offenders = [
        f"{name} {found}" for name, path in modules.items() for found in non_public_engine_names(_imported(name, path))
    ]
    assert not offenders, "the Dagster layer imports engine internals:\n" + "\n".join(offenders)


# PySpark's private handles: reached only from phases/_internal/spark_internals.py, so that one module (and its pin
# tests) is the whole list of what to check when Spark or Delta changes.
PRIVATE_HANDLES = {"_jvm", "_jsc", "_jdf", "_jsparkSession", "_jo", "_gateway", "_jconf", "_jcol", "_jreader"}
INTERNALS_HOME = "phases/_internal/spark_internals.py"


def private_handle_uses(path: Path) -> list[tuple[int, str]]:
    """(line, attribute) of every private handle the module reaches."""
    return [
        (node.lineno, node.attr)
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_HANDLES
    ]


def test_the_handle_scan_sees_a_private_handle(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("def f(spark, df):\n    return spark.sparkContext._jvm, df._jdf.queryExecution()\n")
    assert sorted(private_handle_uses(path)) == [(2, "_jdf"), (2, "_jvm")]


def test_no_private_spark_handle_outside_the_internals_home():
    found = []
    for folder in ("phases", "phases_dagster", "assets", "resources", "scripts", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where != INTERNALS_HOME:
                found += [f"{where} line {line}: .{attr}" for line, attr in private_handle_uses(path)]
    assert not found, f"private Spark handles outside {INTERNALS_HOME}:\n" + "\n".join(found)


TRACKER_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+")
CODE_SUFFIXES = {".py", ".scala", ".java", ".xml"}


def _code_files() -> list[Path]:
    """The engine's, the code location's, the scripts' and the benchmarks' sources, the JVM helper's, and the build
    files."""
    folders = ("phases", "phases_dagster", "assets", "resources", "scripts", "benchmarks", "jvm/src")
    files = [p for folder in folders for p in sorted((ROOT / folder).rglob("*")) if p.suffix in CODE_SUFFIXES]
    return files + [ROOT / name for name in ("Makefile", "pyproject.toml", "jvm/pom.xml")]


def test_no_tracker_number_in_the_code():
    """The code says what a thing is, not which tracker entry asked for it: a reader has no tracker to open."""
    found = [
        f"{path.relative_to(ROOT).as_posix()} line {i}: {line.strip()}"
        for path in _code_files()
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if TRACKER_NUMBER.search(line)
    ]
    assert not found, "tracker numbers in the code:\n" + "\n".join(found)


def test_the_wheel_carries_every_source_of_the_jvm_helper():
    """An installed package builds the helper from the sources pyproject's data-files put under its prefix: a source
    file they do not name would be missing there."""
    import glob
    import tomllib

    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = {Path(f) for patterns in data_files.values() for p in patterns for f in glob.glob(str(ROOT / p))}
    sources = {p for p in (ROOT / "jvm").rglob("*") if p.is_file() and "target" not in p.relative_to(ROOT).parts}
    assert sources and sources <= shipped, sorted(str(p.relative_to(ROOT)) for p in sources - shipped)


def test_neither_phase_imports_the_other():
    """The backlog and the live phase are peers: what both need (the handoff, increments' intents, the deployment)
    sits below both."""
    graph = import_graph()
    found = [
        f"{a} imports {b} at line {line}"
        for a, targets in sorted(graph.items())
        for b, line in sorted(targets.items())
        for mine, other in (
            ("phases._internal.backlog", "phases._internal.live"),
            ("phases._internal.live", "phases._internal.backlog"),
        )
        if (a == mine or a.startswith(mine + ".")) and (b == other or b.startswith(other + "."))
    ]
    assert not found, "\n".join(found)


MAX_MODULE_LINES = 500


def test_no_module_of_the_engine_or_the_dagster_layer_is_over_500_lines():
    """A room holds one job: a module past this has two, and is split by what they hold."""
    over = {
        str(path.relative_to(ROOT)): n
        for package in (PACKAGE, "phases_dagster")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"
