"""What tells runs apart: each run's hyperparameters and optimizer from its stored config, its
learning rate as its first training loop began, and of those the ones that differ between the runs
listed (``dtwork runs list``/``show``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import yaml

from dtwork.store.rows import RunRow
from dtwork.store.runs import RunStore

# Config fields that say where or how dtwork ran, not what was trained: never a run's label.
_NOT_LABELS = (
    "name",
    "description",
    "searcher.",
    "checkpoint.",
    "tensorboard",
    "keep",
    "data.",
    "resources.",
)
# The config's learning rate (a shorthand or lr.base) gives way to the one the optimizers had (a
# hand-made optimizer ignores the config's); the batch has its own column.
_OWN_COLUMN = ("lr", "lr.base", "global_batch_size")
_SHORT = {"optimizer.type": "optimizer"}  # the names a researcher uses


def _flat(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, Mapping):
        out: dict[str, object] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def settings(store: RunStore, run: RunRow) -> dict[str, object]:
    """The run's training settings by short name: ``hyperparameters.X`` as ``X`` (``ctx.hparams``),
    ``optimizer.type`` as ``optimizer``, ``lr`` the learning rate of the optimizers its first loop
    stepped (one number when they share one); where dtwork ran left out."""
    out: dict[str, object] = {}
    segments = store.segments(run["id"])
    lrs = [lr for group in (segments[0]["data"].get("lr") or [] if segments else []) for lr in group]
    if lrs:
        out["lr"] = lrs[0] if len(set(lrs)) == 1 else ",".join(_text(v) for v in lrs)
    try:
        config = yaml.safe_load(run.get("config_yaml") or "") or {}
    except yaml.YAMLError:  # a store written by hand: no labels rather than no list
        return out
    for key, value in _flat(config).items():
        if key.startswith(_NOT_LABELS) or key in _OWN_COLUMN:
            continue
        out[_SHORT.get(key, key.removeprefix("hyperparameters."))] = value
    return out


def hparams_text(store: RunStore, run: RunRow) -> str:
    """``lr=0.1 optimizer=sgd hidden=64``: the learning rate, optimizer and ``ctx.hparams``."""
    try:
        config = yaml.safe_load(run.get("config_yaml") or "") or {}
    except yaml.YAMLError:
        config = {}
    hp = config.get("hyperparameters") if isinstance(config, Mapping) else None
    shown = {k: v for k, v in settings(store, run).items() if k in ("lr", "optimizer") or k in (hp or {})}
    return " ".join(f"{k}={_text(v)}" for k, v in shown.items()) or "-"


def changed(store: RunStore, runs: Sequence[RunRow]) -> dict[int, str]:
    """Per run, ``key=value`` for each setting whose value differs between these runs ("-": none)."""
    every = [settings(store, run) for run in runs]
    keys = sorted({k for s in every for k in s}, key=lambda k: (k != "lr", k))  # the lr first
    differ = [k for k in keys if len({repr(s.get(k)) for s in every}) > 1]
    return {
        int(run["id"]): " ".join(f"{k}={_text(s.get(k))}" for k in differ) or "-"
        for run, s in zip(runs, every, strict=True)
    }


def _text(value: object) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
