"""``ctx`` is the user's face over the rank's state, and the runtime's imports run one way under it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from dtwork.errors import DtworkError, DtworkWarning
from dtwork.runtime.context import Context
from dtwork.runtime.core.state import RankState

RUNTIME = Path(__file__).resolve().parents[2] / "dtwork" / "runtime"
# The kernel calls these by reference (and the package holds the current ctx): they may build a ctx.
# cell_settings: the hook entry installs, above ctx as entry is
ABOVE_CONTEXT = {"__init__", "entry", "script", "bench", "context", "cell_settings", "trials"}


def _ctx(global_batch_size: int | None = None, world_size: int = 2) -> Context:
    return Context(
        rank=0,
        world_size=world_size,
        local_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
        global_batch_size=global_batch_size,
    )


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:  # ``from dtwork.runtime import current`` imports the package
                sub = node.module == "dtwork.runtime" and (RUNTIME / f"{a.name}.py").exists()
                names.add(f"{node.module}.{a.name}" if sub or node.module == "dtwork" else node.module)
    return names


def test_the_helpers_import_neither_context_nor_the_package() -> None:
    """Every import counts (TYPE_CHECKING and function level): the helpers take a RankState."""
    for path in sorted(RUNTIME.glob("*.py")):
        if path.stem in ABOVE_CONTEXT:
            continue
        found = _imports(path) & {"dtwork.runtime.context", "dtwork.runtime", "dtwork.runtime.current"}
        assert not found, f"runtime/{path.name} imports {sorted(found)}"


def test_ctx_keeps_nothing_of_its_own() -> None:
    ctx = _ctx(8)
    assert vars(ctx) == {"state": ctx.state}  # every attribute is the state's
    ctx.run_id, ctx.auto_resume = 7, True
    assert (ctx.state.run_id, ctx.state.auto_resume) == (7, True)
    ctx.state.gns = 12.5
    assert ctx.gns == 12.5
    fields = {f.name for f in dataclasses.fields(RankState)}
    for name in ("rank", "world_size", "device", "config", "per_slot_batch_size", "loop", "gns_state"):
        assert name in fields and getattr(ctx, name) is getattr(ctx.state, name)


def test_the_batch_split_drops_the_remainder_with_a_warning() -> None:
    with pytest.warns(
        DtworkWarning, match=r"global batch 9 does not divide over 2 slots: 4 per slot, 1 example"
    ):
        ctx = _ctx(9)
    assert (ctx.per_slot_batch_size, ctx.global_batch_size) == (4, 8)
    with pytest.raises(DtworkError, match="smaller than the 4 slots.*at least 4"):
        _ctx(3, world_size=4)
