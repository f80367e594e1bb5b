"""The walk of a pipeline definition through the code: which functions it passes through, from an entry point.

Static, with :mod:`ast` only (nothing is imported or run). From the entry function and its parameter (by default the
``pipeline`` of ``phases_dagster/live.py:build_live_asset``), the walk follows every call that passes the definition
on: a name assigned from it or from a call given it (``where = storage.placement(pipeline)``,
``runner = LiveRunner.at(session, where)``), its carriers (``where.definition``, ``runner.placement``), and, within a
function, an attribute of ``self`` set from it (``self.placement``). A constructor call is followed into the class's
``__init__`` (``Class(...)``, and ``cls(...)`` in a classmethod), and a name imported from the public package
(``from phases import LiveRunner``) into the module its lazy ``__init__`` names for it. Values read from it
(``where.sink_path``), or returned as a plain value by a helper given it (a path: ``-> str``), are not
followed. A call is followed when the callee can
be found in the project's own modules: a function or class imported by name, ``module.function`` of an imported
module, ``Class.method``, ``self.method``, ``x.method`` where ``x`` was made by a call to a known class or classmethod
or is a parameter annotated with one (``storage: StorageResource``), when the call passes the definition as an
argument (a method that reads it from ``self`` is not followed). Each function reached is a **stop** (each once,
depth first, in source order). Along the sequence of stops:

* a **return** is a stop in a module the walk left before (it comes back to a module it had left);
* a **climb** is a stop in a module of a higher layer than the stop it was reached from, or of the same layer but
  another package (``phases._internal.live`` calling into ``phases._internal.backlog``): the layers are
  ``tests/test_architecture.py``'s
  ``LAYERS``, with ``phases_dagster`` above them all;
* a **placing** is a call site, from outside the placing module, of :func:`phases._internal.deployment.place` or
  :func:`~phases._internal.deployment.settle` (each reads the redeploy log and makes a placement), or of an older
  binding (``deploy``, ``bind``, ``resolve_paths``, ``generations.resolve``), on the way;
* a **copy** is a call of ``model_copy``, ``copy`` or ``model_validate`` on the definition itself (a rewrite of it).

``tests/test_definition_walk.py`` compares both counts with a run that records every placing and every copy.

Run: ``.venv/bin/python -m scripts.definition_walk`` (``--entry phases_dagster/live.py:build_live_asset:pipeline``,
``--stops`` lists them).
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("phases", "phases_dagster")
BINDS = {"place", "settle", "deploy", "bind", "resolve", "resolve_paths"}
COPIES = {"model_copy", "copy", "model_validate", "__copy__", "__deepcopy__"}
PLAIN = {"str", "int", "float", "bool", "dict", "list", "tuple", "set", "None"}
# Attributes that hold the definition, or a value that carries it (where.definition, runner.placement).
CARRIERS = {"pipeline", "definition", "deployment", "placement"}
BIND_MODULES = {
    "phases._internal.deployment.binding",
    "phases._internal.deployment.paths",
    "phases._internal.storage.generations",
    "phases._internal.storage.resolve",
}
PUBLIC = "phases"  # the public package: its names load lazily from the modules ``_EXPORTS`` names


@dataclass
class Function:
    module: str
    qualname: str  # "f", "Class.method"
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None = None

    @property
    def params(self) -> list[str]:
        a = self.node.args
        return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


@dataclass
class Module:
    name: str
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "module" or "module:attr"
    functions: dict[str, Function] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def load() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = module_name(path)
            tree = ast.parse(path.read_text(), str(path))
            m = Module(name, tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for a in node.names:
                        m.imports[a.asname or a.name] = f"{node.module}:{a.name}"
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        m.imports[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            for node in tree.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    m.functions[node.name] = Function(name, node.name, node)
                elif isinstance(node, ast.ClassDef):
                    m.classes[node.name] = node
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                            q = f"{node.name}.{item.name}"
                            m.functions[q] = Function(name, q, item, node.name)
            modules[name] = m
    return modules


class Walk:
    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.stops: list[tuple[Function, Function | None]] = []  # (stop, reached from)
        self.seen: set[tuple[str, str]] = set()
        self.binds: list[str] = []
        self.copies: list[str] = []

    # --- resolving a callee -------------------------------------------------------------------------------------
    def _target(self, ref: str) -> tuple[str, str] | None:
        """A "module:attr" or "module" import reference -> (module, name) of a definition in the project."""
        if ":" in ref:
            mod, attr = ref.split(":")
            if f"{mod}.{attr}" in self.modules:  # from package import module
                return (f"{mod}.{attr}", "")
            m = self.modules.get(mod)
            if m is None:
                return None
            if attr in m.functions or attr in m.classes:
                return (mod, attr)
            if attr in m.imports:  # re-exported (a package's __init__)
                return self._target(m.imports[attr])
            lazy = self._exported(mod, attr)
            return self._target(lazy) if lazy else None
        return (ref, "") if ref in self.modules else None

    def _exported(self, mod: str, attr: str) -> str | None:
        """A name the public package loads lazily (its ``_EXPORTS``: module -> names), as "module:attr"."""
        if mod != PUBLIC:
            return None
        for node in self.modules[mod].tree.body:
            target = (
                node.target
                if isinstance(node, ast.AnnAssign)
                else (node.targets[0] if isinstance(node, ast.Assign) else None)
            )
            if isinstance(target, ast.Name) and target.id == "_EXPORTS" and isinstance(node.value, ast.Dict):
                for key, names in zip(node.value.keys, node.value.values, strict=True):
                    if isinstance(names, ast.Tuple) and any(
                        isinstance(e, ast.Constant) and e.value == attr for e in names.elts
                    ):
                        return f"{key.value}:{attr}"  # type: ignore[union-attr]
        return None

    def _function(self, mod: str, qual: str) -> Function | None:
        m = self.modules.get(mod)
        if m is None:
            return None
        if qual in m.functions:
            return m.functions[qual]
        if qual in m.classes:
            return m.functions.get(f"{qual}.__init__")
        return None  # an inherited method is not followed

    def callee(self, fn: Function, call: ast.Call, instances: dict[str, tuple[str, str]]) -> Function | None:
        m = self.modules[fn.module]
        f = call.func
        if isinstance(f, ast.Name):
            if f.id == "cls" and fn.cls:  # a classmethod's constructor call
                return self._function(fn.module, fn.cls)
            if f.id in m.functions or f.id in m.classes:
                return self._function(fn.module, f.id)
            ref = m.imports.get(f.id)
            target = self._target(ref) if ref else None
            return self._function(*target) if target and target[1] else None
        if isinstance(f, ast.Attribute):
            base = f.value
            if isinstance(base, ast.Name):
                if base.id in ("self", "cls") and fn.cls:
                    return self._function(fn.module, f"{fn.cls}.{f.attr}")
                if base.id in instances:
                    mod, cls = instances[base.id]
                    return self._function(mod, f"{cls}.{f.attr}")
                if base.id in m.classes:
                    return self._function(fn.module, f"{base.id}.{f.attr}")
                ref = m.imports.get(base.id)
                target = self._target(ref) if ref else None
                if target is None:
                    return None
                mod, name = target
                if name:  # an imported class: Class.method
                    return self._function(mod, f"{name}.{f.attr}")
                sub = self._target(f"{mod}:{f.attr}")
                return self._function(*sub) if sub and sub[1] else None
        return None

    def _class_named(self, fn: Function, name: str) -> tuple[str, str] | None:
        m = self.modules[fn.module]
        if name in m.classes:
            return (fn.module, name)
        ref = m.imports.get(name)
        target = self._target(ref) if ref else None
        if target and target[1] and target[1] in self.modules[target[0]].classes:
            return target
        return None

    def _class_of(self, fn: Function, call: ast.Call) -> tuple[str, str] | None:
        """The (module, class) a call makes: ``Class(...)`` or ``Class.classmethod(...)``."""
        f = call.func
        name = (
            f.id
            if isinstance(f, ast.Name)
            else f.value.id
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
            else None
        )
        return self._class_named(fn, name) if name is not None else None

    # --- the walk -----------------------------------------------------------------------------------------------
    def visit(self, fn: Function, tainted: set[str], came_from: Function | None) -> None:
        key = (fn.module, fn.qualname)
        if key in self.seen:
            return
        self.seen.add(key)
        self.stops.append((fn, came_from))
        names = set(tainted)
        instances: dict[str, tuple[str, str]] = {}
        for node in ast.walk(fn.node):  # parameters annotated with a project class (``storage: StorageResource``)
            if isinstance(node, ast.arg) and isinstance(node.annotation, ast.Name):
                made = self._class_named(fn, node.annotation.id)
                if made is not None:
                    instances[node.arg] = made
        self_attrs: set[str] = set()

        def holds(expr: ast.AST) -> bool:
            """Whether ``expr`` is the definition itself (or what carries it), not a value read from it."""
            if isinstance(expr, ast.Name):
                return expr.id in names
            if isinstance(expr, ast.Attribute):
                if isinstance(expr.value, ast.Name) and expr.value.id == "self":
                    return expr.attr in self_attrs
                return expr.attr in CARRIERS and holds(expr.value)
            return False

        def made_from(expr: ast.AST) -> bool:
            """Whether ``expr`` holds the definition or is made by a call given it."""
            if holds(expr):
                return True
            if isinstance(expr, ast.Call):
                f = expr.func
                if isinstance(f, ast.Attribute) and f.attr in COPIES and holds(f.value):
                    return True  # a copy of the definition carries it on
                if not any(holds(a) for a in [*expr.args, *(k.value for k in expr.keywords)]):
                    return False
                made = self.callee(fn, expr, instances)  # a helper that returns a plain value (a path) does not
                returns = made.node.returns if made is not None else None
                return made is not None and not (isinstance(returns, ast.Name) and returns.id in PLAIN)
            if isinstance(expr, ast.IfExp):
                return made_from(expr.body) or made_from(expr.orelse)
            return False

        body = list(ast.walk(fn.node))
        body.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        for node in body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and made_from(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            names.add(n.id)
                            if isinstance(node.value, ast.Call) and (made := self._class_of(fn, node.value)):
                                instances[n.id] = made
                        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                            self_attrs.add(n.attr)
            if isinstance(node, ast.NamedExpr) and made_from(node.value):
                names.add(node.target.id)
        for node in body:
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in COPIES and holds(f.value):
                self.copies.append(f"{f.attr} of the definition in {fn.module}.{fn.qualname}")
            passes = [holds(a) for a in node.args]
            kw = {k.arg: holds(k.value) for k in node.keywords if k.arg}
            if not any(passes) and not any(holds(k.value) for k in node.keywords):
                continue
            target = self.callee(fn, node, instances)
            if target is None:
                continue
            if target.module in BIND_MODULES and target.qualname in BINDS and fn.module not in BIND_MODULES:
                self.binds.append(f"{target.module}.{target.qualname} (from {fn.module}.{fn.qualname})")
            params = target.params
            skip = 1 if target.cls and params[:1] in (["self"], ["cls"]) else 0
            carried = {p for p, yes in zip(params[skip:], passes, strict=False) if yes}
            carried |= {k for k, yes in kw.items() if yes and k in params}
            self.visit(target, carried, fn)


def layers() -> list[tuple[str, ...]]:
    tree = ast.parse((ROOT / "tests" / "test_architecture.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "LAYERS":
                return [tuple(e.value for e in t.elts) for t in node.value.elts]
    raise SystemExit("LAYERS not found in tests/test_architecture.py")


def layer_of(module: str, table: list[tuple[str, ...]]) -> tuple[int, str]:
    if module.startswith("phases_dagster"):
        return (len(table), "phases_dagster")
    best, rank = "", 0
    for i, units in enumerate(table):
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best, rank = unit, i
    return rank, best


def measure(entry: str) -> dict:
    """The walk from ``entry`` (``path:function:parameter``) with its counts."""
    path, func, param = entry.split(":")
    modules = load()
    walk = Walk(modules)
    fn = modules[module_name(ROOT / path)].functions[func]
    walk.visit(fn, {param}, None)
    return summarize(walk)


def summarize(walk: Walk) -> dict:
    """Stops, modules, returns, climbs and binds of a walk, and its stops as rows (marked)."""
    table = layers()
    left: set[str] = set()
    returns = climbs = 0
    previous: str | None = None
    rows = []
    for stop, came_from in walk.stops:
        mark = []
        if previous is not None and stop.module != previous:
            left.add(previous)
            if stop.module in left:
                returns += 1
                mark.append("return")
        if came_from is not None and came_from.module != stop.module:
            (a, unit_a), (b, unit_b) = layer_of(came_from.module, table), layer_of(stop.module, table)
            if b > a or (b == a and unit_a != unit_b):
                climbs += 1
                mark.append("climb")
        previous = stop.module
        rows.append(f"{stop.module}.{stop.qualname}" + (f"  [{', '.join(mark)}]" if mark else ""))
    return {
        "stops": len(walk.stops),
        "modules": len({s.module for s, _ in walk.stops}),
        "returns": returns,
        "climbs": climbs,
        "binds": walk.binds,
        "copies": walk.copies,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entry", default="phases_dagster/live.py:build_live_asset:pipeline")
    parser.add_argument("--stops", action="store_true", help="list the stops in order")
    args = parser.parse_args(argv)
    r = measure(args.entry)
    if args.stops:
        print("\n".join(r["rows"]))
    print(
        f"{r['stops']} stops over {r['modules']} modules, {r['returns']} returns, {r['climbs']} climbs, "
        f"{len(r['binds'])} placing(s): " + "; ".join(r["binds"]) + f"; {len(r['copies'])} copies"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
