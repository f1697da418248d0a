"""A hyperparameter search in Determined's vocabulary: the trials a search file makes.

A search file is an experiment file whose ``searcher.name`` is ``grid``, ``random``, ``adaptive_asha``
or ``async_halving`` (or ``single``)
and whose ``hyperparameters`` may be searched (``int``, ``double``, ``log``, ``categorical``,
``const``, nested as Determined nests them). Each trial is the same file with every hyperparameter
a constant and ``searcher.name: single``: an experiment config as ``load_config`` reads it, so a
trial runs as any run does and its run in the store holds what it was given.

Grid points follow Determined's grid searcher: ``count`` evenly spaced points from ``minval`` to
``maxval`` (ints rounded, their count clamped to the integers in the range; ``log``: of the exponent;
one point: the middle), categorical values in their order, nested names in sorted order, the first
name varying slowest. Random trials draw each value uniformly (``log``: its exponent), ``max_trials``
of them, from a seeded generator (``reproducibility.experiment_seed``, 0 by default), so the same
file makes the same trials. An ASHA search draws its ``max_trials`` the same way; its brackets and
rungs are ``config/asha.py``'s, and each trial's config holds the top rung's length (a piece of work
sets its rung's) and checkpoints at least at its loop's end, so that a promotion resumes it.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dtwork.config._rules import error
from dtwork.config._yaml import parse_yaml
from dtwork.config.asha import ASHA_FIELDS, ASHA_SEARCHERS, AshaPlan, asha_plan
from dtwork.config.schema import ExperimentConfig, load_config, looks_like_path, read_file

__all__ = ["SEARCHERS", "Search", "load_search"]

SEARCHERS = ("single", "grid", "random", *ASHA_SEARCHERS)
_LATER = ("adaptive", "adaptive_simple", "pbt", "custom")
# A trial of an ASHA search checkpoints at least at its loop's end, so that a promotion resumes it.
_END_ONLY = 1_000_000_000
_TYPES = ("const", "int", "double", "log", "categorical")

Route = tuple[str, ...]


@dataclass(frozen=True)
class Search:
    """A search file's trials: their hyperparameters and their configs, in the order they run."""

    label: str
    searcher: str
    metric: str | None
    smaller_is_better: bool
    configs: list[ExperimentConfig]  # each trial's config: its hyperparameters constants
    asha: AshaPlan | None = None  # adaptive_asha, async_halving: the brackets and their rungs
    max_concurrent_trials: int | None = None  # trials at once on rank groups (None: one per group)

    @property
    def slots_per_trial(self) -> int | None:
        """Ranks per trial (``resources.slots_per_trial``; None: the whole cluster)."""
        return self.configs[0].resources.slots_per_trial if self.configs else None

    @property
    def hparams(self) -> list[dict[str, Any]]:
        """Each trial's hyperparameters, nested as in the file (as ``ctx.hparams`` gives them)."""
        return [cfg.hyperparameters for cfg in self.configs]

    def better(self, a: float, b: float) -> bool:
        """Whether metric value ``a`` beats ``b`` (``searcher.smaller_is_better``)."""
        return a < b if self.smaller_is_better else a > b


