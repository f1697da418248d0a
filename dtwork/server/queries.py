"""What the ``/dtwork/`` routes answer about runs: plain functions from the run store to JSON, and
the report export.

Kept apart from the handlers so that they run in a worker thread (SQLite blocks) and can be read
without tornado. Nothing here returns a file system path other than a notebook path relative to
the server root, nor anything from the environment. Clusters and GPUs: :mod:`dtwork.server.machines`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar, cast

from dtwork.errors import DtworkError
from dtwork.plots.palette import metric_colour

# The clusters' and GPUs' answers and the wire's errors and hygiene, by their former names here.
from dtwork.server import stores
from dtwork.server.machines import CLUSTER_ID as CLUSTER_ID
from dtwork.server.machines import CPU_MODE_REASON as CPU_MODE_REASON
from dtwork.server.machines import find_cluster as find_cluster
from dtwork.server.machines import gpus as gpus
from dtwork.server.machines import list_clusters as list_clusters
from dtwork.server.machines import stop_cluster as stop_cluster
from dtwork.server.wire import (
    AdaptiveBatch,
    MetricsReply,
    NotFound,
    ReportFailed,
    ReportReply,
    ReportUnavailable,
    RunDetail,
    RunReply,
    RunsReply,
    RunSummary,
    SearchGroup,
    StoreUnavailable,
    display_path,
    json_safe,
)
from dtwork.shared.records import DIVERGED, Kind, adaptive_decisions, batch_changes, divergence_text, finite
from dtwork.store import searches
from dtwork.store.rows import RunRow
from dtwork.store.runs import STORE_ERRORS, RunStore, default_store_path, store_problem
from dtwork.store.schema import NoRunsYet

if TYPE_CHECKING:
    from dtwork.plots.cell_view import CellView

T = TypeVar("T")

RUN_ID = re.compile(r"[0-9]{1,18}")
METRIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./:-]{0,127}")

SPARKLINE_POINTS = 48  # loss points per run in GET /dtwork/runs
DETAIL_POINTS = 200  # loss points in GET /dtwork/runs/<id>
BATCH_CHANGES = 16  # adaptive batch changes per run in GET /dtwork/runs and /dtwork/runs/<id>
DEFAULT_RUNS = 50  # runs listed by GET /dtwork/runs unless ?limit= says otherwise
MAX_RUNS = 500
MAX_SEARCHES = 10  # searches GET /dtwork/runs groups runs under (the newest)
CACHE_SIZE = 512
MAX_ENVIRON = 4096  # variables accepted with an export request
MAX_ENV_VALUE = 65536
MAX_BODY = 8 * 2**20  # bytes of a request body (a kernel's environment is far smaller)
READ_BUSY_SECONDS = 1.0  # how long a read waits for another program's lock (the panel polls every 2 s)

# The metric names each panel column reads, first found wins.
RANK_THROUGHPUT = "samples_per_s"  # each rank logs its own (runtime/loop/steps.py); the run's is their sum
THROUGHPUT_NAMES = ("samples_per_s",)
EFFICIENCY_NAMES = ("scaling_efficiency",)
B_SIMPLE_NAMES = ("b_simple",)
LOSS_NAME = "loss"


# -- the run store -----------------------------------------------------------------------------


@contextmanager
def open_store(root_dir: str, key: str = "", fallback: bool = False) -> Iterator[RunStore | None]:
    """The store ``key`` names (:func:`dtwork.server.stores.resolve`) opened read-only, or None when
    there is none yet (or it holds no runs)."""
    path = stores.resolve(root_dir, key, fallback)
    store = None
    if path.is_file():
        try:
            store = RunStore(path, readonly=True, busy_seconds=READ_BUSY_SECONDS)
        except NoRunsYet:
            pass
        except STORE_ERRORS as exc:
            if path.is_file():  # not just removed meanwhile
                raise _unavailable(exc, root_dir, path) from None
    if store is None:
        yield None
        return
    with store:
        try:
            yield store
        except (sqlite3.Error, OSError) as exc:  # pages damaged past the header, a lock
            raise _unavailable(exc, root_dir, path) from None


def _unavailable(exc: BaseException, root_dir: str, path: Path | None = None) -> StoreUnavailable:
    shown = display_path(str(path or default_store_path(root_dir)), root_dir)
    return StoreUnavailable(scrub(store_problem(exc, shown or "of this server")))


def parse_run_id(text: str) -> int:
    if not RUN_ID.fullmatch(text):
        raise NotFound(f"malformed run id {text[:40]!r}: run ids are whole numbers")
    return int(text)


def parse_cell_seq(text: str) -> int:
    if not RUN_ID.fullmatch(text):
        raise NotFound(f"malformed cell number {text[:40]!r}: cells are numbered 1, 2, ... in their run")
    return int(text)


def _require_run(store: RunStore | None, run_id: int) -> RunRow:
    if store is None:
        raise NotFound(f"no run {run_id}: the run store is empty (run a %%dtrain cell first)")
    try:
        return store.get_run(run_id)
    except DtworkError:
        raise NotFound(f"no run {run_id} in the run store") from None


def downsample(points: list[T], n: int) -> list[T]:
    """At most ``n`` points, evenly spaced by index, first and last kept."""
    if len(points) <= n:
        return points
    if n <= 1:
        return points[-1:]
    last = len(points) - 1
    return [points[round(i * last / (n - 1))] for i in range(n)]


def loss_points(store: RunStore, run_id: int, n: int) -> list[list[float]]:
    """``[[step, loss], ...]`` of the aggregated loss (rank 0's when none is aggregated); a long
    run's from its rollups' bucket means."""
    rows = store.metric_points(run_id, LOSS_NAME)[1] or store.metric_points(run_id, LOSS_NAME, rank=0)[1]
    pts = [[float(step), v] for step, value, _ in rows if (v := finite(value)) is not None]
    return downsample(pts, n)


def world_throughput(store: RunStore, run_id: int) -> float | None:
    """Samples/s over all ranks: the sum of each rank's latest ``samples_per_s`` (as plots.py)."""
    # the ranks' summaries of one name by the key's prefix: not every series of a 256-rank run
    latest = [v for x in store.rank_last_values(run_id, RANK_THROUGHPUT) if (v := finite(x)) is not None]
    return sum(latest) if latest else None


def adaptive_batch(store: RunStore, run_id: int, n: int = BATCH_CHANGES) -> AdaptiveBatch | None:
    """The adaptive batch's trajectory, or None for a run without adaptive decisions:
    ``changes`` ``[[step, global_batch], ...]`` at the decisions that changed it (at most ``n``, first
    and last kept; ``n_changes`` counts them all), and the last decision's ``global_batch`` and
    ``lr_factor``. Two indexed reads by name: a run that never adapted costs one empty one."""
    rows = [r for r in store.metrics(run_id, "global_batch") if r["kind"] == Kind.ADAPTIVE.value]
    if not rows:
        return None
    decisions = adaptive_decisions(rows + store.metrics(run_id, "lr_factor"))
    changes = [[step, v["global_batch"]] for step, v in batch_changes(decisions)]
    last = decisions[-1][1]
    return {
        "changes": downsample(changes, n),
        "n_changes": len(changes),
        "global_batch": finite(last.get("global_batch")),
        "lr_factor": finite(last.get("lr_factor")),
    }


def _pick(names: tuple[str, ...], values: Mapping[str, float]) -> float | None:
    """The first of ``names`` with a finite value."""
    return next((v for v in (finite(values.get(n)) for n in names) if v is not None), None)


_cache: dict[tuple[object, ...], object] = {}


def _cached(store: RunStore, row: RunRow, what: str, compute: Callable[[], T]) -> T:
    """Memoise per-run reads while the run has no new metrics (the panel polls every 2 s).

    The key holds the run's last step and cell count, so a finished run is read once and a
    running one again whenever it logs a new step.
    """
    key = (str(store.path), row["id"], row.get("last_step"), row.get("n_cells"), row.get("status"), what)
    if key not in _cache:
        if len(_cache) >= CACHE_SIZE:
            _cache.clear()
        _cache[key] = compute()
    return cast(T, _cache[key])


def forget() -> None:
    """Drop every memoised read: the next poll reads each run afresh (what a run that changed costs)."""
    _cache.clear()


def _run_summary(store: RunStore, row: RunRow, root_dir: str, n_points: int, key: str = "") -> RunSummary:
    """One run as the panel lists it (matches RunSummary in extension/src/types.ts); ``key``: its
    store's (:mod:`dtwork.server.stores`)."""
    last = _cached(store, row, "last", lambda: store.last_metrics(row["id"]))
    spark = _cached(store, row, f"loss{n_points}", lambda: loss_points(store, row["id"], n_points))
    return {
        "id": row["id"],
        "store": key,
        "name": row.get("name"),
        "status": row.get("status"),
        "created_at": row.get("created_at"),
        "ended_at": row.get("ended_at"),
        "world_size": row.get("world_size"),
        "backend": row.get("backend"),
        "cluster_id": row.get("cluster_id"),
        "notebook": display_path(row.get("notebook"), root_dir),
        "n_cells": row.get("n_cells"),
        "last_step": row.get("last_step"),
        "global_batch_size": row.get("global_batch_size"),
        "throughput": _cached(store, row, "tput", lambda: world_throughput(store, row["id"]))
        or _pick(THROUGHPUT_NAMES, last),
        "scaling_efficiency": _pick(EFFICIENCY_NAMES, last),
        "b_simple": _pick(B_SIMPLE_NAMES, last),
        "loss": _pick((LOSS_NAME,), last),
        "sparkline": spark,
        "diverged": _cached(store, row, "diverged", lambda: diverged_text(store, row["id"])),
        "adaptive_batch": _cached(store, row, "adaptive", lambda: adaptive_batch(store, row["id"])),
        "sparkline_colour": metric_colour(LOSS_NAME),  # the loss's colour in every figure
    }


def list_runs(root_dir: str, limit: int = DEFAULT_RUNS, rescan: bool = False) -> RunsReply:
    """GET /dtwork/runs: the newest ``limit`` runs of every store under the root first (a run's
    ``store`` says whose); ``total`` counts them all. A damaged default store answers 503; another
    damaged store is left out with a note, so one folder's broken file does not hide the rest."""
    scan = stores.stores(root_dir, rescan)
    notes = [scan.note] if scan.note else []
    rows: list[tuple[RunStore, str, RunRow]] = []
    groups: list[SearchGroup] = []
    exists = False
    with ExitStack() as opened:
        for key, path in scan.stores:
            try:
                store = opened.enter_context(open_store(root_dir, key))
            except StoreUnavailable as exc:
                if not key:
                    raise
                notes.append(str(exc))
                continue
            except NotFound:  # a folder's store removed since the walk
                continue
            exists = exists or path.is_file()
            if store is not None:
                rows += [(store, key, row) for row in store.list_runs()]
                groups += _searches(store, key)
        rows.sort(key=lambda r: (r[2].get("created_at") or 0.0, r[2]["id"]), reverse=True)
        runs = [_run_summary(store, row, root_dir, SPARKLINE_POINTS, key) for store, key, row in rows[:limit]]
        reply: RunsReply = {
            "store_exists": exists,
            "total": len(rows),
            "runs": runs,
            "searches": groups,
            "notes": notes,
        }
        return json_safe(reply)


def _searches(store: RunStore, key: str) -> list[SearchGroup]:
    """The newest searches with their tallies and their trials' runs, for the panel to group."""
    return [
        {
            "id": s["id"],
            "store": key,
            "label": s["label"],
            "searcher": s["searcher"],
            "status": s["status"],
            "metric": s["metric"],
            "best": s["best"],
            "trials": s["trials"],
            "running": s["running"],
            "stopped": s["stopped"],
            "done": s["done"],
            "failed": s["failed"],
            "run_ids": searches.run_ids(store.db, s),
        }
        for s in searches.list_searches(store.db)[:MAX_SEARCHES]
    ]


def get_run(root_dir: str, run_id: int, key: str = "") -> RunReply:
    """GET /dtwork/runs/<id>[?store=KEY]: the summary, every metric's latest value, the loss curve."""
    with open_store(root_dir, key) as store:
        row = _require_run(store, run_id)
        assert store is not None
        run: RunDetail = {
            **_run_summary(store, row, root_dir, DETAIL_POINTS, key),
            "last_metrics": store.last_metrics(run_id),
            "metric_names": store.metric_names(run_id),
            "per_slot_batch_size": row.get("per_slot_batch_size"),
            # one step axis per run: last_step is the run's highest step over all of them
            "segments": [
                {
                    "seq": seg["seq"],
                    "cell_seq": seg["cell_seq"],
                    "first_step": seg["first_step"],
                    "changed": seg["changed"],
                }
                for seg in store.segments(run_id)
            ],
        }
        reply: RunReply = {"run": run}
        return json_safe(reply)


def diverged_text(store: RunStore, run_id: int) -> str | None:
    """ "diverged at step k (loss nan)" after the run's first non-finite logged value, else None."""
    d = next((e["data"] for e in store.events(run_id, DIVERGED)), None)
    return None if d is None else divergence_text(d)


def run_metrics(root_dir: str, run_id: int, name: str, max_points: int, key: str = "") -> MetricsReply:
    """GET /dtwork/runs/<id>/metrics?name=NAME: the aggregated series of one metric."""
    if not METRIC_NAME.fullmatch(name):
        raise NotFound(f"malformed metric name {name[:40]!r}")
    with open_store(root_dir, key) as store:
        _require_run(store, run_id)
        assert store is not None
        names = store.metric_names(run_id)
        if name not in names:
            have = ", ".join(names) if names else "none yet"
            raise NotFound(f"run {run_id} has no metric {name!r}; its metrics: {have}")
        total, rows = store.metric_points(run_id, name, most=max_points)
        if not rows:
            total, rows = store.metric_points(run_id, name, rank=0, most=max_points)
        pts: list[list[float | None]] = [[step, value, stamp] for step, value, stamp in rows]
        reply: MetricsReply = {
            "run_id": run_id,
            "name": name,
            "total": total,
            "points": downsample(pts, max_points),
        }
        return json_safe(reply)


def cell_live(root_dir: str, run_id: int, seq: int, key: str = "") -> CellView:
    """GET /dtwork/runs/<id>/cells/<seq>: the cell's status, last step and figure so far (the view
    of a notebook reopened while the cell trains, and of its finished figures after). ``key``: the
    notebook's folder, whose store holds the run (the default store when that folder has none)."""
    from dtwork.plots.cell_view import cell_view  # plotly: loaded by the first reopened view only

    with open_store(root_dir, key, fallback=True) as store:
        _require_run(store, run_id)
        assert store is not None
        try:
            return json_safe(cell_view(store, run_id, seq))
        except DtworkError as exc:
            raise NotFound(
                f"{exc}: reopen the notebook that ran it, or list its cells with dtwork runs"
            ) from None


def require_run(root_dir: str, run_id: int, key: str = "") -> None:
    with open_store(root_dir, key) as store:
        _require_run(store, run_id)


# -- reports ---------------------------------------------------------------------------------

_ABS_PATH = re.compile(r"(?<![\w.])/[^\s'\",:;()]+")


def scrub(message: str) -> str:
    """Reduce every absolute path in a message to its file name."""
    return _ABS_PATH.sub(lambda m: Path(m.group(0)).name or "/", message)


def report_environ(body: bytes) -> dict[str, str]:
    """The kernel's environment sent with an export request: ``{"environ": {"NAME": "value"}}``.

    An empty body sends none; anything else that is not that shape is refused with a ValueError.
    """
    if len(body) > MAX_BODY:
        raise ValueError(f"the request body is {len(body)} bytes: at most {MAX_BODY} are taken")
    if not body.strip():
        return {}
    try:
        environ = json.loads(body).get("environ", {})
    except (AttributeError, UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: too deep
        raise ValueError('the request body must be JSON: {"environ": {"NAME": "value"}}') from None
    if (
        not isinstance(environ, dict)
        or len(environ) > MAX_ENVIRON
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_ENV_VALUE for k, v in environ.items()
        )
    ):
        raise ValueError(
            f"environ must map names to strings (at most {MAX_ENVIRON}, {MAX_ENV_VALUE} chars each)"
        )
    return environ


def export_report(
    root_dir: str, run_id: int, environ: dict[str, str] | None = None, key: str = ""
) -> ReportReply:
    """POST /dtwork/runs/<id>/report[?store=KEY]: ``dtwork.report.export`` into ``<root>/reports/``
    (a folder's store's run: into ``<root>/<folder>/reports/``, beside its notebook).

    Secrets are scrubbed with the kernel's ``environ`` (sent by the client) and the server's own:
    the server's alone would miss what only the kernel holds.
    Returns the notebook's path relative to the server root, for the panel to open.
    """
    require_run(root_dir, run_id, key)
    try:
        module = importlib.import_module("dtwork.report")
        export = module.export
    except (ImportError, AttributeError) as exc:
        raise ReportUnavailable(
            f"report export is not available in this dtwork install ({type(exc).__name__}: {scrub(str(exc))})"
        ) from None
    target = Path(root_dir, *PurePosixPath(key).parts) / "reports" / f"run-{run_id}.ipynb"
    kwargs: dict[str, Any] = {}
    try:
        params = set(inspect.signature(export).parameters)
    except (TypeError, ValueError):
        params = set()
    if "store" in params:
        kwargs["store"] = stores.resolve(root_dir, key)
    if "environ" in params:
        kwargs["environ"] = {**os.environ, **(environ or {})}
    try:
        result = export(run_id, target, **kwargs)
    except DtworkError as exc:
        raise ReportFailed(f"run {run_id} cannot be exported: {scrub(str(exc))}", status=409) from exc
    except (sqlite3.Error, OSError) as exc:  # the store broke while the report read it
        raise _unavailable(exc, root_dir, stores.resolve(root_dir, key)) from exc
    except Exception as exc:
        raise ReportFailed(f"exporting run {run_id} failed: {type(exc).__name__}: {scrub(str(exc))}") from exc
    written = getattr(result, "path", result)
    path = Path(written) if isinstance(written, (str, os.PathLike)) else target
    try:
        rel = path.resolve().relative_to(Path(root_dir).resolve())
    except ValueError:
        raise ReportFailed(
            f"run {run_id}'s report was written outside the Jupyter root ({path.name}): open it from there"
        ) from None
    return {"run_id": run_id, "path": rel.as_posix()}
