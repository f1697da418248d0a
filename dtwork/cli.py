"""The command line, one parser for ``dtwork`` and ``python -m dtwork``.

``runs list|searches|show|compare|export``: the run store from a shell (``list --search ID``: a search's
trials; ``export --search ID --report PATH``: a search's report). The store is ``--store`` (an .sqlite
file, a folder or a notebook: then the ``.dtwork/runs.sqlite`` beside it), else ``$DTWORK_STORE``,
else ``./.dtwork/runs.sqlite``. Output is plain text laid out for a terminal; ``--json`` prints the
same facts as JSON for scripts.

``run NOTEBOOK``: execute a notebook headlessly, write the executed copy under reports/.
``script NOTEBOOK -o train.py``: write its ``%%dtrain`` cells as a torchrun script.
``doctor [--gpu]``: check this installation end to end and print a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from dtwork.commands.run_labels import changed, hparams_text
from dtwork.commands.searches import searches_text, trials_text
from dtwork.errors import DtworkError, did_you_mean
from dtwork.shared.records import DIVERGED, Kind, divergence_text, is_own, segment_text
from dtwork.shared.text import number as _num
from dtwork.shared.text import printable
from dtwork.shared.text import table as _table
from dtwork.store.results import run_result
from dtwork.store.runs import STORE_ERRORS, RunStore, store_path, store_problem

__all__ = ["main", "printable", "run_notebook", "runs_table"]

_COLOUR = re.compile("\x1b\\[[0-9;]*m")  # a traceback's colours: dropped rather than shown escaped


# -- reading a run ----------------------------------------------------------------------------------


def _summary(store: RunStore, run_id: int | str) -> dict[str, Any]:  # Any: what --json prints
    run = store.get_run(run_id)
    rid = run["id"]
    metrics: dict[str, dict[str, Any]] = {}
    own: dict[str, tuple[int, float | None]] = {}  # dtwork's measurements: name -> (step, latest value)
    for m in sorted((s for s in store.series(rid) if s["rank"] is None), key=lambda s: s["last_step"]):
        if is_own(m):
            own[m["name"] if m["kind"] != Kind.SCALING else Kind.SCALING.value] = (
                m["last_step"],
                m["last_value"],
            )
        elif m["last_value"] is not None or m["lo"] is not None:  # a NaN has no order: min and max skip it
            metrics[m["name"]] = {
                "count": m["n"],
                "min": math.inf if m["lo"] is None else m["lo"],
                "max": -math.inf if m["hi"] is None else m["hi"],
                "last": m["last_value"],
                "last_step": m["last_step"],
            }
    metrics = dict(sorted(metrics.items()))
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
        "measured": own,
        "scaling": [r["data"] for r in store.results(rid, kind="scaling")],
        "events": len(store.events(rid)),
        "diverged": next((e["data"] for e in store.events(rid, DIVERGED)), None),
        "segments": store.segments(rid),
        "notebook": run.get("notebook"),
    }


# -- text layout -----------------------------------------------------------------------------------


def _when(stamp: float | None) -> str:
    return datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M") if stamp else "-"


def _result_text(result: Mapping[str, object] | None) -> str:
    if not result:
        return "-"
    if result["best"] is None:
        return f"{result['metric']} -"
    return f"{result['metric']} {_num(result['best'])} @{result['step']}"


# -- commands --------------------------------------------------------------------------------------


def _no_runs(path: Path) -> str:
    return f"no runs yet in {path}: run a %%dtrain cell to start one"


def _list_text(store: RunStore) -> str:
    runs = store.list_runs()
    if not runs:
        return _no_runs(store.path)
    differ = changed(store, runs)  # what tells the listed runs apart: lr, optimizer, ctx.hparams, ...
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
            differ[run["id"]][:60],
        ]
        for run in runs
    ]
    header = ("id", "name", "status", "ranks", "batch", "steps", "result", "started", "changed")
    return f"{store.path}\n" + _table(header, rows, right={0, 3, 4, 5})


def runs_table(path: Path) -> str:
    """The runs table of the store at ``path`` (``dtwork runs list``, ``%dtrain runs``); a store not
    written yet has no runs."""
    if not path.is_file():
        return _no_runs(path)
    try:
        with RunStore(path, readonly=True) as store:
            return printable(_list_text(store))
    except sqlite3.Error as exc:  # damaged past its header, or locked: one line, as `dtwork runs` says
        raise DtworkError(printable(store_problem(exc, path))) from None


def _cmd_list(store: RunStore, ns: argparse.Namespace) -> str:
    if ns.search is not None:
        return trials_text(store, ns.search, ns.json)
    if ns.json:
        runs = store.list_runs()
        return json.dumps([{**run, "result": run_result(store, run)} for run in runs], default=str, indent=1)
    return _list_text(store)


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
        f"  hparams   {hparams_text(store, store.get_run(s['id']))}",
        f"  result    {_result_text(s['result'])}",
    ]
    if (measured := _measured_text(s["measured"])) is not None:
        lines.append(f"  measured  {measured}")
    if s["diverged"]:
        lines.append(f"  {divergence_text(s['diverged']).replace('diverged', 'diverged ', 1)}")
    if len(s["segments"]) > 1:  # one step axis: where each training cell began on it
        lines.append(f"  segments  {'; '.join(segment_text(seg) for seg in s['segments'])}")
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


def _measured_text(own: dict[str, tuple[int, float | None]]) -> str | None:
    """dtwork's own latest measurements, apart from the user's metrics: B_simple with its interval
    and the scaling efficiency estimate."""
    parts = []
    if "b_simple" in own:
        step, value = own["b_simple"]
        lo, hi = own.get("b_simple_lo", (None, None))[1], own.get("b_simple_hi", (None, None))[1]
        interval = f" (95% interval {_num(lo)}-{_num(hi)})" if lo is not None and hi is not None else ""
        parts.append(f"B_simple {_num(value)}{interval} at step {step}")
    if (eff := own.get(Kind.SCALING.value, (None, None))[1]) is not None:
        parts.append(f"scaling efficiency {eff:.0%}")
    return "; ".join(parts) or None


def _cmd_compare(store: RunStore, ns: argparse.Namespace) -> str:
    if len(ns.runs) < 2:
        raise DtworkError("dtwork runs compare takes two runs or more: dtwork runs compare 2 3 4")
    runs = [_summary(store, r) for r in ns.runs]
    names = sorted({name for s in runs for name in s["metrics"]})
    plot = _write_compare(store, runs, names, ns.out)
    if ns.json:
        keep = (
            "id",
            "name",
            "status",
            "world_size",
            "global_batch_size",
            "steps",
            "segments",
            "result",
            "metrics",
        )
        return json.dumps({"runs": [{k: s[k] for k in keep} for s in runs], "plot": str(plot)}, default=str)

    def line(label: str, cells: Iterable[str], change: str = "") -> list[str]:
        return [label, *cells, change]

    head = [
        line("name", (s["name"] or "-" for s in runs)),
        line("status", (s["status"] for s in runs)),
        line("ranks", (_num(s["world_size"]) for s in runs)),
        line("global batch", (_num(s["global_batch_size"]) for s in runs)),
        line("steps", (_num(s["steps"]) for s in runs)),
        line("segments", (_segment_steps(s["segments"]) for s in runs)),
        line("result", (_result_text(s["result"]) for s in runs)),
    ]
    rows = []
    for name in names:
        last = [s["metrics"].get(name, {}).get("last") for s in runs]
        first = last[0]
        changes = [f"{(v - first) / abs(first):+.1%}" if first and v is not None else "-" for v in last[1:]]
        rows.append(line(f"{name} (last)", map(_num, last), ", ".join(changes)))
    vs = f"vs run {runs[0]['id']}"
    columns = ("", *(f"run {s['id']}" for s in runs), vs)
    table = _table(columns, head + rows, right=set(range(1, len(runs) + 2)))
    return f"{table}\nplot: {plot}"


def _write_compare(store: RunStore, runs: list[dict[str, Any]], names: list[str], out: str | None) -> Path:
    """Write the compare figure: to ``out`` as one file when asked, else beside the store (its
    ``compare/`` folder, sharing one copy of plotly.js), never into the notebook's folder unasked."""
    from dtwork.plots import compare_figure

    fig = compare_figure(
        [(s["id"], store.figure_rows(s["id"], rank="aggregated")) for s in runs],
        names,
        [[seg["first_step"] for seg in s["segments"]] for s in runs],
    )
    ids = "-".join(str(s["id"]) for s in runs)
    if out:
        plot = Path(out).absolute()
        plot.parent.mkdir(parents=True, exist_ok=True)
        fig.write_html(str(plot), include_plotlyjs=True)
        return plot
    for folder in (store.path.parent / "compare", Path(tempfile.gettempdir()) / "dtwork-compare"):
        try:  # a store on a read-only mount: the temp folder
            folder.mkdir(parents=True, exist_ok=True)
            fig.write_html(str(folder / f"runs-{ids}.html"), include_plotlyjs="directory")
            return folder / f"runs-{ids}.html"
        except OSError:
            continue
    raise DtworkError(
        f"the compare plot could not be written beside {store.path} nor in the temp folder: use --out PATH"
    )


