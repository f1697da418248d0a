"""Notebook widgets: the cluster view and the live training dashboard."""

from __future__ import annotations

import threading

_warming: threading.Thread | None = None
_lock = threading.Lock()


def _import_dashboard() -> None:
    try:
        import plotly.graph_objects as go

        from dtwork.widgets import dashboard  # noqa: F401

        go.FigureWidget  # noqa: B018  (plotly loads its widget stack on first access)
    except Exception:  # ImportError and friends: the cell that needs it reports it
        pass


def warm_dashboard() -> None:
    """Load the live dashboard's modules in a background thread, once per process.

    The first ``FigureWidget`` pulls in plotly's widget stack and, through it, nbformat and
    jsonschema, which are slow to load: loaded while the engines start, the first training cell
    does not pay for it with a late dashboard and CPU taken from its ranks.
    """
    global _warming
    with _lock:
        if _warming is None:
            _warming = threading.Thread(target=_import_dashboard, name="dtwork-warm-dashboard", daemon=True)
            _warming.start()


def warming() -> threading.Thread | None:
    """The thread :func:`warm_dashboard` started, if it did (it starts one per process)."""
    return _warming


def dashboard_ready(timeout: float | None = None) -> bool:
    """Wait for :func:`warm_dashboard` (if it was started); return whether it has finished."""
    thread = _warming
    if thread is None:
        return True
    thread.join(timeout)
    return not thread.is_alive()
