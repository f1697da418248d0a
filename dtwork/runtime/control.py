"""The stop flag: set by a signal from the kernel, agreed on by all ranks inside ``ctx.steps``.

The kernel relays an interrupt as SIGUSR1 to every engine (ipyparallel's ``signal_engines``,
which works on any launcher). The handler only sets a flag; the steps loop all-reduces it
so that every rank leaves at the same step.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

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
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None and not getattr(shell, "_dtwork_cell_hooks", False):
        shell.events.register("pre_execute", _in_cell.set)
        shell.events.register("post_execute", _in_cell.clear)
        shell._dtwork_cell_hooks = True


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
