"""A run's result: the best value of the metric its experiment config names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from dtwork.errors import DtworkError
from dtwork.shared.records import finite
from dtwork.store.runs import RunStore


def run_result(store: RunStore, run: Mapping[str, object]) -> dict[str, Any] | None:
    """The run's result: the best value of its config's ``searcher.metric`` (per ``smaller_is_better``)
    and the step it came at; None when the config names no metric. ``run``: a row of ``list_runs``."""
    from dtwork.config import load_config

    config_yaml = run.get("config_yaml")
    if not config_yaml:
        return None
    try:
        searcher = load_config(cast(str, config_yaml)).searcher
    except DtworkError:
        return None
    if searcher.metric is None:
        return None
    values = [  # a diverged step's NaN or infinity is no best
        (v, m["step"])
        for m in store.metrics(cast(int, run["id"]), searcher.metric)
        if (v := finite(m["value"])) is not None
    ]
    best, step = (min(values) if searcher.smaller_is_better else max(values)) if values else (None, None)
    return {
        "metric": searcher.metric,
        "best": best,
        "step": step,
        "smaller_is_better": searcher.smaller_is_better,
    }
