"""Experiment configs in Determined AI's vocabulary: load, validate, edit and dump them.

``load_config`` takes YAML text, a YAML file path, a mapping, an ``ExperimentConfig`` or ``None`` and
returns a frozen ``ExperimentConfig``. Every problem raises a one-line ``ConfigError`` that starts with
the source label ("config", or the file name) and the dotted field path, e.g.
``exp.yaml: optimizations.aggregation_frequency: expected an integer >= 1, got 'two'``.

YAML is read with YAML 1.2 scalars: only ``true``/``false`` are booleans (``yes``/``on`` stay strings)
and ``1e-8`` is a float. Duplicate keys are an error.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from dtwork.errors import ConfigError

__all__ = [
    "EXAMPLE_YAML",
    "CheckpointConfig",
    "Compression",
    "ExperimentConfig",
    "GNSConfig",
    "LRConfig",
    "OptimizerConfig",
    "Optimizations",
    "Resources",
    "ScheduleConfig",
    "describe_fields",
    "load_config",
]

_LABEL = "config"
_SEED_MAX = 2**32 - 1


# --------------------------------------------------------------------------- field rules


@dataclass(frozen=True)
class _Rule:
    """How one leaf field is checked; ``kind`` is int, float, bool, str, choice, betas or mapping."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    optional: bool = False
    choices: tuple[str, ...] = ()

    def admits(self, x: float) -> bool:
        if isinstance(x, float) and not math.isfinite(x):
            return False
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return False
        return self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)

    def bounds(self) -> str:
        if self.lo is not None and self.hi is not None:
            left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f" in {left}{_num(self.lo)}, {_num(self.hi)}{right}"
        if self.lo is not None:
            return f" {'>' if self.lo_open else '>='} {_num(self.lo)}"
        return ""

    def expected(self) -> str:
        """What an error message says was expected."""
        text = _KIND_TEXT[self.kind][0].format(choices=", ".join(self.choices))
        return text + self.bounds() + (" or null" if self.optional else "")

    def type_text(self) -> str:
        """The type that ``describe_fields`` shows."""
        text = "|".join(self.choices) if self.kind == "choice" else _KIND_TEXT[self.kind][1]
        return text + self.bounds() + (" | None" if self.optional else "")


