"""The experiment config's dataclasses, their validation and ``load_config``."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtwork.config._rules import (
    BOOL,
    INT0,
    INT1,
    INT1_OPT,
    LENGTH_OPT,
    MAPPING,
    NONNEG,
    POS,
    STR_OPT,
    Length,
    Rule,
    check,
    error,
    fail,
    fields_of,
    join,
    leaf,
    plain,
    reject_unknown,
    section,
    show,
)
from dtwork.config._yaml import MAX_BYTES, dump_yaml, parse_yaml
from dtwork.config.determined import IGNORED, translate

_LABEL = "config"
_SEED_MAX = 2**32 - 1


class _Section:
    """Shared behaviour of the config dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists and scalars; ``load_config`` turns the result back into an equal object."""
        out: dict[str, Any] = plain(self)
        return out


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class Resources(_Section):
    slots_per_trial: int | None = leaf(None, INT1_OPT)


@dataclass(frozen=True)
class Compression(_Section):
    type: str = leaf("none", Rule("choice", choices=("none", "fp16", "bf16", "powersgd")))
    rank: int = leaf(1, INT1)
    start_iter: int = leaf(10, INT0)


@dataclass(frozen=True)
class AdaptiveBatchSize(_Section):
    """Adaptive batch by goodput (Pollux; dtwork.analysis.goodput); off while the cap is unset."""

    max_global_batch_size: int | None = leaf(None, INT1_OPT)
    min_per_slot_batch_size: int = leaf(1, INT1)
    decide_every: int = leaf(100, INT1)  # optimizer steps between decisions


@dataclass(frozen=True)
class Optimizations(_Section):
    aggregation_frequency: int = leaf(1, INT1)
    average_aggregated_gradients: bool = leaf(True, BOOL)
    gradient_compression: Compression = section(Compression)
    tensor_fusion_threshold: float = leaf(25.0, POS)
    auto_tune_tensor_fusion: bool = leaf(False, BOOL)
    average_training_metrics: bool = leaf(True, BOOL)
    adaptive_batch_size: AdaptiveBatchSize = section(AdaptiveBatchSize)
    strategy: str = leaf("ddp", Rule("choice", choices=("ddp", "fsdp")))


@dataclass(frozen=True)
class OptimizerConfig(_Section):
    type: str = leaf("sgd", Rule("choice", choices=("sgd", "adam", "adamw", "lars")))
    momentum: float = leaf(0.9, NONNEG)
    nesterov: bool = leaf(False, BOOL)
    weight_decay: float = leaf(0.0, NONNEG)
    betas: tuple[float, float] = leaf((0.9, 0.999), Rule("betas"))
    eps: float = leaf(1e-8, POS)
    trust_coefficient: float = leaf(0.001, POS)


@dataclass(frozen=True)
class LRConfig(_Section):
    base: float = leaf(0.1, POS)
    scaling: str = leaf("none", Rule("choice", choices=("none", "linear", "sqrt")))
    base_batch_size: int | None = leaf(None, INT1_OPT)
    warmup: int = leaf(0, INT0)


_SCHEDULES = ("constant", "step", "exponential", "cosine", "polynomial")


@dataclass(frozen=True)
class ScheduleConfig(_Section):
    type: str = leaf("constant", Rule("choice", choices=_SCHEDULES))
    step_size: int = leaf(1000, INT1)
    gamma: float = leaf(0.1, POS)
    power: float = leaf(1.0, POS)
    min_factor: float = leaf(0.0, Rule("float", lo=0, hi=1))
    total_steps: int | None = leaf(None, INT1_OPT)


@dataclass(frozen=True)
class CheckpointConfig(_Section):
    every: int | None = leaf(None, INT1_OPT)
    keep: int = leaf(3, INT1)
    directory: str = leaf(".dtwork/checkpoints", Rule("str"))


@dataclass(frozen=True)
class GNSConfig(_Section):
    enabled: bool = leaf(False, BOOL)
    ema_decay: float = leaf(0.999, Rule("float", lo=0, hi=1, lo_open=True, hi_open=True))
    every: int = leaf(1, INT1)


@dataclass(frozen=True)
class SearcherConfig(_Section):
    """Determined's ``searcher``: the run's length and the metric that is its result."""

    name: str = leaf("single", Rule("choice", choices=("single",)))
    metric: str | None = leaf(None, STR_OPT)
    smaller_is_better: bool = leaf(True, BOOL)
    max_length: Length | None = leaf(None, LENGTH_OPT)


@dataclass(frozen=True)
class ExperimentConfig(_Section):  # wide: one field per top-level key of a Determined experiment file
    """A validated experiment config; build it with ``load_config`` and edit it with ``replace``/``with_path``."""

    name: str | None = leaf(None, STR_OPT)
    description: str | None = leaf(None, STR_OPT)
    resources: Resources = section(Resources)
    global_batch_size: int | None = leaf(None, INT1_OPT)
    optimizations: Optimizations = section(Optimizations)
    optimizer: OptimizerConfig = section(OptimizerConfig)
    lr: LRConfig = section(LRConfig)
    lr_schedule: ScheduleConfig = section(ScheduleConfig)
    mixed_precision: str = leaf("none", Rule("choice", choices=("none", "fp16", "bf16")))
    max_steps: int | None = leaf(None, INT1_OPT)
    max_epochs: int | None = leaf(None, INT1_OPT)
    searcher: SearcherConfig = section(SearcherConfig)
    records_per_epoch: int | None = leaf(None, INT1_OPT)
    min_validation_period: Length | None = leaf(None, LENGTH_OPT)
    min_checkpoint_period: Length | None = leaf(None, LENGTH_OPT)
    checkpoint: CheckpointConfig = section(CheckpointConfig)
    max_restarts: int = leaf(0, INT0)
    seed: int = leaf(0, Rule("int", lo=0, hi=_SEED_MAX))
    gns: GNSConfig = section(GNSConfig)
    hyperparameters: dict[str, Any] = field(default_factory=dict, metadata={"rule": MAPPING})
    data: dict[str, Any] = field(default_factory=dict, metadata={"rule": MAPPING})
    tensorboard: str | None = leaf(None, STR_OPT)
    # dtwork's own: how long the cluster outlives its kernel (%dtrain start --keep), in seconds
    keep: float | None = leaf(None, Rule("duration", optional=True))
    # The Determined fields this file set that dtwork ignores, as one line for the user.
    notes: tuple[str, ...] = field(default=(), compare=False, repr=False, metadata={"derived": True})

    def to_yaml(self) -> str:
        """YAML text that ``load_config`` reads back into an equal config."""
        return dump_yaml(self.to_dict())

    def replace(self, **changes: object) -> ExperimentConfig:
        """A new validated config with top-level fields changed (sections accept mappings or shorthands)."""
        data = self.to_dict()
        data.update({key: plain(value) for key, value in changes.items()})
        return load_config(data)

    def with_path(self, dotted: str, value: object) -> ExperimentConfig:
        """A new validated config with one field changed, e.g. ``with_path("lr.base", 0.2)``."""
        parts = dotted.split(".") if isinstance(dotted, str) else [""]
        if not all(parts):
            raise error(f"{_LABEL}: {dotted!r}: expected a dotted field path like 'lr.base'")
        data = self.to_dict()
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                prefix = ".".join(parts[: depth + 1])
                raise error(f"{_LABEL}: {prefix}: not a section, so {dotted!r} cannot be set")
            node = child
        node[parts[-1]] = plain(value)
        return load_config(data)

    def effective_lr(self) -> float:
        """``lr.base`` scaled from ``lr.base_batch_size`` to ``global_batch_size`` per ``lr.scaling``."""
        lr, gbs = self.lr, self.global_batch_size
        if lr.scaling == "none" or lr.base_batch_size is None or gbs is None:
            return lr.base
        ratio = gbs / lr.base_batch_size
        return lr.base * (ratio if lr.scaling == "linear" else math.sqrt(ratio))

    def schedule_total_steps(self) -> int | None:
        """``lr_schedule.total_steps``, defaulting to the run's length in steps (``stop``)."""
        total = self.lr_schedule.total_steps
        return total if total is not None else self.stop(self.global_batch_size)[0]

    def steps_in(self, length: Length | None, global_batch_size: int | None) -> int | None:
        """A Determined length in optimizer steps: batches as they are, records and epochs over the
        global batch (epochs through ``records_per_epoch``); None where it cannot be counted in steps."""
        if length is None:
            return None
        if length.unit == "batches":
            return length.value
        records = length.value if length.unit == "records" else None
        if length.unit == "epochs" and self.records_per_epoch is not None:
            records = length.value * self.records_per_epoch
        if records is None or not global_batch_size:
            return None
        return max(1, math.ceil(records / global_batch_size))

    def stop(self, global_batch_size: int | None) -> tuple[int | None, int | None]:
        """``(max_steps, max_epochs)`` that ``ctx.steps`` stops at by default: max_steps/max_epochs
        when set, else ``searcher.max_length`` (epochs as passes over the loader without
        ``records_per_epoch``)."""
        if self.max_steps is not None or self.max_epochs is not None:
            return self.max_steps, self.max_epochs
        length = self.searcher.max_length
        steps = self.steps_in(length, global_batch_size)
        if steps is None and length is not None and length.unit == "epochs":
            return None, length.value
        return steps, None


