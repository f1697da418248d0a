"""Durations as people write and read them: ``90``, ``90s``, ``30m``, ``2h``, ``1d`` (a kept
cluster's keep time: ``%dtrain start --keep``, the config's ``keep``)."""

from __future__ import annotations

import math
import re

_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*")


def parse(text: object) -> float:
    """Seconds, from a number of seconds or a number with s, m, h or d; a ValueError saying what
    is expected else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _PATTERN.fullmatch(str(text))
        if m is None:
            raise ValueError(
                f"keep time {str(text)[:40]!r} is not a duration: use seconds or a number with s, m, h or d "
                "(e.g. 2h)"
            )
        value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"keep time must be more than 0 s, got {text!r}: e.g. 30m")
    return value


def said(seconds: float) -> str:
    """``90`` -> ``1 min 30 s``; ``7200`` -> ``2 h``: its two largest units."""
    s = round(seconds)
    parts = [(s // 86400, "d"), (s % 86400 // 3600, "h"), (s % 3600 // 60, "min"), (s % 60, "s")]
    return " ".join([f"{v} {u}" for v, u in parts if v][:2]) or "0 s"