def _segment_steps(segments: Iterable[Mapping[str, object]]) -> str:
    """Where a run's segments began on its step axis: "0, 20"."""
    return ", ".join(str(seg["first_step"]) for seg in segments) or "-"


def _cmd_export(store: RunStore, ns: argparse.Namespace) -> str:
    if ns.search is not None and not ns.report:
        raise DtworkError("dtwork runs export --search ID writes the search's report: add --report PATH")
    if not (ns.report or ns.tensorboard or ns.mlflow):
        raise DtworkError("dtwork runs export: say where: --report PATH, --tensorboard DIR or --mlflow URI")
    lines = []
    if ns.report and ns.search is not None:
        from dtwork.report.search import export_search

        lines.append(f"report: {export_search(ns.search, ns.report, store=store.path, html=ns.html).path}")
    elif ns.report:
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


def run_notebook(path: Path, out_dir: Path, timeout: int = 900) -> Path:
    """Execute ``path`` with nbclient (cwd: the notebook's folder); write ``out_dir/<name>``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / path.name
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(Path.cwd())}}
    )
    t0 = time.monotonic()
    print(printable(f"dtwork: executing {path} ({len(nb.cells)} cells) ..."), flush=True)
    try:
        client.execute()
    except CellExecutionError as exc:
        nbformat.write(nb, out)
        text = _COLOUR.sub("", f"dtwork: {path} failed; the partial run is in {out}\n{exc}")
        print(printable(text), file=sys.stderr)
        raise SystemExit(1) from None
    nbformat.write(nb, out)
    print(printable(f"dtwork: executed {path} in {time.monotonic() - t0:.0f} s -> {out}"), flush=True)
    return out


def _runs_parser(runs: argparse.ArgumentParser) -> None:
    runs.add_argument(
        "--store", help="run store: an .sqlite file, or a folder/notebook with .dtwork/ beside it"
    )
    sub = runs.add_subparsers(dest="action", required=True)
    p = sub.add_parser("list", help="every run, newest first (--search ID: that search's trial runs)")
    p.add_argument(
        "--search", metavar="ID", help="list this search's trials: run, status, metric, hyperparameters"
    )
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("searches", help="every search: status, best so far, trials running, stopped, done")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("show", help="one run's summary")
    p.add_argument("run", help="run id")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("compare", help="runs side by side, with a plot written to a file")
    p.add_argument("runs", nargs="+", metavar="RUN", help="two run ids or more")
    p.add_argument(
        "--out", "--plot", help="HTML file for the plot (default: compare/runs-A-B.html beside the store)"
    )
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("export", help="a run as a report, TensorBoard event files or MLflow runs")
    p.add_argument("run", nargs="?", default=None, help="run id (TensorBoard/MLflow: all runs when left out)")
    p.add_argument("--search", metavar="ID", help="with --report: the search's report instead of a run's")
    p.add_argument("--report", metavar="PATH", help="write the report notebook here")
    p.add_argument("--html", action="store_true", help="with --report: also the HTML beside it")
    p.add_argument("--tensorboard", metavar="DIR")
    p.add_argument("--mlflow", metavar="URI", help="tracking server, sqlite:///x.db or folder")
    p.add_argument("--no-report", action="store_true", help="with --mlflow: no report artifact")
    for action in sub.choices.values():
        action.add_argument("--store", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


class _HintParser(argparse.ArgumentParser):
    """argparse whose errors end with the closest command or option to a mistyped one."""

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            names = re.findall(r"'([^']*)'", choice.group(2)) or choice.group(2).split(", ")
            message += did_you_mean(choice.group(1), names)
        elif message.startswith("unrecognized arguments:"):
            typed = [t.split("=", 1)[0] for t in message.split(":", 1)[1].split() if t.startswith("--")]
            if typed:  # subcommands' unknown options surface here, on the top parser
                message += did_you_mean(typed[0], sorted(_options(self)))
        super().error(message)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every long option of a parser and of its subcommands, recursively."""
    found = {o for o in parser._option_string_actions if o.startswith("--")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
    return found


def cli_parser(prog: str = "dtwork") -> argparse.ArgumentParser:
    """The ``dtwork`` command's parser, its subcommands nested (docs/reference.md is checked against it)."""
    parser = _HintParser(prog=prog, description="dtwork from the shell: runs, notebooks, checks")
    top = parser.add_subparsers(dest="command", required=True)
    _runs_parser(top.add_parser("runs", help="list, show, compare and export runs"))
    run = top.add_parser("run", help="execute a notebook headlessly")
    run.add_argument("notebook", type=Path)
    run.add_argument("--out", type=Path, default=Path("reports"))
    run.add_argument("--timeout", type=int, default=900)
    script = top.add_parser("script", help="write a notebook's %%%%dtrain cells as a torchrun script")
    script.add_argument("notebook", type=Path)
    script.add_argument("-o", "--output", type=Path, default=None, help="default: NOTEBOOK.py beside it")
    clusters = top.add_parser("clusters", help="this user's clusters here: who drives them, kept time left")
    clusters.add_argument("action", choices=["list", "stop"])
    clusters.add_argument("cluster_id", nargs="?", default=None, help="the cluster to stop")
    doctor = top.add_parser("doctor", help="check this installation end to end (--gpu: the GPU path too)")
    doctor.add_argument("--gpu", action="store_true", help="also check NCCL, AMP and throughput on the GPUs")
    doctor.add_argument("-n", type=int, default=2, help="CPU ranks for the CPU checks (default 2)")
    top.add_parser("help", help="where the reference is; TOPIC: one section").add_argument("topic", nargs="?")
    return parser


_COMMANDS = {
    "list": _cmd_list,
    "searches": lambda store, ns: searches_text(store, ns.json),
    "show": _cmd_show,
    "compare": _cmd_compare,
    "export": _cmd_export,
}


def _runs(ns: argparse.Namespace) -> int:
    path: Path | str = ns.store or "the default run store"  # until store_path has answered
    try:
        if ns.action == "export" and ns.report and ns.run is None and ns.search is None:
            raise DtworkError(
                "dtwork runs export --report needs a run id: dtwork runs export RUN --report PATH"
            )
        path = store_path(ns.store)
        with RunStore(path, readonly=True) as store:
            print(printable(_COMMANDS[ns.action](store, ns)))
    except BrokenPipeError:  # `dtwork runs list | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    except DtworkError as exc:
        print(printable(f"dtwork: {exc}"), file=sys.stderr)
        return 1
    except STORE_ERRORS as exc:  # damaged, locked or unreadable: one line, no traceback
        print(printable(f"dtwork: {store_problem(exc, path)}"), file=sys.stderr)
        return 1
    return 0


def _script(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> int:
    from dtwork.commands.script_export import write_script

    try:
        out = write_script(ns.notebook, ns.output or ns.notebook.with_suffix(".py"))
    except DtworkError as exc:
        parser.exit(2, printable(f"dtwork: {exc}") + "\n")
    print(printable(f"dtwork: wrote {out}; run it with torchrun --nproc_per_node=N {out}"))
    return 0


def _clusters(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> int:
    from dtwork.commands.keep import clusters

    if ns.action == "stop" and not ns.cluster_id:
        parser.error("dtwork clusters stop needs the cluster's id: dtwork clusters list shows them")
    try:
        print(printable(clusters(ns.action, ns.cluster_id)))
    except DtworkError as exc:
        print(printable(f"dtwork: {exc}"), file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "dtwork") -> int:
    """The ``dtwork`` console script and ``python -m dtwork``; returns the exit status."""
    parser = cli_parser(prog)
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if ns.command == "runs":
        return _runs(ns)
    if ns.command == "clusters":
        return _clusters(parser, ns)
    if ns.command == "help":
        from dtwork.commands.reference import help_text

        try:
            print(printable(help_text(ns.topic)))
        except DtworkError as exc:
            print(printable(f"dtwork: {exc}"), file=sys.stderr)
            return 1
        return 0
    if ns.command == "doctor":
        from dtwork.commands.doctor import main as run_doctor

        return run_doctor(gpu=ns.gpu, n=ns.n)
    if not ns.notebook.exists():
        parser.error(f"no notebook at {ns.notebook}")
    if ns.command == "script":
        return _script(parser, ns)
    run_notebook(ns.notebook, ns.out, ns.timeout)
    return 0
