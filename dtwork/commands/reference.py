"""Where the installed reference is, and one section of it: ``dtwork help`` and ``%dtrain help``.

An install ships ``docs/reference.md`` as ``<prefix>/share/doc/dtwork/reference.md`` (pyproject's
data-files); a source checkout has it in ``docs/``.
"""

from __future__ import annotations

import re
import site
import sys
from pathlib import Path

from dtwork.errors import DtworkError, did_you_mean

INSTALLED = Path("share", "doc", "dtwork", "reference.md")  # under the Python prefix the wheel installs into


def reference_path(prefixes: list[str] | None = None) -> Path:
    """The reference this dtwork came with: the installed copy, else the source checkout's."""
    roots = prefixes if prefixes is not None else [sys.prefix, site.getuserbase()]
    candidates = [Path(p) / INSTALLED for p in roots]
    candidates.append(Path(__file__).resolve().parents[2] / "docs" / "reference.md")
    for path in candidates:
        if path.is_file():
            return path
    raise DtworkError(
        "the reference is not installed here (looked in "
        f"{', '.join(str(c) for c in candidates)}); reinstall dtwork with pip"
    )


def sections(text: str) -> dict[str, str]:
    """The text under each ``### `name` `` heading, by name (``ctx.loader``, ``%dtrain start``)."""
    parts = re.split(r"^### `([^`]+)`[^\n]*$", text, flags=re.M)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def help_text(topic: str | None = None, path: Path | None = None) -> str:
    """The reference's path and how to read a section, or the section ``topic`` names."""
    path = path or reference_path()
    if not topic:
        return (
            f"dtwork: the full reference is {path}\n"
            "one section: dtwork help ctx.loader (or %dtrain help start, %dtrain help ctx.steps)"
        )
    found = sections(path.read_text(encoding="utf-8"))
    for key in (topic, f"%dtrain {topic}", f"ctx.{topic}"):
        if key in found:
            return f"### {key}\n\n{found[key]}\n\n(from {path})"
    raise DtworkError(
        f"no section {topic!r} in the reference{did_you_mean(topic, list(found))}: "
        "try a subcommand (start, runs) or a ctx name (ctx.loader)"
    )
