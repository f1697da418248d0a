"""Runs logged to MLflow through its client: params, metrics with their steps, the report as an artifact.

The tracking URI is a tracking server (``http://host:5000``), an SQLite store (``sqlite:///x.db``
or a path ending in .db) or a file store (``file:///path/mlruns`` or a folder; MLflow 3 opens
those only with ``MLFLOW_ALLOW_FILE_STORE=true``). Each dtwork run becomes one MLflow run in experiment ``experiment`` (default
"dtwork"), tagged with the dtwork run id and store so that an export can be traced back.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from dtwork.errors import DtworkError
from dtwork.export import RunView, require, run_view, select_runs
from dtwork.store.runs import RunStore

__all__ = ["export_mlflow"]

_BATCH = 1000  # MLflow takes at most 1000 metrics (and 100 params) in one log_batch call
_STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "stopped": "KILLED"}


def _uri(uri: str | os.PathLike[str]) -> str:
    """A tracking URI: a path ending in .db is an SQLite store, any other path a file store."""
    text = os.fspath(uri)
    if ":" in text.split("/", 1)[0]:  # has a scheme (file:, sqlite:, http:, databricks ...)
        return text
    path = Path(text).expanduser().absolute()
    return f"sqlite:///{path}" if path.suffix == ".db" else path.as_uri()


def _artifacts(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside an SQLite store (MLflow's default is the
    current folder's ./mlruns), the tracking server's own choice otherwise."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "mlartifacts").as_uri()
    return None


def export_mlflow(
    store: RunStore | str | os.PathLike[str],
    uri: str | os.PathLike[str],
    run_id: int | str | None = None,
    *,
    experiment: str = "dtwork",
    report: bool = True,
) -> list[str]:
    """Log run ``run_id`` (every run when None) to MLflow at ``uri``; return the MLflow run ids.

    ``report`` also exports the run's report notebook and logs it as an artifact.
    """
    require("mlflow", "mlflow")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=_uri(uri))
        found = client.get_experiment_by_name(experiment)
    except MlflowException as exc:
        first = str(exc).split(". ")[0]
        raise DtworkError(
            f"MLflow cannot open {_uri(uri)} ({first}): use a tracking server, a sqlite:///PATH.db store, "
            "or for a folder set MLFLOW_ALLOW_FILE_STORE=true"
        ) from None
    experiment_id = (
        found.experiment_id
        if found
        else client.create_experiment(experiment, artifact_location=_artifacts(_uri(uri)))
    )
    own = not isinstance(store, RunStore)
    rs = RunStore(store, readonly=True) if not isinstance(store, RunStore) else store
    try:
        return [_log(client, experiment_id, rs, run_view(rs, rid), report) for rid in select_runs(rs, run_id)]
    finally:
        if own:
            rs.close()


def _log(client: Any, experiment_id: str, store: RunStore, view: RunView, report: bool) -> str:
    from mlflow.entities import Metric, Param

    tags = {"dtwork.run_id": str(view.id), "dtwork.store.runs": str(store.path), "dtwork.status": view.status}
    run = client.create_run(
        experiment_id, start_time=int(view.created_at * 1000), tags=tags, run_name=view.name
    )
    mlflow_id = str(run.info.run_id)
    params = [Param(key, str(value)[:6000]) for key, value in sorted(view.params.items())]
    for i in range(0, len(params), 100):
        client.log_batch(mlflow_id, params=params[i : i + 100])
    metrics = [
        Metric(name, value, int((wall or view.created_at) * 1000), step)
        for name, step, value, wall in view.metrics
    ]
    for i in range(0, len(metrics), _BATCH):
        client.log_batch(mlflow_id, metrics=metrics[i : i + _BATCH])
    if view.config_yaml:
        client.log_text(mlflow_id, view.config_yaml, "config.yaml")
    if report and store.cells(view.id):  # a run without cells has no report
        from dtwork.report import export

        with tempfile.TemporaryDirectory(prefix="dtwork-mlflow-") as tmp:
            path = Path(tmp) / f"run-{view.id}.ipynb"
            export(view.id, path, store=store.path)
            client.log_artifact(mlflow_id, str(path))
    end = int(view.ended_at * 1000) if view.ended_at else None
    status = _STATUS.get(view.status)
    if status is not None:
        client.set_terminated(mlflow_id, status=status, end_time=end)
    return mlflow_id
