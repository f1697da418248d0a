"""Text for a terminal: values, tables, and names from a store made safe to print."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

__all__ = ["number", "printable", "table"]

# What a terminal would act on rather than show: C0 but newline, DEL, C1, bidirectional and
# invisible format characters, line and paragraph separators, tags, lone surrogates.
_UNSAFE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]"
)


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on written as a ``\\uXXXX`` escape
    (valid inside JSON strings too): names in a store may come from anyone."""
    return _UNSAFE.sub(
        lambda m: f"\\u{ord(m[0]):04x}" if ord(m[0]) <= 0xFFFF else f"\\U{ord(m[0]):08x}", text
    )


def number(value: object) -> str:
    """A value as a table shows it: 4 significant digits, "-" for None."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    return str(value)


def table(header: Sequence[str], rows: list[list[str]], right: set[int]) -> str:
    """Columns padded to their widest cell, those in ``right`` right-aligned; every cell printable."""
    lines = [[printable(c) for c in line] for line in (header, *rows)]  # escaped first: widths hold
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for line in lines:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)
