"""A search's report: the best trial and its hyperparameters, every trial's curve of the searcher's metric,
and a parallel-coordinates figure of hyperparameters against it; then the re-run.

Built as a run's report is (:mod:`dtwork.report.build`): the trials and their curves are embedded as
``SEARCH`` in a collapsed data cell, and the cells after it draw the summary and figures from it with
:func:`items` (the exporter fills their outputs with the same call, so re-executing the notebook shows
the same numbers). The re-run writes the search file, starts a cluster of the search's shape and runs
``%%dtrain search`` with the trials' code, recording into a store beside the report.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict, cast

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from dtwork import plots
from dtwork.report import helpers
from dtwork.report.build import CONFIG_TAG, DATA_TAG, RERUN_STORE, code_span, escape, now, table
from dtwork.report.scrub import SCRUBBED, Scrubber
from dtwork.report.write import target_path, to_html, write_text
from dtwork.store import searches
from dtwork.store.rows import SearchRow
from dtwork.store.runs import RunStore

__all__ = ["SearchReport", "SearchTrial", "Searched", "export_search", "items", "search_notebook"]

FIGURES_CELL = """from dtwork.report import helpers, search

helpers.show(search.items(SEARCH))"""


class SearchTrial(TypedDict):
    number: int
    run_id: int | None
    status: str
    metric: float | None
    hparams: dict[str, Any]  # JSON as the search file nests them
    curve: list[list[float]]  # [step, value] of the searcher's metric, aggregated over ranks


class Searched(TypedDict):
    """What a search report embeds as ``SEARCH`` (JSON)."""

    search_id: int
    label: str
    searcher: str
    metric: str | None
    smaller_is_better: bool
    trials: list[SearchTrial]


@dataclass
class SearchReport:
    """What :func:`export_search` wrote."""

    path: Path
    html_path: Path | None
    search_id: int
    scrubbed: list[str] = field(default_factory=list)

    def describe(self) -> str:
        html = f" and {self.html_path.name}" if self.html_path else ""
        return f"dtwork: wrote search {self.search_id}'s report to {self.path}{html}"


def _best(data: Searched) -> SearchTrial | None:
    scored = [t for t in data["trials"] if t["metric"] is not None and math.isfinite(t["metric"])]
    sign = 1.0 if data["smaller_is_better"] else -1.0
    return min(scored, key=lambda t: (sign * cast(float, t["metric"]), t["number"]), default=None)


def items(data: Searched) -> list[helpers.Item]:
    """The best trial, a line per trial, and the figures: every trial's curve, hyperparameters against
    the metric (when the search has a metric)."""
    metric, best = data["metric"] or "metric", _best(data)
    out: list[helpers.Item] = []
    if best is None:
        out.append(f"No trial has a finite {metric}.")
    else:
        hps = ", ".join(f"{k}={v!r}" for k, v in plots.flat_hparams(best["hparams"]).items()) or "none"
        out.append(f"Best: trial {best['number']} (run {best['run_id']}) {metric}={best['metric']!r}; {hps}")
    for t in data["trials"]:
        value = "-" if t["metric"] is None else repr(t["metric"])
        out.append(f"  trial {t['number']}: run {t['run_id']}, {t['status']}, {metric}={value}")
    if data["metric"] is not None:
        curves = [(t["number"], [(int(s), float(v)) for s, v in t["curve"]]) for t in data["trials"]]
        out.append(plots.trial_curves_figure(curves, metric, best and best["number"]))
        scored = [(t["hparams"], t["metric"]) for t in data["trials"] if t["metric"] is not None]
        out.append(plots.parallel_figure(scored, metric, data["smaller_is_better"]))
    return out


def _searched(store: RunStore, s: SearchRow, scrub: Scrubber) -> Searched:
    trials: list[SearchTrial] = []
    for t in searches.trials(store.db, s["id"]):
        curve: list[list[float]] = []
        if t["run_id"] is not None and s["metric"] is not None and store.find_run(t["run_id"]) is not None:
            curve = [[r["step"], r["value"]] for r in store.figure_rows(t["run_id"], rank="aggregated")
                     if r["name"] == s["metric"] and r["value"] is not None]  # fmt: skip
        hp = scrub.data(t["hparams"], f"trial {t['number']}")
        trials.append(
            {
                "number": t["number"],
                "run_id": t["run_id"],
                "status": t["status"],
                "metric": t["metric"],
                "hparams": hp,
                "curve": curve,
            }  # fmt: skip
        )
    return {
        "search_id": s["id"],
        "label": scrub.text(s["label"], "search file name"),
        "searcher": s["searcher"],
        "metric": s["metric"],
        "smaller_is_better": s["smaller_is_better"],
        "trials": trials,
    }


def _header(store: RunStore, s: SearchRow, data: Searched) -> str:
    started = datetime.fromtimestamp(s["started_at"]).astimezone().strftime("%Y-%m-%d %H:%M")
    best = _best(data)
    order = "smaller" if s["smaller_is_better"] else "larger"
    pairs: list[tuple[str, object]] = [
        ("searcher", s["searcher"]),
        ("metric", f"{s['metric'] or '-'} ({order} is better)"),
        ("trials", f"{s['trials']}: {s['done']} completed, {s['stopped']} stopped, {s['failed']} failed"),
        ("ranks", f"{s['world_size']} ({s['backend']})"),
    ]
    if best is not None:
        pairs.append(("best trial", f"trial {best['number']} (run {best['run_id']}): {best['metric']!r}"))
        pairs += [(escape(k), v) for k, v in plots.flat_hparams(best["hparams"]).items()]
    return (
        f"# dtwork search report: {escape(data['label'])}\n\nSearch **{s['id']}** ({escape(s['status'])}, "
        f"started {started}) from {code_span(store.path.name)}, exported {now()}.\n\n"
        + table(pairs, ("summary", ""))
    )


def _data_cell(data: Searched) -> NotebookNode:
    meta = {"jupyter": {"source_hidden": True}, "tags": [DATA_TAG]}
    cell: NotebookNode = new_code_cell(
        f"import json\n\nSEARCH = json.loads({json.dumps(data)!r})", metadata=meta
    )
    return cell


def _rerun(s: SearchRow, path: Path, scrub: Scrubber) -> list[NotebookNode]:
    """``%%writefile`` the search file, a cluster of the search's shape, the search, ``%dtrain stop``."""
    yaml_name, store_name = f"{path.stem}.yaml", path.stem + RERUN_STORE
    text = scrub.text(s["config_yaml"] or "", "search file")
    code = scrub.text(s["code"] or "", "the trials' code")
    start = f"%dtrain start -n {s['world_size']} --backend {s['backend']} --store {shlex.quote(store_name)}"
    return [
        new_markdown_cell(
            "## Re-run\n\nThe cells below run the search again: every trial, with the same code."
        ),
        new_code_cell(
            f"%%writefile {shlex.quote(yaml_name)}\n{text}",
            metadata={"jupyter": {"source_hidden": True}, "tags": [CONFIG_TAG]},
        ),
        new_code_cell(f"%load_ext dtwork\n{start}"),
        new_code_cell(f"%%dtrain search {shlex.quote(yaml_name)}\n{code}"),
        new_code_cell("%dtrain stop"),
    ]


