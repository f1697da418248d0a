"""What the running cell passed to the ctx helpers, as they took it (their effective arguments),
so that the report records what ran: ``cell_settings`` sends those of the last cell."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtwork.runtime.core.payloads import Plain

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState


def note(state: RankState, helper: str, **args: object) -> None:
    """Keep ``helper``'s arguments for the running cell (the last call of it wins, in call order)."""
    state.calls.pop(helper, None)
    state.calls[helper] = (state.cell, {k: plain(v) for k, v in args.items() if v is not None})


def of_cell(state: RankState) -> dict[str, dict[str, Plain]]:
    """The helpers the last cell called, with their arguments."""
    return {helper: args for helper, (cell, args) in state.calls.items() if cell == state.cell}


def plain(value: object) -> Plain:
    """A value a report can print: numbers, flags and text as they are, anything else by its name."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    if callable(value):
        return getattr(value, "__name__", type(value).__name__)
    return type(value).__name__
