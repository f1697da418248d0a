"""Engine-side code: everything here runs inside the ipyparallel engines (one per rank).

Nothing in this package imports kernel-side modules (cluster, collector, magics, widgets).
Imports run one way: the kernel's entry points (``entry``, ``script``, ``bench``) and this package
(the current ``ctx``) -> ``context`` (the user's face) -> the helpers (loop, train, checkpoint, ...)
-> ``state`` (the rank's state, which the helpers take). No module below ``context`` imports it
or this package.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtwork.runtime.context import Context

_CTX: Context | None = None


def current() -> Context:
    """Return this rank's context (set by ``entry.init_rank``)."""
    if _CTX is None:
        raise RuntimeError("dtwork: this engine has not joined a process group (run %dtrain start)")
    return _CTX


def joined() -> bool:
    """Whether this engine has joined a process group (so ``current()`` has a ctx to give)."""
    return _CTX is not None


def set_current(ctx: Context | None) -> None:
    global _CTX
    _CTX = ctx


def call_with_ctx(fn: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, object]) -> object:
    """Call ``fn`` on this rank, handing it ``ctx`` when it takes one: a parameter named ``ctx``,
    or one positional argument more than it was given (``cluster.run(lambda c: c.rank)``)."""
    if _CTX is None:
        return fn(*args, **kwargs)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature
        return fn(*args, **kwargs)
    if "ctx" in sig.parameters and "ctx" not in kwargs:
        with_kw = {**kwargs, "ctx": _CTX}
        if _binds(sig, args, with_kw):
            return fn(*args, **with_kw)
    if not _binds(sig, args, kwargs) and _binds(sig, (_CTX, *args), kwargs):
        return fn(_CTX, *args, **kwargs)
    return fn(*args, **kwargs)


def _binds(sig: inspect.Signature, args: tuple[object, ...], kwargs: dict[str, object]) -> bool:
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        return False
    return True
