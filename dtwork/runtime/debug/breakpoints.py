"""``breakpoint()`` on a rank: pdb stops this rank, its prompt in the notebook.

An engine has no stdin. ``sys.breakpointhook`` (set when the rank joins) opens a pdb whose stdin
and stdout are a channel: at its first prompt the rank tells the kernel it stopped (a datapub
message beside its records, ``notice``), then each command arrives on the rank's side channel
(``runtime/debug/stacks.py``, which answers while the main thread waits here) and what pdb wrote
until its next prompt goes back. ``c`` lets the rank go on; ``q`` fails the cell on this rank, as
pdb does anywhere.
"""

from __future__ import annotations

import io
import os
import pdb
import re
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import IO, cast

from dtwork.runtime.core import control
from dtwork.runtime.debug import stacks

POLL_SECONDS = 0.2  # how often a waiting command looks whether the cell ended under it
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]")
_STDLIB = os.path.dirname(os.__file__)
_DTWORK = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # an editable install too


class _Channel:
    """pdb's stdin and stdout on this rank: one command in at a time, what pdb wrote back out."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.out = io.StringIO()
        self.commands: list[str] = []
        self.driven = False  # the kernel knows of this stop (between the first prompt and c or q)
        self.stops = 0  # stops so far: the kernel drives each new one once
        self.prompts = 0  # prompts so far: a command's answer is complete at the next one
        self.where = ""  # the cell line pdb stopped at, for the kernel's first line
        self.notice: Callable[[dict[str, object]], None] = lambda data: None

    # -- pdb's side (the rank's main thread) --------------------------------------------------

    def write(self, text: str) -> int:
        with self.cond:
            return self.out.write(text)

    def flush(self) -> None:
        pass

    def readline(self) -> str:
        with self.cond:
            if not self.driven:  # a new stop: tell the kernel, which sends the commands
                self.stops += 1
                self.notice({"pdb": {"stop": self.stops, "where": self.where, "opening": self._take()}})
                self.driven = True
            self.prompts += 1
            self.cond.notify_all()
            try:
                while not self.commands:
                    self.cond.wait()
            except BaseException:  # an interrupt from the kernel: the stop is over
                self.driven = False
                self.cond.notify_all()
                raise
            return self.commands.pop(0) + "\n"

    def release(self) -> None:
        """pdb lets the rank go on (c) or quits: the kernel's prompt ends."""
        with self.cond:
            self.driven = False
            self.cond.notify_all()

    # -- the kernel's side (the side channel's thread) ----------------------------------------

    def ask(self, line: str) -> tuple[str, bool]:
        """Hand pdb one command; what it wrote until its next prompt, and whether the stop ended."""
        with self.cond:
            if not self.driven:
                return "this rank is not stopped at a breakpoint", True
            seen = self.prompts
            self.commands.append(line)
            self.cond.notify_all()
            while self.prompts == seen and self.driven and control.in_cell():
                self.cond.wait(POLL_SECONDS)
            return self._take(), not (self.driven and control.in_cell())

    def _take(self) -> str:
        text = self.out.getvalue()
        self.out.seek(0)
        self.out.truncate()
        return text


_channel = _Channel()


class _RankPdb(pdb.Pdb):
    """pdb on the channel, with no prompt of its own (the notebook shows one naming the rank)."""

    def __init__(self) -> None:
        io_ = cast("IO[str]", _channel)  # what pdb calls of a stream: write, flush, readline
        super().__init__(stdin=io_, stdout=io_, nosigint=True, readrc=False)
        self.prompt = ""

    def stop_here(self, frame: FrameType) -> bool:
        """Steps stop in the user's code only (Jupyter's debugger's "just my code"): ``n`` past a
        cell's top-level statement stops at the next one, not in IPython, which runs each apart."""
        return _mine(frame.f_code.co_filename) and bool(super().stop_here(frame))

    # IPython runs each top-level statement of a cell as a code object of its own: its call and
    # return are no stop (``n`` goes from one line of the cell to the next, as in a script).
    def user_call(self, frame: FrameType, argument_list: None) -> None:
        if not _statement(frame):
            super().user_call(frame, argument_list)

    def user_return(self, frame: FrameType, return_value: object) -> None:
        if not _statement(frame):
            super().user_return(frame, return_value)

    def do_continue(self, arg: str) -> bool | None:
        stop = super().do_continue(arg)
        _channel.release()
        return stop

    do_c = do_cont = do_continue

    def do_quit(self, arg: str) -> bool | None:
        stop = super().do_quit(arg)
        _channel.release()
        return stop

    do_q = do_exit = do_quit


def _statement(frame: FrameType) -> bool:
    """Whether ``frame`` runs one top-level statement of a cell."""
    return frame.f_code.co_name == "<module>" and stacks.cell_name(frame.f_code.co_filename) is not None


def _cell_ended() -> None:
    """A stepping pdb that went past the cell's end traces no more: not the engine's own code, and
    no stop at the next cell's first line."""
    if isinstance(getattr(sys.gettrace(), "__self__", None), _RankPdb):  # not another tracer (coverage)
        sys.settrace(None)
        _channel.release()


def _mine(filename: str) -> bool:
    """Whether code compiled from ``filename`` is the user's: a cell, or a file outside Python and
    the installed packages."""
    if stacks.cell_name(filename) is not None:
        return True
    return not (_LIBRARY.search(filename) or filename.startswith((_STDLIB, sys.prefix, _DTWORK, "<")))


def hook(*args: object, **kwargs: object) -> None:
    """``sys.breakpointhook``: stop in pdb at the caller's next line."""
    frame: FrameType | None = sys._getframe(1)
    cell = stacks.cell_name(frame.f_code.co_filename) if frame is not None else None
    _channel.where = f"cell line {frame.f_lineno}" if frame is not None and cell else ""
    _RankPdb().set_trace(frame)


def install(notice: Callable[[dict[str, object]], None]) -> None:
    """Make ``breakpoint()`` stop this rank; ``notice`` sends the kernel a stop's first words."""
    _channel.notice = notice
    stacks.answer_pdb(_channel.ask)
    sys.breakpointhook = hook
    shell = control.get_shell()
    if shell is not None and _cell_ended not in shell.events.callbacks["post_execute"]:
        shell.events.register("post_execute", _cell_ended)