def search_notebook(store: RunStore, search_id: object, path: Path, scrub: Scrubber) -> NotebookNode:
    """The report of a search, to be written at ``path``; its summary and figure outputs filled in."""
    s = searches.get(store.db, search_id)
    data = _searched(store, s, scrub)
    nb: NotebookNode = new_notebook(
        metadata={"dtwork": {"search_id": s["id"]}, "title": f"dtwork search report: {data['label']}"}
    )
    figures: NotebookNode = new_code_cell(FIGURES_CELL, outputs=helpers.outputs(items(data)))
    nb.cells = [
        new_markdown_cell(_header(store, s, data)),
        new_markdown_cell(
            "## Trials\n\nDrawn from `SEARCH`: each trial's run, status, metric and hyperparameters, and its "
            "curve of the metric as stored (aggregated over ranks); its cell is collapsed."
        ),
        _data_cell(data),
        figures,
        *_rerun(s, path, scrub),
    ]
    found = "\n".join(f"- {code_span(f)}" for f in scrub.found) or "- nothing looked like a secret"
    nb.cells.append(
        new_markdown_cell(f"## Secrets\n\nReplaced by `{SCRUBBED}` (use your own to re-run):\n\n{found}")
    )
    return nb


def export_search(
    search_id: object,
    path: str | os.PathLike[str] | None = None,
    *,
    store: str | os.PathLike[str] | None = None,
    html: bool = False,
    environ: Mapping[str, str] | None = None,
) -> SearchReport:
    """Write search ``search_id``'s report to ``path`` (default ``reports/search-<id>.ipynb``); ``html``
    also writes the ``.html`` beside it. Bad input raises a one-line ``DtworkError`` first."""
    with RunStore(store, readonly=True) as s:
        sid = searches.get(s.db, search_id)["id"]
        target = target_path(path, f"search-{sid}.ipynb")
        scrub = Scrubber(os.environ if environ is None else environ)
        nb = search_notebook(s, sid, target, scrub)
    target.parent.mkdir(exist_ok=True)
    write_text(target, nbformat.writes(nb))
    report = SearchReport(target, None, sid, list(scrub.found))
    if html:
        report.html_path = target.with_suffix(".html")
        write_text(report.html_path, to_html(nb))
    return report