# kind -> (what an error message expects, what describe_fields shows)
_KIND_TEXT = {
    "int": ("an integer", "int"),
    "float": ("a number", "float"),
    "bool": ("true or false", "bool"),
    "str": ("a non-empty string", "str"),
    "choice": ("one of {choices}", ""),
    "betas": ("a list of two numbers in [0, 1)", "tuple[float, float]"),
    "mapping": ("a mapping with string keys", "dict[str, Any]"),
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _leaf(default: Any, rule: _Rule) -> Any:
    return field(default=default, metadata={"rule": rule})


def _section(cls: type) -> Any:
    return field(default_factory=cls, metadata={"section": cls})


_INT1 = _Rule("int", lo=1)
_INT1_OPT = _Rule("int", lo=1, optional=True)
_INT0 = _Rule("int", lo=0)
_POS = _Rule("float", lo=0, lo_open=True)
_NONNEG = _Rule("float", lo=0)
_BOOL = _Rule("bool")
_STR_OPT = _Rule("str", optional=True)


class _Section:
    """Shared behaviour of the config dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists and scalars; ``load_config`` turns the result back into an equal object."""
        return _plain(self)


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class Resources(_Section):
    slots_per_trial: int | None = _leaf(None, _INT1_OPT)


@dataclass(frozen=True)
class Compression(_Section):
    type: str = _leaf("none", _Rule("choice", choices=("none", "fp16", "bf16", "powersgd")))
    rank: int = _leaf(1, _INT1)
    start_iter: int = _leaf(10, _INT0)


@dataclass(frozen=True)
class Optimizations(_Section):
    aggregation_frequency: int = _leaf(1, _INT1)
    average_aggregated_gradients: bool = _leaf(True, _BOOL)
    gradient_compression: Compression = _section(Compression)
    tensor_fusion_threshold: float = _leaf(25.0, _POS)
    auto_tune_tensor_fusion: bool = _leaf(False, _BOOL)
    average_training_metrics: bool = _leaf(True, _BOOL)


@dataclass(frozen=True)
class OptimizerConfig(_Section):
    type: str = _leaf("sgd", _Rule("choice", choices=("sgd", "adam", "adamw", "lars")))
    momentum: float = _leaf(0.9, _NONNEG)
    nesterov: bool = _leaf(False, _BOOL)
    weight_decay: float = _leaf(0.0, _NONNEG)
    betas: tuple[float, float] = _leaf((0.9, 0.999), _Rule("betas"))
    eps: float = _leaf(1e-8, _POS)
    trust_coefficient: float = _leaf(0.001, _POS)


@dataclass(frozen=True)
class LRConfig(_Section):
    base: float = _leaf(0.1, _POS)
    scaling: str = _leaf("none", _Rule("choice", choices=("none", "linear", "sqrt")))
    base_batch_size: int | None = _leaf(None, _INT1_OPT)
    warmup: int = _leaf(0, _INT0)


_SCHEDULES = ("constant", "step", "exponential", "cosine", "polynomial")


@dataclass(frozen=True)
class ScheduleConfig(_Section):
    type: str = _leaf("constant", _Rule("choice", choices=_SCHEDULES))
    step_size: int = _leaf(1000, _INT1)
    gamma: float = _leaf(0.1, _POS)
    power: float = _leaf(1.0, _POS)
    min_factor: float = _leaf(0.0, _Rule("float", lo=0, hi=1))
    total_steps: int | None = _leaf(None, _INT1_OPT)


@dataclass(frozen=True)
class CheckpointConfig(_Section):
    every: int | None = _leaf(None, _INT1_OPT)
    keep: int = _leaf(3, _INT1)
    directory: str = _leaf(".dtwork/checkpoints", _Rule("str"))


@dataclass(frozen=True)
class GNSConfig(_Section):
    enabled: bool = _leaf(False, _BOOL)
    ema_decay: float = _leaf(0.95, _Rule("float", lo=0, hi=1, lo_open=True, hi_open=True))
    every: int = _leaf(4, _INT1)


@dataclass(frozen=True)
class ExperimentConfig(_Section):
    """A validated experiment config; build it with ``load_config`` and edit it with ``replace``/``with_path``."""

    name: str | None = _leaf(None, _STR_OPT)
    description: str | None = _leaf(None, _STR_OPT)
    resources: Resources = _section(Resources)
    global_batch_size: int | None = _leaf(None, _INT1_OPT)
    optimizations: Optimizations = _section(Optimizations)
    optimizer: OptimizerConfig = _section(OptimizerConfig)
    lr: LRConfig = _section(LRConfig)
    lr_schedule: ScheduleConfig = _section(ScheduleConfig)
    mixed_precision: str = _leaf("none", _Rule("choice", choices=("none", "fp16", "bf16")))
    max_steps: int | None = _leaf(None, _INT1_OPT)
    max_epochs: int | None = _leaf(None, _INT1_OPT)
    checkpoint: CheckpointConfig = _section(CheckpointConfig)
    max_restarts: int = _leaf(0, _INT0)
    seed: int = _leaf(0, _Rule("int", lo=0, hi=_SEED_MAX))
    gns: GNSConfig = _section(GNSConfig)
    hyperparameters: dict[str, Any] = field(default_factory=dict, metadata={"rule": _Rule("mapping")})

    def to_yaml(self) -> str:
        """YAML text that ``load_config`` reads back into an equal config."""
        return yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False, allow_unicode=True)

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A new validated config with top-level fields changed (sections accept mappings or shorthands)."""
        data = self.to_dict()
        data.update({key: _plain(value) for key, value in changes.items()})
        return load_config(data)

    def with_path(self, dotted: str, value: Any) -> ExperimentConfig:
        """A new validated config with one field changed, e.g. ``with_path("lr.base", 0.2)``."""
        parts = dotted.split(".") if isinstance(dotted, str) else [""]
        if not all(parts):
            raise _error(f"{_LABEL}: {dotted!r}: expected a dotted field path like 'lr.base'")
        data = self.to_dict()
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                prefix = ".".join(parts[: depth + 1])
                raise _error(f"{_LABEL}: {prefix}: not a section, so {dotted!r} cannot be set")
            node = child
        node[parts[-1]] = _plain(value)
        return load_config(data)

    def per_slot_batch_size(self, slots: int) -> int | None:
        """Examples per slot per step: floor(global_batch_size / slots), or None without a global size."""
        slots = _check(_LABEL, "slots", slots, _INT1)
        gbs = self.global_batch_size
        if gbs is None:
            return None
        if gbs < slots:
            raise _error(
                f"{_LABEL}: global_batch_size: {gbs} is smaller than the {slots} slots; each slot needs "
                f"at least one example: raise global_batch_size to >= {slots}"
            )
        return gbs // slots

    def dropped_examples(self, slots: int) -> int:
        """Examples per step that an even split over ``slots`` leaves out (the remainder)."""
        per_slot = self.per_slot_batch_size(slots)
        return 0 if per_slot is None or self.global_batch_size is None else self.global_batch_size % slots

    def effective_lr(self) -> float:
        """``lr.base`` scaled from ``lr.base_batch_size`` to ``global_batch_size`` per ``lr.scaling``."""
        lr, gbs = self.lr, self.global_batch_size
        if lr.scaling == "none" or lr.base_batch_size is None or gbs is None:
            return lr.base
        ratio = gbs / lr.base_batch_size
        return lr.base * (ratio if lr.scaling == "linear" else math.sqrt(ratio))

    def schedule_total_steps(self) -> int | None:
        """``lr_schedule.total_steps``, defaulting to ``max_steps``."""
        total = self.lr_schedule.total_steps
        return total if total is not None else self.max_steps


# section -> field that a non-mapping shorthand sets
_SHORTHAND: dict[type, str] = {
    Compression: "type",
    OptimizerConfig: "type",
    LRConfig: "base",
    ScheduleConfig: "type",
    GNSConfig: "enabled",
}


# --------------------------------------------------------------------------- validation


def _error(message: str) -> ConfigError:
    return ConfigError(" ".join(message.splitlines()))


def _fail(label: str, path: str, message: str) -> NoReturn:
    raise _error(f"{label}: {path}: {message}" if path else f"{label}: {message}")


def _show(value: Any) -> str:
    """A short one-line rendering of a bad value: repr for scalars, the type name for the rest."""
    if value is None or isinstance(value, (bool, numbers.Number, str)):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return type(value).__name__


def _key_text(key: Any) -> str:
    ok = isinstance(key, str) and key and key.isprintable() and key.strip() == key
    return key if ok else repr(key)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except (OverflowError, TypeError, ValueError):
        return None


def _check(label: str, path: str, value: Any, rule: _Rule, extra: str = "") -> Any:
    """Validate one leaf value against ``rule``; return it normalised or raise a ConfigError."""
    if value is None and rule.optional:
        return None
    kind, hint = rule.kind, ""
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if rule.admits(int(value)):
            return int(value)
    elif kind == "float":
        number = _as_float(value)
        if number is not None and rule.admits(number):
            return number
    elif kind == "str" and isinstance(value, str) and value.strip():
        return value
    elif kind == "choice" and isinstance(value, str):
        if value.lower() in rule.choices:
            return value.lower()
        close = difflib.get_close_matches(value.lower(), rule.choices, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
    elif kind == "betas" and isinstance(value, (list, tuple)) and len(value) == 2:
        pair = tuple(_as_float(v) for v in value)
        if all(b is not None and 0 <= b < 1 for b in pair):
            return pair
    elif kind == "mapping":
        return _hyperparameters(label, path, value)
    _fail(label, path, f"expected {rule.expected()}{extra}, got {_show(value)}{hint}")


def _hyperparameters(label: str, path: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        _fail(label, path, f"expected a mapping, got {_show(value)}")
    for key in value:
        if not isinstance(key, str):
            _fail(label, path, f"keys must be strings, got {_show(key)}")
    try:
        return _plain(value)
    except RecursionError:
        _fail(label, path, "nested too deeply (or refers to itself)")


def _reject_unknown(label: str, path: str, raw: Mapping[Any, Any], valid: list[str]) -> None:
    for key in raw:
        if key in valid:
            continue
        close = difflib.get_close_matches(str(key), valid, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "valid keys: " + ", ".join(valid)
        _fail(label, _join(path, _key_text(key)), f"unknown key; {hint}")


def _parse_section(cls: type[Any], raw: Any, path: str, label: str) -> Any:
    """Build section ``cls`` from a mapping, a shorthand scalar or None (defaults)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        short = _SHORTHAND.get(cls)
        if short is None:
            _fail(label, path, f"expected a mapping, got {_show(raw)}")
        return cls(**{short: _check(label, path, raw, fields[short].metadata["rule"], " or a mapping")})
    _reject_unknown(label, path, raw, list(fields))
    values: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in raw:
            continue
        sub = _join(path, name)
        if "section" in spec.metadata:
            values[name] = _parse_section(spec.metadata["section"], raw[name], sub, label)
        else:
            values[name] = _check(label, sub, raw[name], spec.metadata["rule"])
    return cls(**values)