# section -> field that a non-mapping shorthand sets
_SHORTHAND: dict[type, str] = {
    Compression: "type",
    OptimizerConfig: "type",
    LRConfig: "base",
    ScheduleConfig: "type",
    GNSConfig: "enabled",
    AdaptiveBatchSize: "max_global_batch_size",
}


# --------------------------------------------------------------------------- validation


def _parse_section(cls: type[Any], raw: object, path: str, label: str, notes: list[str]) -> Any:
    """Build section ``cls`` from a mapping, a shorthand scalar or None (defaults)."""
    fields = fields_of(cls)
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        short = _SHORTHAND.get(cls)
        if short is None:
            fail(label, path, f"expected a mapping, got {show(raw)}")
        return cls(**{short: check(label, path, raw, fields[short].metadata["rule"], " or a mapping")})
    reject_unknown(label, path, raw, list(fields), IGNORED.get(path, ()), notes)
    values: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in raw:
            continue
        sub = join(path, name)
        if "section" in spec.metadata:
            values[name] = _parse_section(spec.metadata["section"], raw[name], sub, label, notes)
        else:
            values[name] = check(label, sub, raw[name], spec.metadata["rule"])
    return cls(**values)


def _cross_check(cfg: ExperimentConfig, label: str) -> None:
    gbs, slots = cfg.global_batch_size, cfg.resources.slots_per_trial
    if gbs is not None and slots is not None and gbs < slots:
        fail(
            label,
            "global_batch_size",
            f"{gbs} is smaller than resources.slots_per_trial={slots}; each slot needs at least one "
            f"example: raise global_batch_size to >= {slots}",
        )
    _check_adaptive(cfg.optimizations.adaptive_batch_size, gbs, slots, label)
    for path, length in (
        ("searcher.max_length", cfg.searcher.max_length),
        ("min_validation_period", cfg.min_validation_period),
        ("min_checkpoint_period", cfg.min_checkpoint_period),
    ):
        if length is not None and length.unit == "records" and gbs is None:
            fail(
                label,
                path,
                "a length in records needs global_batch_size (or hyperparameters.global_batch_size)",
            )
        if path != "searcher.max_length" and length is not None and cfg.steps_in(length, gbs) is None:
            fail(label, path, "a period in epochs needs records_per_epoch and global_batch_size")
    schedule = cfg.lr_schedule
    if schedule.type in ("cosine", "polynomial") and cfg.schedule_total_steps() is None:
        fail(
            label,
            "lr_schedule.total_steps",
            f"{schedule.type} needs total_steps, max_steps or searcher.max_length",
        )
    if cfg.lr.scaling != "none" and cfg.lr.base_batch_size is not None and gbs is None:
        fail(
            label,
            "lr.scaling",
            f"{cfg.lr.scaling} scaling from lr.base_batch_size needs global_batch_size: "
            "set global_batch_size or use scaling: none",
        )


