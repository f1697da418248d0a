"""A cell's output by rank: its streams as lines prefixed with the rank, its results displayed.

The watcher hands it each rank's metadata (ipyparallel's IO thread fills it in place) and,
once the cell has ended, the ranks' replies.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence


class RankOutput:
    """The stdout and stderr of the ranks shown (all, or rank 0's), line by line, and their results."""

    def __init__(self, ranks: list[int], *, rank0: bool, quiet: bool) -> None:
        self.ranks = ranks
        self.rank0 = rank0  # rank 0's output only
        self.quiet = quiet  # nothing shown
        self._pos = {"stdout": [0 for _ in ranks], "stderr": [0 for _ in ranks]}
        self._partial: dict[tuple[str, int], str] = {}  # a line not ended yet, by stream and rank

    def shows(self, i: int) -> bool:
        """Whether the rank at index ``i`` is shown."""
        return not self.rank0 or self.ranks[i] == 0

    @property
    def multi(self) -> bool:
        """Whether lines say their rank (more than one rank shown)."""
        return len(self.ranks) > 1 and not self.rank0

    def drain(self, metadata: Sequence[Mapping[str, object]], final: bool = False) -> None:
        """Print what the ranks wrote since the last call (the last unended line too when ``final``)."""
        if self.quiet:
            return
        for stream, positions in self._pos.items():
            for i, text in enumerate(md.get(stream) for md in metadata):
                if not self.shows(i) or not isinstance(text, str) or not text:
                    continue
                new = text[positions[i] :]
                positions[i] = len(text)
                buf = self._partial.get((stream, i), "") + new
                lines = buf.split("\n")
                self._partial[(stream, i)] = "" if final else lines.pop()
                prefix = f"[rank {self.ranks[i]}] " if self.multi else ""
                out = "\n".join(prefix + ln for ln in lines if ln or not final)
                if final and not out.strip():
                    continue
                if out:
                    print(out, file=sys.stderr if stream == "stderr" else sys.stdout, flush=True)

    def display(self, results: Sequence[object]) -> None:
        """Display each shown rank's rich outputs and its cell's value (``Out``), as IPython would."""
        if self.quiet:
            return
        try:
            from IPython.core.interactiveshell import InteractiveShell
            from IPython.display import display as show
        except ImportError:
            return

        def display(data: object, raw: bool = True, metadata: object = None) -> None:
            if InteractiveShell.initialized():
                show(data, raw=raw, metadata=metadata)
            elif isinstance(data, dict) and data.get("text/plain"):  # a script: the text, not a repr
                print(data["text/plain"])

        for i, reply in enumerate(results):
            if not self.shows(i) or isinstance(reply, BaseException):
                continue
            for output in getattr(reply, "outputs", []) or []:
                display(output.get("data", {}), raw=True, metadata=output.get("metadata"))
            data = getattr(reply, "execute_result", None) or {}
            data = data.get("data") if isinstance(data, dict) else None
            if data:
                if self.multi:
                    print(f"[rank {self.ranks[i]}] Out:")
                display(data, raw=True)
