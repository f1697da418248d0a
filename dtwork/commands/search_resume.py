"""``%%dtrain search --resume ID`` / ``dtwork.search(..., resume=ID)``: a search goes on where it stopped.

The search's record gives its file and cell (or the ones given, when they are the same), its trials and
the pieces of work they ran, each a run with its "search" event (written as the piece ended). The
searcher is made afresh from the file and the record replayed into it in the order the pieces began
and ended: each piece that began is asked of the searcher (``next()``), each that ended is reported
with its metric, so an ASHA search's rungs, promotions and next trials are what they were. Trials that
completed, stopped or failed keep their runs and metrics and run no more (unless ASHA promotes them).
A piece that began and never ended (interrupted, or its kernel died) is handed out first: an ASHA
piece goes on from its run's newest checkpoint when it wrote one (an interrupt checkpoints at the step
it stopped at), else from its previous rung's as a promotion does; a sweep's trial runs afresh.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from dtwork.commands.search_record import last_metric, search_file_text
from dtwork.config.search import Search, load_search
from dtwork.config.searchers import Searcher, Work, searcher_for
from dtwork.errors import DtworkError
from dtwork.store import searches
from dtwork.store.rows import SearchRow, TrialRow

if TYPE_CHECKING:
    from dtwork.cluster import Cluster
    from dtwork.store.runs import RunStore

__all__ = ["Resumed", "reopen", "restore", "resume"]

_DONE = ("completed", "stopped")  # a piece that ended with these is reported as ok


@dataclass
class Resumed:
    """A stopped search, ready to go on: its plan and cell, its trials' state (``search.Trial``'s
    fields by name) and its searcher, with the record replayed into it."""

    plan: Search
    code: str
    search_id: int
    trials: list[dict[str, Any]]
    searcher: Searcher


class _Replayed(Searcher):
    """The rebuilt searcher, handing out first the pieces the stopped search had begun and not ended."""

    def __init__(self, inner: Searcher, first: list[Work]) -> None:
        super().__init__(inner.plan)
        self.inner, self.first = inner, first
        self.running = inner.running  # one set: what runs is what the rebuilt searcher handed out

    def next(self) -> Work | None:
        return self.first.pop(0) if self.first else self.inner.next()

    def report(self, work: Work, metric: float | None, ok: bool) -> None:
        self.inner.report(work, metric, ok)

    @property
    def finished(self) -> bool:
        return not self.first and self.inner.finished

    def rung(self, trial: int) -> int | None:
        return self.inner.rung(trial)

    def stopped(self, trial: int) -> bool:
        return self.inner.stopped(trial)


def resume(
    cluster: Cluster,
    search_id: object,
    source: str | os.PathLike[str] | Mapping[str, Any] | None,
    code: str | None,
) -> Resumed:
    """Search ``search_id`` of ``cluster``'s store, rebuilt (``restore``); ``reopen`` runs it again."""
    from dtwork.launch import registry

    live = {e["cluster_id"] for e in registry.entries() if e.get("kernel_alive")} - {cluster.cluster_id}
    return restore(cluster.session.store, search_id, source, code, live)


def reopen(cluster: Cluster, back: Resumed, quiet: bool = False) -> int:
    """Mark the rebuilt search running again, on ``cluster``; its id."""
    db = cluster.session.store.db
    searches.reopen(db, back.search_id, cluster.cluster_id, cluster.world_size, cluster.backend)
    if not quiet:
        ended = sum(t["status"] in ("completed", "stopped", "failed") for t in back.trials)
        print(
            f"dtwork: resuming search {back.search_id} ({back.plan.label}): {ended} of "
            f"{len(back.trials)} trials ended, kept with their runs"
        )
    return back.search_id


def restore(
    store: RunStore,
    search_id: object,
    source: str | os.PathLike[str] | Mapping[str, Any] | None,
    code: str | None,
    live: Collection[str] = (),
) -> Resumed:
    """Search ``search_id``'s plan, cell, trials and rebuilt searcher from ``store`` (``live``: the
    clusters whose kernel is alive, where a search recorded running may still run)."""
    row = searches.get(store.db, search_id)
    sid = row["id"]
    _check_status(row, live)
    plan = _plan(row, source)
    rows = searches.trials(store.db, sid)
    if [r["hparams"] for r in rows] != plan.hparams:
        raise DtworkError(
            f"search {sid}'s trials are not the ones its file makes now (a changed dtwork?): "
            "start it again as a new search"
        )
    trials: list[dict[str, Any]] = [
        {
            "number": r["number"],
            "hparams": r["hparams"],
            "run_id": r["run_id"],
            "status": r["status"],
            "metric": r["metric"],
            "error": r["error"],
            "runs": [],
        }
        for r in rows
    ]
    searcher = _replay(store, plan, sid, rows, trials)
    return Resumed(plan, _code(row, code), sid, trials, searcher)