def _check_adaptive(adaptive: AdaptiveBatchSize, gbs: int | None, slots: int | None, label: str) -> None:
    cap, path = adaptive.max_global_batch_size, "optimizations.adaptive_batch_size.max_global_batch_size"
    if cap is None:
        return
    if gbs is not None and cap < gbs:
        fail(label, path, f"{cap} is smaller than global_batch_size={gbs}, where training starts: raise it")
    floor = adaptive.min_per_slot_batch_size * (slots or 1)
    if cap < floor:
        fail(
            label,
            path,
            f"{cap} is smaller than min_per_slot_batch_size x slots = {floor}: no batch fits; "
            "raise it or lower min_per_slot_batch_size",
        )


# --------------------------------------------------------------------------- loading


def looks_like_path(text: str) -> bool:
    if len(text.splitlines()) > 1:
        return False
    if text.lower().endswith((".yaml", ".yml")):
        return True
    try:
        return os.path.isfile(text)
    except (OSError, ValueError):
        return False


def read_file(source: str | os.PathLike[str]) -> tuple[str, str]:
    path = Path(os.fspath(source)).expanduser()
    label = path.name or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES and path.is_file():  # refused before it is read into memory
            raise error(f"{label}: {size} bytes is more than a config may hold ({MAX_BYTES}): split the file")
        return path.read_text(encoding="utf-8"), label
    except FileNotFoundError:
        raise error(f"config file not found: {os.path.abspath(path)}") from None
    except IsADirectoryError:
        raise error(f"{label}: {os.path.abspath(path)} is a directory, not a YAML file") from None
    except (OSError, ValueError) as exc:
        raise error(f"{label}: cannot read {os.path.abspath(path)}: {exc}") from None