def _cross_check(cfg: ExperimentConfig, label: str) -> None:
    gbs, slots = cfg.global_batch_size, cfg.resources.slots_per_trial
    if gbs is not None and slots is not None and gbs < slots:
        _fail(
            label,
            "global_batch_size",
            f"{gbs} is smaller than resources.slots_per_trial={slots}; each slot needs at least one "
            f"example: raise global_batch_size to >= {slots}",
        )
    schedule = cfg.lr_schedule
    if schedule.type in ("cosine", "polynomial") and cfg.schedule_total_steps() is None:
        _fail(label, "lr_schedule.total_steps", f"{schedule.type} needs total_steps or max_steps")
    if cfg.lr.scaling != "none" and cfg.lr.base_batch_size is not None and gbs is None:
        _fail(
            label,
            "lr.scaling",
            f"{cfg.lr.scaling} scaling from lr.base_batch_size needs global_batch_size: "
            "set global_batch_size or use scaling: none",
        )


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


# --------------------------------------------------------------------------- YAML


_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_EXP_FLOAT_RE = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans and exponent floats that rejects duplicate keys."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    if (key_node.tag, key_node.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                        )
                    seen.add((key_node.tag, key_node.value))
        return super().construct_mapping(node, deep=deep)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly the strings that ``_Loader`` would not read back as strings."""


def _tune_resolvers(cls: type[yaml.SafeLoader] | type[yaml.SafeDumper], base: Any) -> None:
    cls.yaml_implicit_resolvers = {
        first: [(tag, regex) for tag, regex in entries if tag != _BOOL_TAG]
        for first, entries in base.yaml_implicit_resolvers.items()
    }
    cls.add_implicit_resolver(_BOOL_TAG, _BOOL_RE, list("tTfF"))
    cls.add_implicit_resolver(_FLOAT_TAG, _EXP_FLOAT_RE, list("-+0123456789."))


_tune_resolvers(_Loader, yaml.SafeLoader)
_tune_resolvers(_Dumper, yaml.SafeDumper)


def _parse_yaml(text: str, label: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise _error(
            f"{label}: invalid YAML{where}: {exc.problem or exc.context or 'syntax error'}"
        ) from None
    except yaml.YAMLError as exc:
        raise _error(f"{label}: invalid YAML: {exc}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise _error(f"{label}: invalid YAML value: {exc}") from None


# --------------------------------------------------------------------------- loading


def _looks_like_path(text: str) -> bool:
    if len(text.splitlines()) > 1:
        return False
    if text.lower().endswith((".yaml", ".yml")):
        return True
    try:
        return os.path.isfile(text)
    except (OSError, ValueError):
        return False


def _read_file(source: str | os.PathLike[str]) -> tuple[str, str]:
    path = Path(os.fspath(source)).expanduser()
    label = path.name or str(path)
    try:
        return path.read_text(encoding="utf-8"), label
    except FileNotFoundError:
        raise _error(f"config file not found: {os.path.abspath(path)}") from None
    except IsADirectoryError:
        raise _error(f"{label}: {os.path.abspath(path)} is a directory, not a YAML file") from None
    except (OSError, ValueError) as exc:
        raise _error(f"{label}: cannot read {os.path.abspath(path)}: {exc}") from None


def _from_data(data: Any, label: str) -> ExperimentConfig:
    if data is None:
        return ExperimentConfig()
    if not isinstance(data, Mapping):
        raise _error(f"{label}: expected a mapping at the top level, got {_show(data)}")
    cfg = _parse_section(ExperimentConfig, data, "", label)
    _cross_check(cfg, label)
    return cfg


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | ExperimentConfig | None = None,
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
    if isinstance(source, os.PathLike) or (isinstance(source, str) and _looks_like_path(source)):
        text, label = _read_file(source)
        return _from_data(_parse_yaml(text, label), label)
    if isinstance(source, str):
        return _from_data(_parse_yaml(source, _LABEL), _LABEL)
    raise _error(f"{_LABEL}: expected a YAML file path, YAML text, a mapping or None, got {_show(source)}")


def _describe(cls: type[Any], prefix: str) -> list[str]:
    lines: list[str] = []
    for spec in dataclasses.fields(cls):
        path = _join(prefix, spec.name)
        if "section" in spec.metadata:
            lines += _describe(spec.metadata["section"], path)
            continue
        default = spec.default_factory() if callable(spec.default_factory) else spec.default
        lines.append(f"{path}: {spec.metadata['rule'].type_text()} = {default!r}")
    return lines


def describe_fields() -> list[str]:
    """Every leaf field as ``path: type = default``, e.g. ``lr.base: float > 0 = 0.1``."""
    return _describe(ExperimentConfig, "")


EXAMPLE_YAML = """\
# dtwork experiment config (Determined AI vocabulary). Every field is optional;
# the comments give each field's default. Load it with dtwork.config.load_config(path).
name: resnet50-imagenet              # shown in the workbench (default: null)
description: ResNet-50 on ImageNet with linear lr scaling   # (default: null)
resources:
  slots_per_trial: 4                 # data-parallel ranks, one GPU each; >= 1 (default: null = all)