def _check_status(row: SearchRow, live: Collection[str]) -> None:
    sid = row["id"]
    if row["status"] == "completed":
        raise DtworkError(
            f"search {sid} ({row['label']}) completed already: nothing to resume "
            f"(dtwork runs list --search {sid} shows its trials)"
        )
    if row["status"] == "running" and row["cluster_id"] in live:
        raise DtworkError(
            f"search {sid} is still running on cluster {row['cluster_id']}: interrupt it there, then resume"
        )


def _plan(row: SearchRow, source: str | os.PathLike[str] | Mapping[str, Any] | None) -> Search:
    """The search file the record holds; one given must say the same."""
    stored = row["config_yaml"]
    if stored is None:
        raise DtworkError(f"search {row['id']}'s record holds no search file: it cannot be resumed")
    if source is not None and yaml.safe_load(search_file_text(source)) != yaml.safe_load(stored):
        raise DtworkError(
            f"the search file differs from search {row['id']}'s ({row['label']}): resume with the file "
            f"it ran, or with none (--resume {row['id']} alone runs the stored one)"
        )
    return dataclasses.replace(load_search(stored), label=row["label"])


def _code(row: SearchRow, code: str | None) -> str:
    """The cell the record holds; one given must be the same (an empty cell: the stored one)."""
    stored = row["code"] or ""
    if code is not None and code.strip() and code.strip() != stored.strip():
        raise DtworkError(
            f"the cell differs from search {row['id']}'s code: leave the cell empty to resume with its "
            "own code (dtwork runs searches --json has it), or start a new search"
        )
    return stored


def _piece_status(piece: Mapping[str, Any], trial: TrialRow) -> str:
    """How a piece ended: the trial's last piece as its record says, an earlier one as its run did."""
    if piece["run_id"] == trial["run_id"]:
        return trial["status"]
    return {"completed": "completed", "failed": "failed"}.get(piece["run_status"], "interrupted")


def _replay(
    store: RunStore, plan: Search, sid: int, rows: list[TrialRow], trials: list[dict[str, Any]]
) -> Searcher:
    """A new searcher told what the record says happened, in order; the pieces begun and not ended
    (or handed out and never begun) come first from it."""
    inner = searcher_for(plan)
    by_number = {r["number"]: r for r in rows}
    found = searches.pieces(store.db, sid)
    began = {p["trial"] for p in found}
    timeline: list[tuple[float, int, Mapping[str, Any], str | None]] = []
    for p in found:
        how = _piece_status(p, by_number[p["trial"]])
        timeline.append((p["began"], 1, p, None))
        if how != "interrupted":  # ended; on equal stamps an end sorts before another's start
            timeline.append((p["ended"], 0, p, how))
    timeline.sort(key=lambda item: (item[0], item[1]))
    handed: dict[int, Work] = {}
    cut: dict[int, int] = {}  # trial -> its run begun and not (yet) ended
    begun: set[int] = set()  # the runs whose start was replayed

    def never_began(m: int) -> bool:  # it failed before its run began: no piece of it is recorded
        return by_number[m]["status"] == "failed" and m not in began

    for _, _, piece, status in timeline:
        n, t, run = piece["trial"], trials[piece["trial"] - 1], piece["run_id"]
        if run not in begun:  # its start (an end stamped alike with it sorted first: it began first)
            begun.add(run)
            cut[n] = run
            if n not in handed:  # else: a piece resumed, the work its cut run was handed
                handed[n] = _ask(inner, n, handed, never_began)
        if status is None:
            continue
        cut.pop(n, None)
        work = handed.pop(n)
        metric = (
            t["metric"] if run == t["run_id"] or plan.metric is None else last_metric(store, run, plan.metric)
        )
        inner.report(work, metric, ok=status in _DONE)
        t["runs"].append(run)
        if status in _DONE:
            t["rung"] = inner.rung(n)
            t["length"] = None if work.length is None else f"{work.length.value} {work.length.unit}"
    return _Replayed(
        inner, [_again(store, plan, w, trials[w.trial - 1], cut.get(w.trial)) for w in handed.values()]
    )


def _ask(inner: Searcher, trial: int, handed: dict[int, Work], never_began: Callable[[int], bool]) -> Work:
    """The searcher's next pieces until ``trial``'s; a piece of a trial that failed without a run is
    reported failed, others are kept as handed out."""
    while (work := inner.next()) is not None:
        if work.trial == trial:
            return work
        if never_began(work.trial):
            inner.report(work, None, ok=False)
        else:
            handed[work.trial] = work
    raise DtworkError(
        f"the search's record does not replay: its searcher does not hand out trial {trial} where the "
        "record ran it; start it again as a new search"
    )


def _again(store: RunStore, plan: Search, work: Work, trial: dict[str, Any], cut: int | None) -> Work:
    """A piece begun and not ended, as it runs again: an ASHA piece from its run's checkpoint if it
    wrote one, else from its trial's previous rung's run (a promotion); a sweep's trial afresh."""
    if plan.asha is not None and cut is not None and store.events(cut, "checkpoint"):
        trial["run_id"] = cut
        return Work(work.trial, work.length, resume=True)
    if work.resume and trial["runs"]:
        trial["run_id"] = trial["runs"][-1]
    return work
