"""Runs from the store written where researchers already look: TensorBoard and MLflow.

Both writers read the store through :class:`dtwork.store.runs.RunStore`'s public methods and take
the same view of a run (:func:`run_view`): its aggregated metrics by step (training logs,
throughput, GNS), its scaling results, and its hyperparameters and config as flat params.
tensorboard and mlflow are optional extras (``pip install 'dtwork[tensorboard]'`` / ``[mlflow]``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from dtwork.errors import DtworkError
from dtwork.store.runs import RunStore

__all__ = ["RunView", "require", "run_view", "select_runs"]


@dataclass
class RunView:
    """What an exporter writes for one run."""

    id: int
    name: str
    status: str
    created_at: float
    ended_at: float | None
    params: dict[str, str | int | float | bool]
    # (name, step, value, wall time) of every aggregated metric with a value
    metrics: list[tuple[str, int, float, float]] = field(default_factory=list)
    # one dict per scaling point: mode, world_size, throughput, step_time, comm_time, ...
    scaling: list[dict[str, Any]] = field(default_factory=list)
    config_yaml: str | None = None


def require(module: str, extra: str) -> ModuleType:
    """Import an optional package, or fail with the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DtworkError(f"{module} is not installed: pip install 'dtwork[{extra}]'") from None


def select_runs(store: RunStore, run_id: int | str | None) -> list[int]:
    """The run asked for, or every run in the store (oldest first) when ``run_id`` is None."""
    if run_id is not None:
        return [int(store.get_run(run_id)["id"])]
    ids = [int(run["id"]) for run in store.list_runs()]
    if not ids:
        raise DtworkError(f"no runs in {store.path}: run a %%dtrain cell first")
    return sorted(ids)


def _flatten(prefix: str, value: object, out: dict[str, str | int | float | bool]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, out)
    elif isinstance(value, (bool, int, float, str)):
        out[prefix] = value
    elif value is not None:
        out[prefix] = str(value)


def run_view(store: RunStore, run_id: int | str) -> RunView:
    """Read one run from the store into the shape the exporters write."""
    from dtwork.config import load_config

    run = store.get_run(run_id)
    rid = int(run["id"])
    params: dict[str, str | int | float | bool] = {}
    for key in ("world_size", "backend", "global_batch_size", "per_slot_batch_size"):
        if (value := run[key]) is not None:
            params[key] = value
    if run.get("config_yaml"):
        cfg = load_config(run["config_yaml"]).to_dict()
        _flatten("hparams", cfg.pop("hyperparameters", {}), params)
        _flatten("config", cfg, params)
    metrics = [
        (m["name"], int(m["step"]), float(m["value"]), float(m["time"] or 0.0))
        for m in store.metrics(rid)
        if m["value"] is not None
    ]
    scaling = [
        {"mode": res["data"].get("mode", "weak"), **point}
        for res in store.results(rid, kind="scaling")
        for point in res["data"].get("points", [])
    ]
    return RunView(
        id=rid,
        name=run.get("name") or f"run-{rid}",
        status=run["status"],
        created_at=float(run["created_at"]),
        ended_at=run.get("ended_at"),
        params=params,
        metrics=metrics,
        scaling=scaling,
        config_yaml=run.get("config_yaml"),
    )
