"""The stop flag: set by a signal from the kernel, agreed on by all ranks inside ``ctx.steps``.

The kernel relays an interrupt as SIGUSR1 to every engine (ipyparallel's ``signal_engines``,
which works on any launcher). The handler only sets a flag; the steps loop all-reduces it
so that every rank leaves at the same step.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

STOP_SIGNAL = signal.SIGUSR1
_flag = threading.Event()
_in_cell = threading.Event()


def _handler(signum: int, frame: FrameType | None) -> None:
    if _in_loop.is_set():
        _flag.set()  # ctx.steps agrees on it with the other ranks
    elif _in_cell.is_set():
        # A cell outside ctx.steps: nothing can stop consistently, so behave like Ctrl-C.
        raise KeyboardInterrupt("dtwork: interrupted")
    # Between cells: ignore (raising here would kill the engine's event loop).


def install() -> None:
    """Install the SIGUSR1 handler (main thread only) and track when a cell runs."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(STOP_SIGNAL, _handler)
    shell = get_shell()
    if shell is not None and not getattr(shell, "_dtwork_cell_hooks", False):
        shell.events.register("pre_execute", _cell_starts)
        shell.events.register("post_execute", _cell_ends)
        shell.events.register("pre_run_cell", _shown_cell_starts)
        shell.events.register("post_run_cell", _cell_ran)
        shell._dtwork_cell_hooks = True


def get_shell() -> Any:  # IPython's InteractiveShell, untyped there
    """The IPython shell running this rank's cells, or None outside one."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


_left_step: list[int] = []  # the step at which ctx.steps was left by an error, in this cell


def in_cell() -> bool:
    """Whether a cell is running on this rank now."""
    return _in_cell.is_set()


def _cell_starts() -> None:
    _left_step.clear()
    _in_cell.set()


_ranks: dict[str, list[int] | None] = {"next": None, "cell": None}  # as the kernel said


def set_next_cell_ranks(ranks: list[int]) -> None:
    """The kernel runs the next cell on these ranks only (sent just before it)."""
    _ranks["next"] = list(ranks)


def cell_ranks() -> list[int] | None:
    return _ranks["cell"]


def _shown_cell_starts(info: object = None) -> None:
    _ranks["cell"], _ranks["next"] = _ranks["next"], None


def _cell_ends() -> None:
    _in_cell.clear()
    _ranks["cell"] = None


def left_loop_at(step: int) -> None:
    _left_step[:] = [step]


_last_error: list[BaseException] = []  # the last cell error on this rank, for a post-mortem


def last_error() -> BaseException | None:
    """The exception the last failed cell on this rank raised (kept until another fails)."""
    return _last_error[0] if _last_error else None


def _cell_ran(result: object) -> None:
    """A cell that failed on this rank aborts the group, so that no other rank waits for it."""
    error = getattr(result, "error_in_exec", None)
    if error is None:
        return
    _last_error[:] = [error]
    from dtwork.runtime.core import group

    try:  # an error here would be shown as the cell's own
        group.on_cell_error(error, _left_step[0] if _left_step else None)
    except Exception as exc:
        print(f"dtwork: could not abort the process group after the error: {exc}", file=sys.stderr)


def requested() -> bool:
    return _flag.is_set()


def request() -> None:
    _flag.set()


def clear() -> None:
    _flag.clear()


_in_loop = threading.Event()


def enter_loop() -> None:
    _in_loop.set()


def exit_loop() -> None:
    _in_loop.clear()
