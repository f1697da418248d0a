"""``dtwork runs searches`` and ``dtwork runs list --search ID``: searches and their trials as text or JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime

from dtwork.shared.text import number, table
from dtwork.store import searches
from dtwork.store.rows import SearchRow, TrialRow
from dtwork.store.runs import RunStore

__all__ = ["searches_text", "trials_text"]

_HIDDEN = ("code", "config_yaml")  # long: the report shows them


def _when(stamp: float | None) -> str:
    return datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M") if stamp else "-"


def _hparams(hp: Mapping[str, object], prefix: str = "") -> str:
    """Nested hyperparameters on one line: ``lr=0.1, model.width=64``."""
    parts = []
    for key, value in hp.items():
        if isinstance(value, Mapping):
            parts.append(_hparams(value, f"{prefix}{key}."))
        else:
            parts.append(f"{prefix}{key}={value!r}")
    return ", ".join(p for p in parts if p) or "-"


def searches_text(store: RunStore, as_json: bool = False) -> str:
    """Every search, newest first: its status, best metric so far and how many trials run, stopped, done."""
    rows = searches.list_searches(store.db)
    if as_json:
        return json.dumps([{k: v for k, v in s.items() if k not in _HIDDEN} for s in rows], indent=1)
    if not rows:
        return f"no searches yet in {store.path}: %%dtrain search EXP.yaml runs one"
    lines = [
        [
            str(s["id"]),
            s["label"],
            s["searcher"],
            s["status"],
            f"{s['metric'] or '-'} {number(s['best'])}",
            str(s["trials"]),
            str(s["running"]),
            str(s["stopped"]),
            str(s["done"]),
            str(s["failed"]),
            _when(s["started_at"]),
        ]
        for s in rows
    ]
    header = (
        "id",
        "file",
        "searcher",
        "status",
        "best",
        "trials",
        "running",
        "stopped",
        "done",
        "failed",
        "started",
    )
    return f"{store.path}\n" + table(header, lines, right={0, 5, 6, 7, 8, 9})


def _headline(s: SearchRow, best: TrialRow | None) -> str:
    order = "smaller" if s["smaller_is_better"] else "larger"
    metric = f"metric {s['metric']} ({order} is better)" if s["metric"] else "no metric"
    top = (
        "no trial has a metric yet"
        if best is None
        else (f"best {number(best['metric'])}: trial {best['number']} (run {best['run_id']})")
    )
    return f"search {s['id']}  {s['label']}  {s['searcher']}  {s['status']}  {metric}, {top}"


def trials_text(store: RunStore, search_id: object, as_json: bool = False) -> str:
    """One search's trials: trial number, run, status, metric, steps and hyperparameters."""
    s = searches.get(store.db, search_id)
    rows = searches.trials(store.db, s["id"])
    best = searches.best_trial(rows, s["smaller_is_better"])
    steps = {}
    for t in rows:
        run = store.find_run(t["run_id"]) if t["run_id"] is not None else None
        steps[t["number"]] = None if run is None else run["last_step"]
    if as_json:
        search = {k: v for k, v in s.items() if k not in _HIDDEN}
        trials = [{**t, "steps": steps[t["number"]]} for t in rows]
        return json.dumps({"search": search, "best": best and best["number"], "trials": trials}, indent=1)
    lines = [
        [
            str(t["number"]) + (" *" if best is not None and t["number"] == best["number"] else ""),
            number(t["run_id"]),
            t["status"],
            number(t["metric"]),
            number(steps[t["number"]]),
            _hparams(t["hparams"]),
        ]
        for t in rows
    ]
    header = ("trial", "run", "status", s["metric"] or "metric", "steps", "hyperparameters")
    return _headline(s, best) + "\n" + table(header, lines, right={1, 3, 4})
