"""``%dtrain debug`` and ``breakpoint()``: pdb on a rank, its prompt in the notebook.

The rank holds the debugger (``runtime/debug/postmortem.py``); this side reads each command with
``input()`` (the notebook's input box, through the kernel's stdin channel), sends it to the
rank, and prints what pdb wrote, until ``q`` (or ``c``). A rank stopped at ``breakpoint()``
(``runtime/debug/breakpoints.py``) takes its commands on its side channel instead, since its
main thread is in pdb.
"""

from __future__ import annotations

import signal
import threading
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
    _prompt(rank, lambda line: engines.call(entry.debug_command, (line,), {}, ranks=[rank])[0], read, write)


def drive_stop(
    engines: EngineGroup,
    rank: int,
    stop: Mapping[str, object],
    read: Callable[[str], str] = input,
    write: Callable[[str], None] = print,
) -> None:
    """Run pdb's prompt for ``rank``, stopped at ``breakpoint()``, until it continues (c) or quits
    (q: the cell fails on that rank). The rank's main thread is in pdb, not free for ipyparallel:
    the commands go on its side channel. Ctrl-C at the prompt quits, as EOF does in pdb."""
    at = f" at {stop['where']}" if stop.get("where") else ""
    write(
        f"dtwork: rank {rank} stopped at breakpoint(){at} (p, pp, n, s, l, where; c continues, q fails the cell)"
    )
    opening = str(stop.get("opening") or "").rstrip()
    if opening:
        write(opening)
    # The watcher had made Ctrl-C a flag (kernel/watcher.py): at the prompt it must end input() again.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    try:
        _prompt(rank, lambda line: engines.pdb_command(rank, line), read, write)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _prompt(
    rank: int,
    send: Callable[[str], tuple[str, bool]],
    read: Callable[[str], str],
    write: Callable[[str], None],
) -> None:
    while True:
        try:
            line = read(f"(rank {rank} pdb) ")
        except (EOFError, KeyboardInterrupt):
            line = "q"
        out, ended = send(line)
        if out.strip():
            write(out.rstrip())
        if ended:
            return
