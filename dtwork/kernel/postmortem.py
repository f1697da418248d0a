"""``%dtrain debug``: pdb on a rank's last cell error, its prompt in the notebook.

The rank holds the debugger (``runtime/debug/postmortem.py``); this side reads each command with
``input()`` (the notebook's input box, through the kernel's stdin channel), sends it to the
rank, and prints what pdb wrote, until ``q`` (or ``c``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dtwork.errors import DtworkError
from dtwork.kernel.engines import EngineGroup
from dtwork.kernel.tracebacks import left_after_peer
from dtwork.runtime import entry


def failed_first(errors: Mapping[int, BaseException]) -> int:
    """The rank whose error caused the others' (a rank that left after a peer failed comes last)."""
    if not errors:
        raise DtworkError("no rank failed in the last cell: name one, %dtrain debug RANK")
    return min(errors, key=lambda r: (left_after_peer(errors[r]), r))


def drive(
    engines: EngineGroup,
    rank: int,
    read: Callable[[str], str] = input,
    write: Callable[[str], None] = print,
) -> None:
    """Run pdb's prompt for ``rank``'s last cell error until it is quit."""
    opening = engines.call(entry.debug_start, (), {}, ranks=[rank])[0]
    if opening is None:
        raise DtworkError(f"rank {rank} has no cell error to debug: its cells ran without one")
    write(
        f"dtwork: pdb on rank {rank}'s last error (p, pp, up, down, l, where; q to leave)\n{opening.rstrip()}"
    )
    while True:
        try:
            line = read(f"(rank {rank} pdb) ")
        except (EOFError, KeyboardInterrupt):
            line = "q"
        out, ended = engines.call(entry.debug_command, (line,), {}, ranks=[rank])[0]
        if out.strip():
            write(out.rstrip())
        if ended:
            return
