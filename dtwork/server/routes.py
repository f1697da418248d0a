"""REST handlers under ``<base_url>/dtwork/``; every one requires an authenticated user.

Routes (the wire types are mirrored in ``extension/src/types.ts``):

  GET  /dtwork/health                     version and whether a run store exists
  GET  /dtwork/clusters                   registered clusters
  POST /dtwork/clusters/<id>/stop         kill a registered cluster's processes
  GET  /dtwork/runs[?limit=50&rescan=1]   runs of every store under the root, newest first, with a
                                          loss sparkline each (and an adaptive run's batch
                                          trajectory); the newest searches, each with its tally and
                                          its trials' run ids; rescan: look for stores now
  GET  /dtwork/runs/<id>                  one run: summary, latest metrics, loss curve
  GET  /dtwork/runs/<id>/metrics?name=N   one metric's aggregated series
  GET  /dtwork/runs/<id>/cells/<seq>     one cell's status, last step and figure (plotly JSON)
  POST /dtwork/runs/<id>/report           export the run as a notebook (dtwork.report); the body
                                          may send the kernel's {"environ": {...}} to scrub

The routes of one run take ``?store=KEY``, the run's ``store`` as GET /dtwork/runs lists it (run ids
are per store); without it, the server's default store. The cell route takes the notebook's folder.
  GET  /dtwork/gpus                       NVML inventory and telemetry (CPU mode without)

Errors answer ``{"error": "..."}``: 404 for malformed or unknown ids (and unknown routes
under /dtwork/), 400 for bad query arguments or a body it cannot take (size, depth, type), 409
when dtwork refuses a report (e.g. a run without cells), 501 when report export is not
installed, 503 with the reason when the run store is damaged or locked.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from dtwork.server import machines, queries, wire
from dtwork.shared.version import __version__
from dtwork.store.runs import default_store_path

T = TypeVar("T")

ID = r"(?P<{}>[^/]+)"  # loose on purpose: the handler validates, so bad ids get a JSON 404
MAX_METRIC_POINTS = 5000


class DtworkHandler(APIHandler):
    """Shared base: JSON answers, JSON errors, blocking work off the event loop."""

    auth_resource = "dtwork"

    @property
    def root_dir(self) -> str:
        return str(self.settings["dtwork_root_dir"])

    @property
    def store(self) -> str:
        """The ``?store=`` key of a run's routes (server/stores.py), "" for the default store."""
        return self.get_query_argument("store", "")

    def reply(self, payload: Mapping[str, object], status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(payload, allow_nan=False))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error as ``{"error": reason}``, without traceback."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))

    async def blocking(self, fn: Callable[..., T], *args: object) -> T | None:
        """Run ``fn`` in a thread; answer 404/503/501/500 for the errors the data layer raises."""
        try:
            return await asyncio.to_thread(fn, *args)
        except wire.NotFound as exc:
            self.reply({"error": str(exc)}, 404)
        except wire.StoreUnavailable as exc:
            self.reply({"error": str(exc)}, 503)
        except wire.ReportUnavailable as exc:
            self.reply({"error": str(exc)}, 501)
        except wire.ReportFailed as exc:
            self.reply({"error": str(exc)}, exc.status)
        return None

    async def answer(self, fn: Callable[..., Mapping[str, object]], *args: object) -> None:
        result = await self.blocking(fn, *args)
        if result is not None:
            self.reply(result)


class HealthHandler(DtworkHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        exists = await asyncio.to_thread(lambda: default_store_path(self.root_dir).is_file())
        self.reply({"ok": True, "version": __version__, "store_exists": exists})


class ClustersHandler(DtworkHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        sessions = await machines.session_notebooks(self.settings)
        await self.answer(machines.list_clusters, self.root_dir, sessions)


class ClusterStopHandler(DtworkHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self, cluster_id: str) -> None:
        await self.answer(machines.stop_cluster, cluster_id)


class RunsHandler(DtworkHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            limit = int(self.get_query_argument("limit", str(queries.DEFAULT_RUNS)))
        except ValueError:
            self.reply({"error": "limit must be a whole number"}, 400)
            return
        rescan = self.get_query_argument("rescan", "") not in ("", "0")
        await self.answer(queries.list_runs, self.root_dir, min(max(limit, 1), queries.MAX_RUNS), rescan)


class RunHandler(DtworkHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        await self.answer(lambda: queries.get_run(self.root_dir, queries.parse_run_id(run_id), self.store))


class RunMetricsHandler(DtworkHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        try:
            rid = queries.parse_run_id(run_id)
        except wire.NotFound as exc:
            self.reply({"error": str(exc)}, 404)
            return
        name = self.get_query_argument("name", "")
        if not name:
            self.reply({"error": "name the metric: ?name=loss"}, 400)
            return
        try:
            max_points = min(max(int(self.get_query_argument("max_points", "1000")), 2), MAX_METRIC_POINTS)
        except ValueError:
            self.reply({"error": "max_points must be a whole number"}, 400)
            return
        await self.answer(lambda: queries.run_metrics(self.root_dir, rid, name, max_points, self.store))


class CellHandler(DtworkHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, run_id: str, seq: str) -> None:
        await self.answer(
            lambda: queries.cell_live(
                self.root_dir, queries.parse_run_id(run_id), queries.parse_cell_seq(seq), self.store
            )
        )


class RunReportHandler(DtworkHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self, run_id: str) -> None:
        try:
            environ = queries.report_environ(self.request.body)
        except ValueError as exc:
            self.reply({"error": str(exc)}, 400)
            return
        await self.answer(
            lambda: queries.export_report(self.root_dir, queries.parse_run_id(run_id), environ, self.store)
        )


class GpusHandler(DtworkHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(await asyncio.to_thread(machines.gpus))


class NotFoundHandler(DtworkHandler):
    """Unknown paths under /dtwork/: a JSON 404 (after authentication, like every route)."""

    def _missing(self) -> None:
        self.reply({"error": f"no dtwork route {self.request.path!r}"}, 404)

    @tornado.web.authenticated
    @authorized
    async def get(self, rest: str) -> None:
        self._missing()

    @tornado.web.authenticated
    @authorized
    async def post(self, rest: str) -> None:
        self._missing()


ROUTES: list[tuple[tuple[str, ...], type[DtworkHandler]]] = [
    (("health",), HealthHandler),
    (("clusters",), ClustersHandler),
    (("clusters", ID.format("cluster_id"), "stop"), ClusterStopHandler),
    (("runs",), RunsHandler),
    (("runs", ID.format("run_id")), RunHandler),
    (("runs", ID.format("run_id"), "metrics"), RunMetricsHandler),
    (("runs", ID.format("run_id"), "cells", ID.format("seq")), CellHandler),
    (("runs", ID.format("run_id"), "report"), RunReportHandler),
    (("gpus",), GpusHandler),
    (("(?P<rest>.*)",), NotFoundHandler),
]


def setup_handlers(web_app: tornado.web.Application, root_dir: str) -> None:
    """Mount every route at ``<base_url>/dtwork/...``."""
    base_url = web_app.settings["base_url"]
    web_app.settings["dtwork_root_dir"] = root_dir
    handlers = [(url_path_join(base_url, "dtwork", *parts), cls) for parts, cls in ROUTES]
    web_app.add_handlers(".*$", handlers)
