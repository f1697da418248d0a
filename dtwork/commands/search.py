"""``%%dtrain search EXP.yaml`` / ``dtwork.search``: a grid, random or ASHA search on the warm cluster.

The cell is every trial's code. Trials run one after another on the whole cluster (or several at
once on rank groups of ``resources.slots_per_trial`` ranks: ``search_groups``), each a run of its
own: the cluster is configured with the trial's config (its hyperparameters constants, as
``ctx.hparams`` gives them), the cell runs as a training cell does, and the trial's result is the last
value of ``searcher.metric`` it logged. A trial that fails costs that trial; Ctrl-C stops the search
after recording the trial it interrupted; the cluster's own config comes back at the end.

An ASHA search hands out a trial again at a longer length when it promotes it: that piece is a new
run of the trial whose training loop resumes from the newest checkpoint of the trial's previous run
(the ranks' ``auto_resume`` names that run), so it goes on from the step its shorter rung ended at.

``resume=ID`` goes on with a stopped search: ``search_resume`` rebuilds its trials and searcher from
its record, and the same runner hands out what is left.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dtwork.commands import search_resume
from dtwork.commands.search_groups import Job, error_text, layout, run_in_groups, said
from dtwork.commands.search_record import close_search, last_metric, open_search, record_trial
from dtwork.config import ExperimentConfig
from dtwork.config.search import Search, load_search
from dtwork.config.searchers import Searcher, Work, searcher_for
from dtwork.errors import DtworkError

if TYPE_CHECKING:
    from dtwork.cluster import Cluster

__all__ = ["SearchResult", "Trial", "search"]


@dataclass
class Trial:
    """One trial: its hyperparameters, its run, how it ended and its metric's last value."""

    number: int
    hparams: dict[str, Any]
    run_id: int | None = None  # its last run (an ASHA trial has one per rung it trained to)
    status: str = "not run"  # completed, stopped (by the searcher, at a rung), failed, interrupted, not run
    metric: float | None = None
    error: str | None = None
    rung: int | None = None  # ASHA: the rung it reached (0-based, in its bracket)
    length: str | None = None  # ASHA: the length it trained to, as "32 batches"
    runs: list[int] = field(default_factory=list)


@dataclass
class SearchResult:
    """A search's trials in the order they ran, and the best by its metric."""

    search: Search
    trials: list[Trial] = field(default_factory=list)
    search_id: int | None = None  # its record in the run store (``dtwork runs list --search ID``)

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
        record = f" (search {self.search_id})" if self.search_id is not None else ""
        lines = [
            f"{self.search.searcher} search {self.search.label}{record}: {len(self.trials)} trials, {name}"
        ]
        for t in self.trials:
            value = "" if t.metric is None else f" {name}={t.metric:.6g}"
            run = f"run {t.run_id}" if t.run_id is not None else "no run"
            rung = "" if t.length is None else f", to {t.length}"
            lines.append(f"  trial {t.number} ({run}, {t.status}{rung}{value}): {said(t.hparams)}")
        best = self.best
        if best is not None:
            lines.append(f"best: trial {best.number} (run {best.run_id}) {name}={best.metric:.6g}")
        return "\n".join(lines)


def search(
    source: str | os.PathLike[str] | Mapping[str, Any] | None,
    code: str | None,
    *,
    cluster: Cluster | None = None,
    quiet: bool = False,
    resume: int | str | None = None,
) -> SearchResult:
    """Run ``code`` (a cell's source) once per trial of the search file ``source`` on ``cluster`` (this
    kernel's running one by default); the trials, their runs and metrics, and the best. ``resume``: the
    id of a stopped search that goes on where it stopped (``search_resume``; its file and code are
    the record's when ``source`` and ``code`` are None)."""
    from dtwork.cluster import current

    if resume is not None:
        back = search_resume.resume(cluster or current(), resume, source, code)
        plan, code = back.plan, back.code
    elif not isinstance(code, str):
        raise DtworkError("dtwork.search runs a cell's source on every rank: pass the code as a string")
    elif source is None:
        raise DtworkError(
            "dtwork.search needs the search file (a path, YAML text or a mapping), or resume=ID"
        )
    else:
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
    if resume is not None:  # the record's trials and a searcher that replayed them
        result = SearchResult(plan, [Trial(**t) for t in back.trials], back.search_id)
        searcher, sid = back.searcher, search_resume.reopen(cluster, back, quiet)
    else:
        result = SearchResult(plan, [Trial(i + 1, hp) for i, hp in enumerate(plan.hparams)])
        searcher = searcher_for(plan)
        assert source is not None  # a new search was given its file (checked above)
        result.search_id = sid = open_search(cluster, plan, source, code)
    ended = "failed"  # until the search says otherwise: an error out of it fails the search
    try:
        if groups is not None:
            job = Job(
                plan,
                code,
                result.trials,
                lambda work: _config(plan, work),
                lambda work, run: _ended(cluster, result, searcher, work, run),
                lambda work: result.trials[work.trial - 1].run_id if work.resume else None,
                quiet,
            )
            run_in_groups(cluster, job, searcher, groups)  # Ctrl-C: the running trials stop, recorded
            if any(t.status == "interrupted" for t in result.trials):
                raise KeyboardInterrupt
        else:
            _one_by_one(cluster, result, searcher, code, quiet)
        _settle(result, searcher)
        ended = "completed"
    except KeyboardInterrupt:
        ended = "interrupted"
    finally:
        try:
            cluster.configure(before)  # the cluster's own config again; the next cell starts a new run
        finally:
            close_search(cluster, sid, result.trials, ended)  # never left running by a failed configure
    if not quiet:
        print(result.table())
    return result