global_batch_size: 512               # examples per step over all slots; >= slots_per_trial (default: null)
optimizations:
  aggregation_frequency: 1           # batches accumulated per gradient all-reduce; >= 1 (default: 1)
  average_aggregated_gradients: true # divide accumulated gradients by that count (default: true)
  gradient_compression:              # or a shorthand: none | fp16 | bf16 | powersgd (default: none)
    type: powersgd
    rank: 2                          # PowerSGD matrix rank; >= 1 (default: 1)
    start_iter: 10                   # plain all-reduce for the first N steps (default: 10)
  tensor_fusion_threshold: 25.0      # DDP bucket size in MB; > 0 (default: 25.0)
  auto_tune_tensor_fusion: false     # try bucket sizes and keep the fastest (default: false)
  average_training_metrics: true     # average metrics over slots (default: true)
optimizer:                           # or a shorthand: sgd | adam | adamw | lars (default: sgd)
  type: sgd
  momentum: 0.9                      # sgd and lars; >= 0 (default: 0.9)
  nesterov: false                    # sgd (default: false)
  weight_decay: 0.0001               # >= 0 (default: 0.0)
  betas: [0.9, 0.999]                # adam and adamw (default: [0.9, 0.999])
  eps: 1.0e-08                       # adam and adamw; > 0 (default: 1.0e-08)
  trust_coefficient: 0.001           # lars; > 0 (default: 0.001)