def load_search(source: str | os.PathLike[str] | Mapping[str, Any]) -> Search:
    """Read a search file (a path, YAML text or a mapping); a one-line error naming the field when it
    cannot run. Every trial's config is validated here, before any trial runs."""
    if isinstance(source, Mapping):
        data, label = dict(source), "search"
    elif isinstance(source, os.PathLike) or (isinstance(source, str) and looks_like_path(source)):
        text, label = read_file(source)
        data = parse_yaml(text, label)
    else:
        data, label = parse_yaml(str(source), "search"), "search"
    if not isinstance(data, Mapping):
        raise error(f"{label}: a search file is a mapping (an experiment file with a searcher)")
    found = data.get("searcher")
    searcher: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    name = searcher.get("name", "single")
    if name in _LATER:
        raise error(
            f"{label}: searcher.name {name!r} is not supported yet: use grid, random or adaptive_asha"
        )
    if name not in SEARCHERS:
        raise error(f"{label}: searcher.name {name!r} is not a searcher: use one of {', '.join(SEARCHERS)}")
    hps = data.get("hyperparameters") or {}
    if not isinstance(hps, Mapping):
        raise error(f"{label}: hyperparameters must be a mapping of names to values or searched ranges")
    axes = list(_axes((), hps, label))
    asha = asha_plan(searcher, label) if name in ASHA_SEARCHERS else None
    for own in ("max_steps", "max_epochs") if asha is not None else ():
        if data.get(own) is not None:  # it would win over the rung's length (ExperimentConfig.stop)
            raise error(
                f"{label}: {own}: an ASHA search sets each trial's length per rung (searcher.max_length): "
                "remove it"
            )
    if asha is not None:  # Determined draws an ASHA search's trials as random does
        points = _random(axes, sum(b.max_trials for b in asha.brackets), _seed(data))
    elif name == "random":
        points = _random(axes, _max_trials(searcher, label), _seed(data))
    else:
        points = _grid(axes, label, single=name == "single")
    hparams = [_nest(hps, point) for point in points]
    drop = ASHA_FIELDS if asha is not None else ("max_trials", "max_concurrent_trials")  # the search's own
    configs = []
    for i, hp in enumerate(hparams):
        trial = copy.deepcopy(dict(data))
        trial["hyperparameters"] = hp
        trial["searcher"] = {k: v for k, v in searcher.items() if k not in drop}
        trial["searcher"]["name"] = "single"
        if asha is not None:
            _asha_trial(trial, asha)
        try:
            configs.append(load_config(trial))
        except Exception as exc:  # a ConfigError names the field; say which trial
            raise error(f"{label}: trial {i + 1} ({_said(hp)}): {exc}") from None
    return Search(
        label=label,
        searcher=name,
        metric=searcher.get("metric"),
        smaller_is_better=bool(searcher.get("smaller_is_better", True)),
        configs=configs,
        asha=asha,
        max_concurrent_trials=_max_concurrent(searcher, label),
    )


def _asha_trial(trial: dict[str, Any], asha: AshaPlan) -> None:
    """An ASHA trial's config: the top rung's length (each piece of work sets its rung's), and a
    checkpoint at least at the loop's end when the file asks for none (a promotion resumes it)."""
    trial["searcher"]["max_length"] = asha.max_length.to_dict()
    found = trial.get("checkpoint")
    saves: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    if not saves.get("every") and trial.get("min_checkpoint_period") is None:
        trial["checkpoint"] = {**saves, "every": _END_ONLY}


def _max_concurrent(searcher: Mapping[str, Any], label: str) -> int | None:
    """``searcher.max_concurrent_trials``: None when absent or 0 (Determined's "no limit")."""
    n = searcher.get("max_concurrent_trials")
    if n is None:
        return None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise error(
            f"{label}: searcher.max_concurrent_trials must be a whole number >= 0 (0: as many as there "
            f"are rank groups), got {n!r}"
        )
    return n or None


def _said(hp: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in hp.items())


def _is_spec(value: object) -> bool:
    return isinstance(value, Mapping) and value.get("type") in _TYPES


def _axes(route: Route, hps: Mapping[str, Any], label: str) -> Iterator[tuple[Route, Mapping[str, Any]]]:
    """Every searched or constant leaf, as (its route of names, its spec), nested names sorted."""
    for key in sorted(hps, key=str):
        value, here = hps[key], (*route, str(key))
        if _is_spec(value):
            _check(here, value, label)
            yield here, value
        elif isinstance(value, Mapping):
            yield from _axes(here, value, label)
        else:
            yield here, {"type": "const", "val": value}