def _one_by_one(cluster: Cluster, result: SearchResult, searcher: Searcher, code: str, quiet: bool) -> None:
    """Each piece of work on the whole cluster, one after another; Ctrl-C records the running one
    interrupted and ends the search."""
    plan, n = result.search, len(result.trials)
    while (work := searcher.next()) is not None:
        trial = result.trials[work.trial - 1]
        if not quiet:
            at = "" if work.length is None else f", to {work.length.value} {work.length.unit}"
            print(f"dtwork: {plan.searcher} search, trial {trial.number}/{n}{at}: {said(trial.hparams)}")
        cluster.configure(_config(plan, work))  # a new run begins with this trial's config
        try:
            _resume_from(cluster, trial.run_id if work.resume else None)
            if cluster.run(code, quiet=quiet).status == "interrupted":
                raise KeyboardInterrupt  # Ctrl-C stopped the ranks at a step: the search ends here
            trial.status = "completed"
        except KeyboardInterrupt:
            trial.status = "interrupted"
            if not quiet:
                print(f"dtwork: search stopped at trial {work.trial}/{n}; its run is recorded interrupted")
            raise
        except Exception as exc:  # a failing trial costs that trial: the others go on
            trial.status, trial.error = "failed", error_text(exc)
            if not quiet:
                print(f"dtwork: trial {trial.number} failed: {trial.error}")
        finally:
            if work.resume:
                _resume_from(cluster, None)
            _ended(cluster, result, searcher, work, cluster.session.run_id)


def _ended(
    cluster: Cluster, result: SearchResult, searcher: Searcher, work: Work, run_id: int | None
) -> None:
    """A piece of work ended (its trial's status set) in run ``run_id`` (None: it never began one):
    note it on its run, read its metric, tell the searcher, write the trial into the search's record."""
    trial = result.trials[work.trial - 1]
    if trial.status == "completed":
        trial.rung = searcher.rung(work.trial)
        if work.length is not None:
            trial.length = f"{work.length.value} {work.length.unit}"
    _record(cluster, result, trial, len(result.trials), run_id)
    searcher.report(work, trial.metric, ok=trial.status == "completed")
    if trial.status == "completed" and searcher.stopped(work.trial):
        trial.status = "stopped"  # below the top rung, not promoted (so far): it trains no further
    if result.search_id is not None:
        record_trial(cluster, result.search_id, trial)


def _config(plan: Search, work: Work) -> ExperimentConfig:
    """The config a piece of work trains with: its trial's, to the searcher's length (an ASHA rung)."""
    config = plan.configs[work.trial - 1]
    if work.length is not None:
        config = config.with_path("searcher.max_length", work.length.to_dict())
    return config


def _settle(result: SearchResult, searcher: Searcher) -> None:
    """Once the search has ended: a trial left below its bracket's top rung (never promoted, or its
    metric not a number) was stopped by the searcher, not completed."""
    for t in result.trials:
        diverged = t.rung is not None and (t.metric is None or not math.isfinite(t.metric))
        if t.status == "completed" and (searcher.stopped(t.number) or diverged):
            t.status = "stopped"  # close_search writes it


def _resume_from(cluster: Cluster, run_id: int | None) -> None:
    """Have the ranks' next training loop resume run ``run_id``'s newest checkpoint (None: not)."""
    from dtwork.runtime import entry

    if run_id is not None or cluster.engines.state == "running":
        cluster.engines.call(entry.set_auto_resume, (run_id or False,), {})


def _record(cluster: Cluster, result: SearchResult, trial: Trial, n: int, run: int | None) -> None:
    """Note the trial on its run (an event) and read its metric's last value from the store."""
    plan, session = result.search, cluster.session
    if run is None:
        return
    trial.run_id = run
    trial.runs.append(run)
    rung = "" if trial.length is None else f" (to {trial.length})"
    session.writer.event(
        run,
        "search",
        f"trial {trial.number}/{n}{rung} of the {plan.searcher} search {plan.label}: {said(trial.hparams)}",
        {
            "search": plan.label,
            "search_id": result.search_id,
            "trial": trial.number,
            "hparams": trial.hparams,
            "rung": trial.rung,
        },
    )
    session.writer.flush()
    if plan.metric is None:
        return
    session.writer.flush(force=True)
    value = last_metric(session.store, run, plan.metric)
    trial.metric = trial.metric if value is None else value  # a piece that logged none keeps the last