lr:                                  # or a number: the shorthand for lr.base
  base: 0.1                          # lr tuned at base_batch_size; > 0 (default: 0.1)
  scaling: linear                    # none | linear | sqrt (default: none)
  base_batch_size: 256               # batch size base was tuned for (default: null = global_batch_size)
  warmup: 500                        # linear warmup steps; >= 0 (default: 0)
lr_schedule:                         # or a shorthand: constant | step | exponential | cosine | polynomial
  type: cosine                       # (default: constant)
  step_size: 1000                    # step: decay every N steps (default: 1000)
  gamma: 0.1                         # step and exponential: decay factor; > 0 (default: 0.1)
  power: 1.0                         # polynomial: exponent; > 0 (default: 1.0)
  min_factor: 0.0                    # lowest lr as a fraction of the peak, in [0, 1] (default: 0.0)
  total_steps: null                  # cosine and polynomial length (default: null = max_steps)
mixed_precision: bf16                # none | fp16 | bf16 (default: none)
max_steps: 10000                     # stop after N steps; >= 1 (default: null)
max_epochs: null                     # stop after N passes over the data; >= 1 (default: null)
checkpoint:
  every: 1000                        # save every N steps (default: null = off)
  keep: 3                            # keep the newest N checkpoints; >= 1 (default: 3)
  directory: .dtwork/checkpoints     # (default: .dtwork/checkpoints)
max_restarts: 1                      # restarts after a failure; >= 0 (default: 0)
seed: 42                             # in [0, 4294967295] (default: 0)
gns:                                 # or true/false: the shorthand for gns.enabled
  enabled: true                      # track the gradient noise scale (default: false)
  ema_decay: 0.95                    # smoothing per step, in (0, 1) (default: 0.95)
  every: 4                           # measure every Nth step; 1 = all (default: 4)
hyperparameters:                     # free-form values for your training code (default: {})
  depth: 50
  dropout: 0.1
  augment: [flip, crop]
"""
