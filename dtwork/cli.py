"""``dtwork runs list|show|compare|export``: the run store from a shell.

The store is ``--store`` (an .sqlite file, a folder or a notebook: then the ``.dtwork/runs.sqlite``
beside it), else ``$DTWORK_STORE``, else ``./.dtwork/runs.sqlite``. Output is plain text laid out
for a terminal; ``--json`` prints the same facts as JSON for scripts. Other commands (``run``,
``script``, ``doctor``) go to ``python -m dtwork``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from dtwork.errors import DtworkError
from dtwork.export import run_result
from dtwork.store import RunStore, default_store_path

__all__ = ["main", "store_path"]


def store_path(where: str | None) -> Path:
    """The store file named by ``--store``: a file as is; a folder or notebook: ``.dtwork/runs.sqlite`` there."""
    if not where:
        return default_store_path()
    path = Path(where).expanduser().absolute()
    if path.is_dir():
        return path / ".dtwork" / "runs.sqlite"
    if path.suffix == ".ipynb":
        return path.parent / ".dtwork" / "runs.sqlite"
    return path


# -- reading a run ----------------------------------------------------------------------------------


def _summary(store: RunStore, run_id: int | str) -> dict[str, Any]:
    run = store.get_run(run_id)
    rid = run["id"]
    metrics: dict[str, dict[str, Any]] = {}
    for m in store.metrics(rid):
        if m["value"] is None:
            continue
        entry = metrics.setdefault(m["name"], {"count": 0, "min": math.inf, "max": -math.inf})
        entry["count"] += 1
        entry["min"], entry["max"] = min(entry["min"], m["value"]), max(entry["max"], m["value"])
        entry["last"], entry["last_step"] = m["value"], m["step"]
    ended = run.get("ended_at")
    return {
        "id": rid,
        "name": run.get("name"),
        "status": run["status"],
        "started": run["created_at"],
        "ended": ended,
        "seconds": (ended - run["created_at"]) if ended else None,
        "world_size": run.get("world_size"),
        "backend": run.get("backend"),
        "global_batch_size": run.get("global_batch_size"),
        "per_slot_batch_size": run.get("per_slot_batch_size"),
        "cells": run.get("n_cells"),
        "steps": run.get("last_step"),
        "result": run_result(store, run),
        "metrics": metrics,
        "scaling": [r["data"] for r in store.results(rid, kind="scaling")],
        "events": len(store.events(rid)),
        "notebook": run.get("notebook"),
    }


# -- text layout -----------------------------------------------------------------------------------


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    return str(value)


def _when(stamp: float | None) -> str:
    return datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M") if stamp else "-"


def _table(header: Sequence[str], rows: list[list[str]], right: set[int]) -> str:
    lines = [list(header), *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for line in lines:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def _result_text(result: dict[str, Any] | None) -> str:
    if not result:
        return "-"
    if result["best"] is None:
        return f"{result['metric']} -"
    return f"{result['metric']} {_num(result['best'])} @{result['step']}"


# -- commands --------------------------------------------------------------------------------------


def _cmd_list(store: RunStore, ns: argparse.Namespace) -> str:
    runs = store.list_runs()
    if ns.json:
        return json.dumps([{**run, "result": run_result(store, run)} for run in runs], default=str, indent=1)
    if not runs:
        return f"no runs yet in {store.path}: run a %%dtrain cell to start one"
    rows = [
        [
            str(run["id"]),
            run.get("name") or "-",
            run["status"],
            _num(run.get("world_size")),
            _num(run.get("global_batch_size")),
            _num(run.get("last_step")),
            _result_text(run_result(store, run)),
            _when(run.get("created_at")),
        ]
        for run in runs
    ]
    header = ("id", "name", "status", "ranks", "batch", "steps", "result", "started")
    return f"{store.path}\n" + _table(header, rows, right={0, 3, 4, 5})


def _cmd_show(store: RunStore, ns: argparse.Namespace) -> str:
    s = _summary(store, ns.run)
    if ns.json:
        return json.dumps(s, default=str, indent=1)
    seconds = f" ({s['seconds']:.0f} s)" if s["seconds"] is not None else ""
    lines = [
        f"run {s['id']}  {s['name'] or '-'}  {s['status']}",
        f"  started   {_when(s['started'])}, ended {_when(s['ended'])}{seconds}",
        f"  ranks     {_num(s['world_size'])} ({s['backend'] or '-'}), global batch {_num(s['global_batch_size'])}"
        f" = {_num(s['per_slot_batch_size'])} per slot",
        f"  cells     {_num(s['cells'])}, steps {_num(s['steps'])}, events {s['events']}",
        f"  result    {_result_text(s['result'])}",
    ]
    if s["metrics"]:
        rows = [
            [name, str(m["count"]), _num(m["last"]), str(m["last_step"]), _num(m["min"]), _num(m["max"])]
            for name, m in sorted(s["metrics"].items())
        ]
        lines += [
            "",
            _table(("metric", "points", "last", "at step", "min", "max"), rows, right={1, 2, 3, 4, 5}),
        ]
    for sweep in s["scaling"]:
        points = ", ".join(f"{p['world_size']}: {_num(p['throughput'])}/s" for p in sweep.get("points", []))
        lines.append(f"  scaling   {sweep.get('mode', '?')}: {points}")
    return "\n".join(lines)


def _cmd_compare(store: RunStore, ns: argparse.Namespace) -> str:
    a, b = _summary(store, ns.run_a), _summary(store, ns.run_b)
    names = sorted(set(a["metrics"]) | set(b["metrics"]))
    plot = Path(ns.plot or f"runs-{a['id']}-vs-{b['id']}.html").absolute()
    _compare_plot(store, a, b, names, plot)
    if ns.json:
        keep = ("id", "name", "status", "world_size", "global_batch_size", "steps", "result", "metrics")
        return json.dumps(
            {"a": {k: a[k] for k in keep}, "b": {k: b[k] for k in keep}, "plot": str(plot)}, default=str
        )
    head = [
        ["name", a["name"] or "-", b["name"] or "-", ""],
        ["status", a["status"], b["status"], ""],
        ["ranks", _num(a["world_size"]), _num(b["world_size"]), ""],
        ["global batch", _num(a["global_batch_size"]), _num(b["global_batch_size"]), ""],
        ["steps", _num(a["steps"]), _num(b["steps"]), ""],
        ["result", _result_text(a["result"]), _result_text(b["result"]), ""],
    ]
    rows = []
    for name in names:
        va, vb = a["metrics"].get(name, {}).get("last"), b["metrics"].get(name, {}).get("last")
        change = f"{(vb - va) / abs(va):+.1%}" if va and vb is not None else "-"
        rows.append([f"{name} (last)", _num(va), _num(vb), change])
    table = _table(("", f"run {a['id']}", f"run {b['id']}", "b vs a"), head + rows, right={1, 2, 3})
    return f"{table}\nplot: {plot}"


def _compare_plot(
    store: RunStore, a: dict[str, Any], b: dict[str, Any], names: list[str], path: Path
) -> None:
    """One panel per metric with both runs' curves, written as a standalone HTML file."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    shown = names[:12] or ["(no metrics)"]
    fig = make_subplots(rows=len(shown), cols=1, subplot_titles=shown, shared_xaxes=True)
    for row, name in enumerate(shown, start=1):
        for run, color in ((a, "#1f77b4"), (b, "#d62728")):
            points = [
                (m["step"], m["value"]) for m in store.metrics(run["id"], name) if m["value"] is not None
            ]
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in points],
                    y=[p[1] for p in points],
                    name=f"run {run['id']}",
                    legendgroup=str(run["id"]),
                    showlegend=row == 1,
                    line={"color": color},
                ),
                row=row,
                col=1,
            )
    fig.update_layout(height=220 * len(shown) + 80, title=f"run {a['id']} vs run {b['id']}")
    fig.update_xaxes(title_text="step", row=len(shown), col=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(path), include_plotlyjs=True)


