"""Engine-side code: everything here runs inside the ipyparallel engines (one per rank).

Nothing in this package imports kernel-side modules (cluster, collector, magics, widgets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtwork.runtime.context import Context

_CTX: Context | None = None


def current() -> Context:
    """Return this rank's context (set by ``bootstrap.init_rank``)."""
    if _CTX is None:
        raise RuntimeError("dtwork: this engine has not joined a process group (run %dtrain start)")
    return _CTX


def set_current(ctx: Context | None) -> None:
    global _CTX
    _CTX = ctx
