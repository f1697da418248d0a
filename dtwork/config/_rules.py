"""Field rules and the checks behind them: one leaf value in, a normalised value or a ConfigError out.

The values checked here are parsed YAML (or a user's mapping), of any shape until checked: ``Any`` in
these signatures marks that parser boundary, and the config's free-form mappings
(``hyperparameters``, ``data``), which the user's code reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NoReturn

from dtwork.errors import ConfigError
from dtwork.shared import durations

LENGTH_UNITS = ("batches", "records", "epochs")


class Length(NamedTuple):
    """A Determined training length such as ``{batches: 117}``: a unit of LENGTH_UNITS and a count."""

    unit: str
    value: int

    def to_dict(self) -> dict[str, int]:
        return {self.unit: self.value}


@dataclass(frozen=True)
class Rule:
    """How one leaf field is checked; ``kind`` is a key of _KIND_TEXT."""

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
    "duration": ("a duration such as 2h, 30m, 90s or seconds, more than 0", "float (s) | str"),
    "length": (
        "a length like {{batches: 100}} (batches, records or epochs >= 1)",
        "{batches|records|epochs: int}",
    ),
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def leaf(default: Any, rule: Rule) -> Any:
    return field(default=default, metadata={"rule": rule})


def section(cls: type) -> Any:
    return field(default_factory=cls, metadata={"section": cls})


INT1 = Rule("int", lo=1)
INT1_OPT = Rule("int", lo=1, optional=True)
INT0 = Rule("int", lo=0)
POS = Rule("float", lo=0, lo_open=True)
NONNEG = Rule("float", lo=0)
BOOL = Rule("bool")
STR_OPT = Rule("str", optional=True)
LENGTH_OPT = Rule("length", optional=True)
MAPPING = Rule("mapping")


def fields_of(cls: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    """The fields a config file sets (derived fields such as ``notes`` are left out)."""
    return {f.name: f for f in dataclasses.fields(cls) if "derived" not in f.metadata}


def error(message: str) -> ConfigError:
    return ConfigError(" ".join(message.splitlines()))


def fail(label: str, path: str, message: str) -> NoReturn:
    raise error(f"{label}: {path}: {message}" if path else f"{label}: {message}")


def show(value: object) -> str:
    """A short one-line rendering of a bad value: repr for scalars, the type name for the rest."""
    if value is None or isinstance(value, (bool, numbers.Number, str)):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return type(value).__name__


def key_text(key: object) -> str:
    if isinstance(key, str) and key and key.isprintable() and key.strip() == key:
        return key
    return repr(key)


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except (OverflowError, TypeError, ValueError):
        return None


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check(label: str, path: str, value: Any, rule: Rule, extra: str = "") -> Any:
    """Validate one leaf value against ``rule``; return it normalised or raise a ConfigError."""
    if value is None and rule.optional:
        return None
    kind, hint = rule.kind, ""
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and _is_int(value):
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
    elif kind == "length" and isinstance(value, Mapping) and len(value) == 1:
        unit, count = next(iter(value.items()))
        if unit in LENGTH_UNITS and _is_int(count) and count >= 1:
            return Length(unit, int(count))
    elif kind == "mapping":
        return mapping(label, path, value)
    elif kind == "duration" and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return durations.parse(value)
    fail(label, path, f"expected {rule.expected()}{extra}, got {show(value)}{hint}")


def mapping(label: str, path: str, value: Any) -> dict[str, Any]:
    """A free-form mapping with string keys, as plain dicts and lists."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        fail(label, path, f"expected a mapping, got {show(value)}")
    for key in value:
        if not isinstance(key, str):
            fail(label, path, f"keys must be strings, got {show(key)}")
    try:
        out: dict[str, Any] = plain(value)
    except RecursionError:
        fail(label, path, "nested too deeply (or refers to itself)")
    return out


def reject_unknown(
    label: str, path: str, raw: Mapping[Any, Any], valid: list[str], noted: tuple[str, ...], notes: list[str]
) -> None:
    """Fail on a key that is neither a field nor a Determined field dtwork ignores (those are noted)."""
    for key in raw:
        if key in valid:
            continue
        if key in noted:
            notes.append(join(path, key))
            continue
        close = difflib.get_close_matches(str(key), valid, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "valid keys: " + ", ".join(valid)
        fail(label, join(path, key_text(key)), f"unknown key; {hint}")


def plain(value: Any) -> Any:
    """Dataclasses, mappings and sequences as plain dicts and lists (derived fields left out)."""
    if isinstance(value, Length):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: plain(getattr(value, name)) for name in fields_of(type(value))}
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value
