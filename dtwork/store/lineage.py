"""Which earlier cells a run's cells need: the names each cell binds and reads, followed backwards.

A run's re-run (a report, a recovery after a dead rank) replays its own cells after the earlier
cells they depend on, and nothing else: walking back from the run's last cell, an earlier cell is
needed when it binds a name that a later needed cell reads before binding it, or when it uses such
a name and neither trains nor keeps a name of its own (``train_ds.transform = t``,
``for g in opt.param_groups: g["lr"] = 0.05``, ``torch.manual_seed(0)``). So the
cell that defined the model and the data comes along; another run's training does not, unless the
run reads what it bound (a model fine-tuned from another run's). Names are read from the code
(``ast``): a change made by a cell that also keeps names of its own, to an object no later cell
names, is not followed.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_KNOWN = set(dir(builtins)) | {"ctx", "get_ipython", "display", "In", "Out", "_", "__", "___"}


@dataclass(frozen=True)
class Names:
    """The module-level names a cell binds, and the names it reads that it did not bind itself."""

    binds: frozenset[str]
    reads: frozenset[str]
    keeps: frozenset[str]  # what it binds to keep (not a loop's or a comprehension's variable)


def names(source: str) -> Names:
    """The names ``source`` binds and reads (IPython's magic and shell lines left out); none when
    it does not parse as Python."""
    code = "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in (source or "").splitlines()
    )
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return Names(frozenset(), frozenset(), frozenset())
    seen = _Visitor()
    seen.visit(tree)
    loops = {
        n.id
        for node in ast.walk(tree)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension))
        for n in ast.walk(node.target)
        if isinstance(n, ast.Name)
    }
    reads = seen.reads - seen.bound - _KNOWN | seen.updated
    return Names(frozenset(seen.bound), frozenset(reads), frozenset(seen.bound - loops))


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.reads: set[str] = set()
        self.updated: set[str] = set()  # ``x += 1`` at module level reads the x bound before
        self._locals: list[set[str]] = []

    def _bind(self, name: str) -> None:
        (self._locals[-1] if self._locals else self.bound).add(name)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self._bind(node.id)
        elif not any(node.id in scope for scope in self._locals):
            self.reads.add(node.id)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name) and not self._locals:
            self.updated.add(node.target.id)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self._bind(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        if not isinstance(node, ast.Lambda):
            for deco in node.decorator_list:
                self.visit(deco)
            self._bind(node.name)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        args = node.args
        local = {
            a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a
        }
        body = node.body if isinstance(node.body, list) else [node.body]
        declared = {
            n for stmt in body for sub in ast.walk(stmt) if isinstance(sub, ast.Global) for n in sub.names
        }
        local |= {n for stmt in body for sub in ast.walk(stmt) if (n := _bound(sub)) is not None} - declared
        self._locals.append(local)
        for stmt in body:
            self.visit(stmt)
        self._locals.pop()

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._bind(node.name)
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        self._locals.append(set())
        for stmt in node.body:
            self.visit(stmt)
        self._locals.pop()


def _bound(node: ast.AST) -> str | None:
    """The name a node binds inside a function body (its locals), if any."""
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return node.id
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.arg):
        return node.arg
    return None


def needed(own: Sequence[str], earlier: Sequence[tuple[str, bool]]) -> list[int]:
    """The indices of the ``earlier`` cells (source, whether it trained; oldest first) that the
    ``own`` cells (oldest first) need, oldest first (see the module's rule)."""
    wanted: set[str] = set()
    for source in reversed(own):
        wanted = _before(wanted, names(source))
    keep: list[int] = []
    for i in range(len(earlier) - 1, -1, -1):
        source, trained = earlier[i]
        found = names(source)
        # binds what is wanted, or, training nothing and keeping nothing, changes what is wanted
        if found.binds & wanted or (not trained and not found.keeps and found.reads & wanted):
            keep.append(i)
            wanted = _before(wanted, found)
    return keep[::-1]


def _before(wanted: Iterable[str], cell: Names) -> set[str]:
    """What must be bound before a needed cell: what is wanted after it, less what it binds, and
    what it reads."""
    return (set(wanted) - cell.binds) | cell.reads
