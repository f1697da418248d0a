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


def _handler(signum: int, frame: FrameType | None) -> None:
    _flag.set()
    if not _in_loop.is_set():
        # Not inside ctx.steps: nothing can stop consistently, so behave like Ctrl-C.
        raise KeyboardInterrupt("dtwork: interrupted")


def install() -> None:
    """Install the SIGUSR1 handler (main thread only, once per engine)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(STOP_SIGNAL, _handler)


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