def _check(route: Route, spec: Mapping[str, Any], label: str) -> None:
    where = f"{label}: hyperparameters.{'.'.join(route)}"
    kind = spec["type"]
    if kind == "const" and "val" not in spec:
        raise error(f"{where}: type const needs val: <value>")
    if kind == "categorical" and (not isinstance(spec.get("vals"), list) or not spec["vals"]):
        raise error(f"{where}: type categorical needs vals: [a list of values]")
    if kind in ("int", "double", "log"):
        lo: Any = spec.get("minval")
        hi: Any = spec.get("maxval")
        numbers = (int,) if kind == "int" else (int, float)
        if not all(isinstance(v, numbers) and not isinstance(v, bool) for v in (lo, hi)) or lo > hi:
            raise error(
                f"{where}: type {kind} needs minval <= maxval ({'integers' if kind == 'int' else 'numbers'})"
            )
        count = spec.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise error(f"{where}: count must be a whole number >= 1, got {count!r}")
        if kind == "log" and not (
            isinstance(spec.get("base", 10), (int, float)) and spec.get("base", 10) > 0
        ):
            raise error(f"{where}: type log needs base > 0")


def _grid_axis(route: Route, spec: Mapping[str, Any], label: str) -> list[Any]:
    kind = spec["type"]
    if kind == "const":
        return [spec["val"]]
    if kind == "categorical":
        return list(spec["vals"])
    if spec.get("count") is None:
        raise error(f"{label}: hyperparameters.{'.'.join(route)}: a grid needs count: N for type {kind}")
    lo, hi, count = spec["minval"], spec["maxval"], spec["count"]
    if kind == "int":
        count = min(count, hi - lo + 1)
        if count == 1:
            return [_round((lo + hi) / 2)]
        return [_round(lo + i * (hi - lo) / (count - 1)) for i in range(count)]
    points = [(lo + hi) / 2.0] if count == 1 else [lo + i * (hi - lo) / (count - 1) for i in range(count)]
    if kind == "log":
        base = spec.get("base", 10)
        return [float(base) ** x for x in points]
    return [float(x) for x in points]


def _round(x: float) -> int:
    """Half away from zero, as Determined's grid (Go's math.Round), not Python's half to even."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def _grid(axes: list[tuple[Route, Mapping[str, Any]]], label: str, single: bool) -> list[dict[Route, Any]]:
    values = [
        _grid_axis(route, spec, label) if not single else _single(route, spec, label) for route, spec in axes
    ]
    return [
        dict(zip([route for route, _ in axes], combo, strict=True)) for combo in itertools.product(*values)
    ]


def _single(route: Route, spec: Mapping[str, Any], label: str) -> list[Any]:
    if spec["type"] != "const":
        raise error(
            f"{label}: hyperparameters.{'.'.join(route)} is searched (type {spec['type']}) but the searcher "
            "is single: use searcher.name grid or random, or a constant"
        )
    return [spec["val"]]


def _max_trials(searcher: Mapping[str, Any], label: str) -> int:
    n = searcher.get("max_trials")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise error(
            f"{label}: searcher.max_trials: a random search needs max_trials: N (a whole number >= 1)"
        )
    return n


def _seed(data: Mapping[str, Any]) -> int:
    repro = data.get("reproducibility")
    seed = repro.get("experiment_seed") if isinstance(repro, Mapping) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else 0


def _draw(rng: random.Random, spec: Mapping[str, Any]) -> Any:
    kind = spec["type"]
    if kind == "const":
        return spec["val"]
    if kind == "categorical":
        return rng.choice(spec["vals"])
    if kind == "int":
        return rng.randint(spec["minval"], spec["maxval"])
    x = rng.uniform(spec["minval"], spec["maxval"])
    return float(spec.get("base", 10)) ** x if kind == "log" else x


def _random(axes: list[tuple[Route, Mapping[str, Any]]], n: int, seed: int) -> list[dict[Route, Any]]:
    rng = random.Random(seed)
    return [{route: _draw(rng, spec) for route, spec in axes} for _ in range(n)]


def _nest(hps: Mapping[str, Any], point: Mapping[Route, Any]) -> dict[str, Any]:
    """The file's hyperparameters with each leaf replaced by the trial's value, nesting kept."""
    out: dict[str, Any] = {}
    for route, value in point.items():
        node = out
        for key in route[:-1]:
            node = node.setdefault(key, {})
        node[route[-1]] = value
    return {str(k): out[str(k)] for k in hps if str(k) in out}  # the file's order of names
