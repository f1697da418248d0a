"""Errors and warnings that dtwork shows to the notebook user.

Every message is one line that says what happened, what is available and what to do.
The magics print ``DtworkError`` messages without a traceback.
"""

from __future__ import annotations

import difflib


class DtworkError(Exception):
    """A user-facing error: its message is complete and is shown without a traceback."""

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of printing dtwork's internal frames.
        return [f"{type(self).__name__}: {self}"]


class ConfigError(DtworkError, ValueError):
    """An experiment config is invalid; the message names the field path."""


class RankFailure(DtworkError):
    """One or more ranks failed (died, raised or stalled) while running a cell."""

    def __init__(self, message: str, ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.ranks = list(ranks or [])

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


class DtworkWarning(UserWarning):
    """A visible warning about a setting dtwork adjusted (e.g. a dropped batch remainder)."""


def did_you_mean(word: str, choices: list[str]) -> str:
    """' (did you mean X?)' for the closest of choices to a mistyped word, else ''."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
