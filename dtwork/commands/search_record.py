"""A search's record in the run store: made when the search starts, each trial written as it ends, closed
with how the search ended (:mod:`dtwork.store.searches` holds the tables)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from dtwork.config.schema import looks_like_path, read_file
from dtwork.store import searches

if TYPE_CHECKING:
    from dtwork.cluster import Cluster
    from dtwork.config.search import Search
    from dtwork.store.runs import RunStore

__all__ = ["TrialState", "close_search", "last_metric", "open_search", "record_trial", "search_file_text"]


class TrialState(Protocol):
    """What the record keeps of a trial (``dtwork.commands.search.Trial``)."""

    number: int
    run_id: int | None
    status: str
    metric: float | None
    error: str | None


def search_file_text(source: str | os.PathLike[str] | Mapping[str, Any]) -> str:
    """The search file as the user gave it: the file's text, the YAML text, or a mapping as YAML."""
    if isinstance(source, Mapping):
        return str(yaml.safe_dump(dict(source), sort_keys=False))
    if isinstance(source, os.PathLike) or looks_like_path(source):
        return read_file(source)[0]
    return str(source)


def open_search(
    cluster: Cluster, plan: Search, source: str | os.PathLike[str] | Mapping[str, Any], code: str
) -> int:
    """Create the search's record, every planned trial in it; return the search's id."""
    new = searches.NewSearch(
        label=plan.label,
        searcher=plan.searcher,
        metric=plan.metric,
        smaller_is_better=plan.smaller_is_better,
        config_yaml=search_file_text(source),
        code=code,
        cluster_id=cluster.cluster_id,
        world_size=cluster.world_size,
        backend=cluster.backend,
        hparams=plan.hparams,
    )
    return searches.create(cluster.session.store.db, new)


def record_trial(cluster: Cluster, search_id: int, trial: TrialState) -> None:
    """Write how ``trial`` ended: its run, status, metric and error."""
    status = trial.status if trial.status in searches.TRIAL_STATUSES else "not run"
    searches.set_trial(
        cluster.session.store.db,
        search_id,
        trial.number,
        run_id=trial.run_id,
        status=status,
        metric=trial.metric,
        error=trial.error,
    )


def close_search(cluster: Cluster, search_id: int, trials: Iterable[TrialState], status: str) -> None:
    """Write every trial's final state (a trial cut short ends as it was left) and the search's end."""
    db = cluster.session.store.db
    with db.write():  # one transaction: a reader sees the search ended with its trials
        for trial in trials:
            if trial.status != "not run":
                record_trial(cluster, search_id, trial)
        searches.finish(db, search_id, status)


def last_metric(store: RunStore, run: int, name: str) -> float | None:
    """A trial's result: the last value of ``name`` its run logged (its highest step, the value of every
    rank before one rank's)."""
    rows = store.metrics(run, name, rank="all")
    if not rows:
        return None
    last = max(rows, key=lambda r: (r["step"], r["rank"] is None, -(r["rank"] or 0)))
    return None if last["value"] is None else float(last["value"])
