"""The package's imports run one way (the design's floors), counting every import in a file:
top-level, inside functions, and under ``TYPE_CHECKING``.

An edge goes to the module an import names: ``from dtwork.runtime import args`` to
``dtwork.runtime.core.args``, ``from dtwork.runtime import current`` to the package ``dtwork.runtime``.
The parent packages an import runs first are not counted (every module would then reach
``dtwork/__init__.py``); literal ``importlib.import_module("dtwork...")`` and ``__import__``
calls are.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "dtwork"

# The floors, ground first: a module imports only modules on its own floor or below (and no cycle
# within a floor). A name is a module or a folder; a module not named falls under its nearest named
# folder. A new module lands on its folder's floor without a change here.
FLOORS: list[tuple[str, ...]] = [
    ("dtwork.errors",),
    ("dtwork.shared",),  # both sides: records, batch split, devices, telemetry, timing
    ("dtwork.config", "dtwork.analysis"),  # experiment files; pure math
    ("dtwork.runtime.core",),  # engine side, ground floor: a rank's state, group, control, publish
    ("dtwork.runtime.measure",),
    ("dtwork.runtime.parallel",),
    ("dtwork.runtime.checkpoint",),
    ("dtwork.runtime.loop",),
    ("dtwork.runtime.context",),
    # what the kernel calls: the entry points, script runs, the current ctx
    ("dtwork.runtime", "dtwork.runtime.entry", "dtwork.runtime.bench", "dtwork.runtime.scripts"),
    ("dtwork.store",),  # kernel side from here up
    ("dtwork.launch",),
    ("dtwork.plots",),
    ("dtwork.report",),
    ("dtwork.export", "dtwork.widgets"),
    ("dtwork.server",),
    ("dtwork.kernel",),
    ("dtwork.cluster",),
    ("dtwork.commands",),
    ("dtwork.cli",),
    ("dtwork.magics",),
    ("dtwork", "dtwork.__main__"),
]
# The kernel stack, top to bottom: a module imports none above it.
KERNEL_STACK = ["dtwork.cluster", "dtwork.kernel.session", "dtwork.kernel.watcher", "dtwork.kernel.engines"]


def floor_of(module: str) -> int:
    """The floor of ``module``: that of the longest name in FLOORS it is or lies under."""
    best, floor = -1, -1
    for i, names in enumerate(FLOORS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, floor = len(name), i
    return floor


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        if "labextension" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        for name in names:
            if name == "dtwork" or name.startswith("dtwork."):
                target = _resolve(name, modules)
                if target and target != module:
                    found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    described = [
        " <-> ".join(c) + ": " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_the_kernel_stack_imports_only_downwards() -> None:
    graph = _graph()
    for i, module in enumerate(KERNEL_STACK):
        assert module in graph, f"{module} is missing: update KERNEL_STACK with the tree"
        above = set(KERNEL_STACK[:i])
        assert not graph[module] & above, f"{module} imports {sorted(graph[module] & above)}, above it"


def test_every_module_has_a_floor() -> None:
    unplaced = sorted(m for m in _graph() if floor_of(m) < 0)
    assert not unplaced, f"modules on no floor: {unplaced}: add their folder to FLOORS"


def test_imports_run_down_the_floors() -> None:
    upward = [
        f"{m} (floor {floor_of(m)}) -> {d} (floor {floor_of(d)})"
        for m, deps in sorted(_graph().items())
        for d in sorted(deps)
        if floor_of(d) > floor_of(m)
    ]
    assert not upward, "imports that run up a floor:\n" + "\n".join(upward)


def test_engine_side_and_math_import_no_kernel_module() -> None:
    kernel_floor = floor_of("dtwork.store")
    for module, deps in _graph().items():
        if floor_of(module) < kernel_floor:
            assert all(floor_of(d) < kernel_floor for d in deps), f"{module} imports the kernel side"


def test_only_the_extension_entry_imports_the_magics() -> None:
    for module, deps in _graph().items():
        if "dtwork.magics" in deps:
            assert module == "dtwork", f"{module} imports the magics: the library must not depend on them"


def test_the_graph_sees_function_level_and_type_checking_imports() -> None:
    """The checker itself: the edges it must see in today's tree (a checker that sees nothing passes all)."""
    graph = _graph()
    assert "dtwork.kernel.engines" in graph["dtwork.kernel.session"]
    assert "dtwork.cluster" in graph["dtwork"]  # under TYPE_CHECKING and in the lazy table
    assert "dtwork.magics" in graph["dtwork"]  # inside load_ipython_extension
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert (
        floor_of("dtwork.runtime.loop.steps")
        < floor_of("dtwork.runtime.context")
        < floor_of("dtwork.runtime.entry")
    )
    assert (
        floor_of("dtwork.runtime.core.state")
        < floor_of("dtwork.store.runs")
        < floor_of("dtwork.kernel.session")
    )


def test_test_files_have_names_unique_across_the_test_folders() -> None:
    """pytest imports test files by their bare names (no __init__.py): two folders holding the same
    name stop the whole run at collection, which a run of tests/unit alone would not show."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]}: rename one of them"
        seen[path.name] = path
