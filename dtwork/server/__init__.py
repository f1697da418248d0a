"""dtwork's jupyter_server extension: REST routes under ``/dtwork/`` for the sidebar panel.

The routes read the run store (read-only), the cluster registry and NVML; the only things
they change are a registered cluster's processes (``POST /dtwork/clusters/<id>/stop``) and
a report notebook written on request (``POST /dtwork/runs/<id>/report``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "dtwork.server"}]


def _load_jupyter_server_extension(server_app: ServerApp) -> None:
    """Mount the ``/dtwork/`` routes on the server's web app."""
    from dtwork.server.routes import setup_handlers

    setup_handlers(server_app.web_app, str(server_app.root_dir))
    server_app.log.info("dtwork server extension loaded: routes under %sdtwork/", server_app.base_url)


# jupyter_server < 2 looked for this name.
load_jupyter_server_extension = _load_jupyter_server_extension