def _cmd_export(store: RunStore, ns: argparse.Namespace) -> str:
    if not (ns.report or ns.tensorboard or ns.mlflow):
        raise DtworkError("dtwork runs export: say where: --report PATH, --tensorboard DIR or --mlflow URI")
    lines = []
    if ns.report:
        from dtwork.report import export

        report = export(ns.run, ns.report, store=store.path, html=ns.html)
        lines.append(f"report: {getattr(report, 'path', ns.report)}")
    if ns.tensorboard:
        from dtwork.export.tensorboard import export_tensorboard

        folders = export_tensorboard(store, ns.tensorboard, ns.run)
        lines.append(f"tensorboard: {len(folders)} run(s) in {Path(ns.tensorboard).absolute()}")
        lines.append(f"  view them: tensorboard --logdir {Path(ns.tensorboard).absolute()}")
    if ns.mlflow:
        from dtwork.export.mlflow import export_mlflow

        ids = export_mlflow(store, ns.mlflow, ns.run, report=not ns.no_report)
        lines.append(f"mlflow: {len(ids)} run(s) logged to {ns.mlflow} ({', '.join(ids)})")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dtwork", description="dtwork's run store from the shell")
    top = parser.add_subparsers(dest="command", required=True)
    runs = top.add_parser("runs", help="list, show, compare and export runs")
    runs.add_argument(
        "--store", help="run store: an .sqlite file, or a folder/notebook with .dtwork/ beside it"
    )
    sub = runs.add_subparsers(dest="action", required=True)
    p = sub.add_parser("list", help="every run, newest first")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("show", help="one run's summary")
    p.add_argument("run", help="run id")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("compare", help="two runs side by side, with a plot written to a file")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--plot", help="HTML file for the plot (default: runs-A-vs-B.html)")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("export", help="a run as a report, TensorBoard event files or MLflow runs")
    p.add_argument("run", nargs="?", default=None, help="run id (TensorBoard/MLflow: all runs when left out)")
    p.add_argument("--report", metavar="PATH", help="write the report notebook here")
    p.add_argument("--html", action="store_true", help="with --report: also the HTML beside it")
    p.add_argument("--tensorboard", metavar="DIR")
    p.add_argument("--mlflow", metavar="URI", help="tracking server, sqlite:///x.db or folder")
    p.add_argument("--no-report", action="store_true", help="with --mlflow: no report artifact")
    for action in sub.choices.values():
        action.add_argument("--store", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


_COMMANDS = {"list": _cmd_list, "show": _cmd_show, "compare": _cmd_compare, "export": _cmd_export}


def main(argv: Sequence[str] | None = None) -> int:
    """The ``dtwork`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] != "runs" and not args[0].startswith("-"):
        from dtwork.__main__ import main as module_main

        return int(module_main(args) or 0)
    ns = _parser().parse_args(args)
    try:
        if ns.action == "export" and ns.report and ns.run is None:
            raise DtworkError(
                "dtwork runs export --report needs a run id: dtwork runs export RUN --report PATH"
            )
        with RunStore(store_path(ns.store), readonly=True) as store:
            print(_COMMANDS[ns.action](store, ns))
    except DtworkError as exc:
        print(f"dtwork: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `dtwork runs list | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return 0


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def format_runs_table(runs: list[dict[str, Any]], path: str | os.PathLike[str] | None = None) -> str:
    """A plain-text table of runs (as from :meth:`RunStore.list_runs`) for ``%dtrain runs``."""
    if not runs:
        where = f" in {path}" if path is not None else ""
        return f"no runs yet{where}: run a %%dtrain cell to start one"
    header = ("id", "name", "status", "ranks", "backend", "steps", "started")
    fields = ("id", "name", "status", "world_size", "backend", "last_step")
    rows = [[*(_cell(run.get(f)) for f in fields), _when(run.get("created_at"))] for run in runs]
    return _table(header, rows, right={0, 3, 5})
