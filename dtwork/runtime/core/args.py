"""Argument checks for the ctx helpers: one clear line with a "did you mean", as the config gives."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import SupportsFloat, SupportsInt, cast

from dtwork.errors import DtworkError


def keyword_names(fn: Callable[..., object]) -> list[str]:
    """The keyword arguments ``fn`` accepts by name."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds and p.name != "self"]


def check_keywords(where: str, given: Iterable[str], valid: list[str]) -> None:
    """Refuse a keyword ``where`` does not take, naming the closest valid one."""
    for name in given:
        if name in valid:
            continue
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f"did you mean {close[0]}=?" if close else "it takes " + ", ".join(f"{v}=" for v in valid)
        raise DtworkError(f"{where} got an unknown argument {name}=: {hint}")


def check_count(where: str, name: str, value: object, *, minimum: int = 0) -> None:
    """Refuse a count that is not an int (a string, a float) or below ``minimum``; None passes."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        example = f"{name}={int(cast(SupportsInt, value))}" if _integral(value) else f"{name}=10"
        raise DtworkError(
            f"{where}: {name} must be an int, got {value!r} ({type(value).__name__}): use {example}"
        )
    if value < minimum:
        raise DtworkError(f"{where}: {name} must be at least {minimum}, got {value}")


def _integral(value: object) -> bool:
    try:
        return float(cast(SupportsFloat, value)) == int(float(cast(SupportsFloat, value)))
    except (TypeError, ValueError):
        return False
