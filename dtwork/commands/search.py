"""``%%dtrain search EXP.yaml`` / ``dtwork.search``: a grid or random search on the warm cluster.

The cell is every trial's code. Trials run one after another on the whole cluster (or several at
once on rank groups of ``resources.slots_per_trial`` ranks: ``search_groups``), each a run of its
own: the cluster is configured with the trial's config (its hyperparameters constants, as
``ctx.hparams`` gives them), the cell runs as a training cell does, and the trial's result is the last
value of ``searcher.metric`` it logged. A trial that fails costs that trial; Ctrl-C stops the search
after recording the trial it interrupted; the cluster's own config comes back at the end.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dtwork.commands.search_groups import Job, error_text, layout, run_in_groups, said
from dtwork.config import ExperimentConfig
from dtwork.config.search import Search, load_search
from dtwork.config.searchers import Work, searcher_for
from dtwork.errors import DtworkError

if TYPE_CHECKING:
    from dtwork.cluster import Cluster

__all__ = ["SearchResult", "Trial", "search"]


@dataclass
class Trial:
    """One trial: its hyperparameters, its run, how it ended and its metric's last value."""

    number: int
    hparams: dict[str, Any]
    run_id: int | None = None
    status: str = "not run"  # completed, failed, interrupted, not run
    metric: float | None = None
    error: str | None = None


@dataclass
class SearchResult:
    """A search's trials in the order they ran, and the best by its metric."""

    search: Search
    trials: list[Trial] = field(default_factory=list)

    @property
    def best(self) -> Trial | None:
        scored = [t for t in self.trials if t.metric is not None and math.isfinite(t.metric)]
        best: Trial | None = None
        for t in scored:
            if best is None or self.search.better(t.metric, best.metric):  # type: ignore[arg-type]
                best = t
        return best

    def table(self) -> str:
        """One line per trial and the best, as the cell prints them."""
        name = self.search.metric or "metric"
        lines = [f"{self.search.searcher} search {self.search.label}: {len(self.trials)} trials, {name}"]
        for t in self.trials:
            value = "" if t.metric is None else f" {name}={t.metric:.6g}"
            run = f"run {t.run_id}" if t.run_id is not None else "no run"
            lines.append(f"  trial {t.number} ({run}, {t.status}{value}): {said(t.hparams)}")
        best = self.best
        if best is not None:
            lines.append(f"best: trial {best.number} (run {best.run_id}) {name}={best.metric:.6g}")
        return "\n".join(lines)


def search(
    source: str | os.PathLike[str] | Mapping[str, Any],
    code: str,
    *,
    cluster: Cluster | None = None,
    quiet: bool = False,
) -> SearchResult:
    """Run ``code`` (a cell's source) once per trial of the search file ``source`` on ``cluster`` (this
    kernel's running one by default); the trials, their runs and metrics, and the best."""
    from dtwork.cluster import current

    if not isinstance(code, str):
        raise DtworkError("dtwork.search runs a cell's source on every rank: pass the code as a string")
    plan = load_search(source)  # every trial's config checked before the first runs
    cluster = cluster or current()
    if plan.metric is None and len(plan.configs) > 1:
        raise DtworkError(
            f"{plan.label}: searcher.metric names what the trials are compared by (a name the cell "
            "logs with ctx.log, e.g. metric: val_loss)"
        )
    if not code.strip():
        raise DtworkError("%%dtrain search runs the cell as every trial's code: the cell is empty")
    groups = layout(cluster.world_size, plan.slots_per_trial)  # None: each trial on the whole cluster
    before = cluster.config
    result = SearchResult(plan, [Trial(i + 1, hp) for i, hp in enumerate(plan.hparams)])
    searcher = searcher_for(plan)
    n = len(result.trials)
    if groups is not None:
        job = Job(
            plan,
            code,
            result.trials,
            lambda work: _config(plan, work),
            lambda t, run: _record(cluster, plan, result.trials[t.number - 1], n, run),
            quiet,
        )
        try:
            run_in_groups(cluster, job, searcher, groups)
        finally:
            cluster.configure(before)  # the cluster's own config on the whole world again
        if not quiet:
            print(result.table())
        return result
    work: Work | None = None
    try:
        while (work := searcher.next()) is not None:
            trial = result.trials[work.trial - 1]
            if not quiet:
                print(f"dtwork: {plan.searcher} search, trial {trial.number}/{n}: {said(trial.hparams)}")
            cluster.configure(_config(plan, work))  # a new run begins with this trial's config
            try:
                cluster.run(code, quiet=quiet)
                trial.status = "completed"
            except KeyboardInterrupt:
                trial.status = "interrupted"
                raise
            except Exception as exc:  # a failing trial costs that trial: the others go on
                trial.status, trial.error = "failed", error_text(exc)
                if not quiet:
                    print(f"dtwork: trial {trial.number} failed: {trial.error}")
            finally:
                _record(cluster, plan, trial, n)
                searcher.report(work, trial.metric, ok=trial.status == "completed")
    except KeyboardInterrupt:
        if not quiet and work is not None:
            print(f"dtwork: search stopped at trial {work.trial}/{n}; its run is recorded interrupted")
    finally:
        cluster.configure(before)  # the cluster's own config again; the next cell starts a new run
    if not quiet:
        print(result.table())
    return result


def _config(plan: Search, work: Work) -> ExperimentConfig:
    """The config a piece of work trains with: its trial's."""
    return plan.configs[work.trial - 1]


def _record(cluster: Cluster, plan: Search, trial: Trial, n: int, run_id: int | None = None) -> None:
    """Note the trial on its run (an event) and read its metric's last value from the store;
    ``run_id``: the trial's run when it ran on a rank group (else the session's)."""
    session = cluster.session
    trial.run_id = session.run_id if run_id is None else run_id
    if trial.run_id is None:
        return
    session.writer.event(
        trial.run_id,
        "search",
        f"trial {trial.number}/{n} of the {plan.searcher} search {plan.label}: {said(trial.hparams)}",
        {"search": plan.label, "trial": trial.number, "hparams": trial.hparams},
    )
    session.writer.flush()
    if plan.metric is None:
        return
    session.writer.flush(force=True)
    rows = session.store.metrics(trial.run_id, plan.metric, rank="all")
    if rows:
        last = max(rows, key=lambda r: (r["step"], r["rank"] is None, -(r["rank"] or 0)))
        trial.metric = None if last["value"] is None else float(last["value"])