def _check_size(cfg: ExperimentConfig, label: str) -> None:
    """Refuse a config whose YAML (what the run store keeps and reports read back) is over the
    limit, however it came in: a mapping, or aliases that expand."""
    size = len(cfg.to_yaml().encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise error(
            f"{label}: the config is {size} bytes as YAML, more than a config may hold ({MAX_BYTES}): "
            "keep data out of it (name a file instead)"
        )


def _from_data(data: object, label: str) -> ExperimentConfig:
    if data is None:
        return ExperimentConfig()
    if not isinstance(data, Mapping):
        raise error(f"{label}: expected a mapping at the top level, got {show(data)}")
    notes: list[str] = []
    cfg: ExperimentConfig = _parse_section(ExperimentConfig, translate(data, label, notes), "", label, notes)
    _cross_check(cfg, label)
    _check_size(cfg, label)
    if notes:
        note = f"{label}: dtwork ignores {', '.join(notes)} (it runs notebook cells on its own cluster)"
        cfg = dataclasses.replace(cfg, notes=(note,))
    return cfg


def load_config(
    source: str | os.PathLike[str] | Mapping[str, object] | ExperimentConfig | None = None,
) -> ExperimentConfig:
    """Load and validate an experiment config.

    ``source`` is a YAML file path (a PathLike, or a one-line str that ends with .yaml/.yml or names an
    existing file), YAML text, a mapping, an ``ExperimentConfig`` (returned as is) or None (defaults).
    Raises ``ConfigError`` with a one-line message naming the source and the field path.
    """
    if isinstance(source, ExperimentConfig):
        return source
    if source is None:
        return ExperimentConfig()
    if isinstance(source, Mapping):
        return _from_data(source, _LABEL)
    if isinstance(source, os.PathLike) or (isinstance(source, str) and looks_like_path(source)):
        text, label = read_file(source)
        return _from_data(parse_yaml(text, label), label)
    if isinstance(source, str):
        return _from_data(parse_yaml(source, _LABEL), _LABEL)
    raise error(f"{_LABEL}: expected a YAML file path, YAML text, a mapping or None, got {show(source)}")


def _describe(cls: type, prefix: str) -> list[str]:
    lines: list[str] = []
    for spec in fields_of(cls).values():
        path = join(prefix, spec.name)
        if "section" in spec.metadata:
            lines += _describe(spec.metadata["section"], path)
            continue
        default = spec.default_factory() if callable(spec.default_factory) else spec.default
        lines.append(f"{path}: {spec.metadata['rule'].type_text()} = {default!r}")
    return lines


def describe_fields() -> list[str]:
    """Every leaf field as ``path: type = default``, e.g. ``lr.base: float > 0 = 0.1``."""
    return _describe(ExperimentConfig, "")
