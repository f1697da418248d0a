"""dtwork: a Jupyter-first workbench for synchronous data-parallel PyTorch training.

``%load_ext dtwork`` then ``%dtrain start``; or from Python ``dtwork.start(n=2)``.
Imports are lazy so that engines importing ``dtwork.runtime`` stay light and the kernel
never imports torch by importing dtwork.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dtwork.errors import ConfigError, DtworkError, DtworkWarning, RankFailure
from dtwork.shared.version import __version__

__all__ = [
    "Cluster",
    "ConfigError",
    "attach",
    "DtworkError",
    "DtworkWarning",
    "RankFailure",
    "ctx",
    "export_checkpoint",
    "load_config",
    "report",
    "runs",
    "search",
    "start",
    "load_ipython_extension",
    "unload_ipython_extension",
    "__version__",
]

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from dtwork import report
    from dtwork.cluster import Cluster, attach, start
    from dtwork.commands.search import search
    from dtwork.config import load_config
    from dtwork.runtime.checkpoint.trial import export_checkpoint
    from dtwork.runtime.context import Context
    from dtwork.store.rows import RunRow

_LAZY = {
    "Cluster": ("dtwork.cluster", "Cluster"),
    "start": ("dtwork.cluster", "start"),
    "attach": ("dtwork.cluster", "attach"),
    "search": ("dtwork.commands.search", "search"),  # a grid, random or ASHA search on the running cluster
    "load_config": ("dtwork.config", "load_config"),
    "export_checkpoint": (
        "dtwork.runtime.checkpoint.trial",
        "export_checkpoint",
    ),  # a .dcp folder as one file
}


class _RankContext:
    """``dtwork.ctx``: the ``ctx`` of the rank that reads it, for functions run on the ranks
    (``cluster.run(lambda: dtwork.ctx.rank)``) and modules imported there; ``dtwork.ctx()`` is
    that ctx itself."""

    def __call__(self) -> Context:
        from dtwork.runtime import current

        try:
            return current()
        except RuntimeError:
            raise DtworkError(
                "dtwork.ctx exists on the ranks only: use it in a %%dtrain cell or in a function run "
                "with cluster.run(fn); in the notebook, ask the Cluster (cluster.world_size, "
                "cluster.pull(name))"
            ) from None

    def __getattr__(self, name: str) -> Any:  # an attribute of the rank's ctx, as it is
        return getattr(self(), name)

    def __repr__(self) -> str:
        return "<dtwork.ctx: the ctx of the rank that reads it>"


ctx = _RankContext()


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    if name == "report":  # the package: dtwork.report.export(run_id, path, ...)
        return importlib.import_module("dtwork.report")
    raise AttributeError(f"module 'dtwork' has no attribute {name!r}")


def runs(store: str | os.PathLike[str] | None = None) -> list[RunRow]:
    """The runs in the run store, newest first (``%dtrain runs`` as data); ``store`` as ``--store``
    takes it: a file, or a folder or notebook with ``.dtwork/runs.sqlite`` beside it."""
    from dtwork.store.runs import RunStore, store_path

    path = store_path(store)
    if not path.is_file():
        return []
    with RunStore(path, readonly=True) as s:
        return s.list_runs()


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext dtwork``: register the ``%dtrain`` line and cell magics."""
    from dtwork.magics import DtrainMagics

    ipython.register_magics(DtrainMagics(ipython))


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    from dtwork.cluster import stop_all

    stop_all()


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "dtwork"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "dtwork.server"}]
