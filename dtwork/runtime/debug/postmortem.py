"""A post-mortem pdb on this rank's last cell error, driven one command at a time by the kernel.

An engine has no stdin: the kernel reads each command from the notebook (``input()``), sends it
here, and prints what pdb wrote. The debugger's frames start at the user's cell.
"""

from __future__ import annotations

import io
import pdb
from types import TracebackType

from dtwork.runtime.core import control
from dtwork.runtime.debug.stacks import cell_name

_ENDS = {"q", "quit", "exit", "c", "cont", "continue"}


class _Debugger(pdb.Pdb):
    """pdb writing into a buffer that each command's reply empties."""

    def __init__(self) -> None:
        self.out = io.StringIO()
        super().__init__(stdin=io.StringIO(), stdout=self.out, nosigint=True, readrc=False)

    def take(self) -> str:
        text = self.out.getvalue()
        self.out.seek(0)
        self.out.truncate()
        return text


_session: list[_Debugger] = []


def _from_cell(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the user's cell on (IPython's own frames above it dropped)."""
    t = tb
    while t is not None and cell_name(t.tb_frame.f_code.co_filename) is None:
        t = t.tb_next
    return t or tb


def start() -> str | None:
    """Open a debugger on the last cell error: what it says first (the failing line), or None."""
    error = control.last_error()
    if error is None:
        return None
    debugger = _Debugger()
    debugger.reset()
    debugger.setup(None, _from_cell(error.__traceback__))
    debugger.print_stack_entry(debugger.stack[debugger.curindex])
    _session[:] = [debugger]
    return f"{type(error).__name__}: {error}\n{debugger.take()}"


def command(line: str) -> tuple[str, bool]:
    """Run one pdb command; what it wrote, and whether the session ended (q or c)."""
    if not _session:
        return "no debugger is open on this rank", True
    debugger = _session[0]
    ended = bool(debugger.onecmd(line)) or line.strip() in _ENDS
    text = debugger.take()
    if ended:
        _session.clear()
    return text, ended
