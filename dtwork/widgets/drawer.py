"""When the live dashboard redraws, and the thread that does it.

A :class:`Pacer` says when the next redraw is due: ``min_interval`` after the last one while records
flow, longer when a redraw costs more than ``draw_share`` of a core over the interval. A
:class:`Drawer` is a thread of the dashboard's own, at the OS's idle priority, that wakes the
dashboard when a redraw may be due, so that the view takes the CPU that ranks leave idle instead of a
core that one rank (and through it every rank) waits for; where every core stays busy (its wakes come
``DRAWER_LATE`` late) it goes back to the normal policy, niced, so that the view still moves.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

__all__ = [
    "DRAWER_IDLE_CHECK",
    "DRAWER_JOIN_SECONDS",
    "DRAWER_LATE",
    "MAX_INTERVAL",
    "MAX_SHARE",
    "Drawer",
    "Pacer",
    "idle_priority",
]

DRAWER_IDLE_CHECK = 0.1  # seconds: how soon a drawer that found nothing new looks again
DRAWER_JOIN_SECONDS = 5.0  # the most a finishing cell waits for its drawer's last redraw
DRAWER_LATE = 1.0  # seconds a wake may come late before the drawer leaves idle priority
MAX_INTERVAL = 2.0  # seconds: the view moves at least this often while a redraw fits MAX_SHARE
MAX_SHARE = 0.05  # of a core: past it the interval grows again, however long it gets
BUSY_NICE = 10  # the drawer's niceness once every core stays busy: a small share, never none


def idle_priority() -> bool:
    """Put the calling thread at the OS's idle scheduling priority (Linux: ``SCHED_IDLE``, which any
    user may set for their own threads); return whether it could. Other threads keep theirs."""
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))  # 0: this thread (a Linux thread is a task)
    except OSError:
        return False
    return True


def busy_priority() -> bool:
    """Put the calling thread back at the OS's normal scheduling policy, niced (``BUSY_NICE``):
    where every core stays busy an idle-priority thread waits seconds for each wake, while a niced
    one still gets a small share at once. Return whether it could."""
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_OTHER"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BUSY_NICE)  # this thread only
    except OSError:
        return False
    return True


class Pacer:
    """When the next redraw is due, and how many there were.

    ``min_interval`` is the least time between two redraws; with ``draw_share`` (None: no budget) the
    interval stretches to the last redraw's CPU time divided by that share of a core; once ``busy``
    (the drawer found every core busy) no further than ``MAX_INTERVAL`` while that costs at most
    ``MAX_SHARE`` of a core, so that a busy machine's costly redraws still move every couple of
    seconds, while a quiet kernel keeps its smaller budget. ``clock`` is for tests.
    """

    def __init__(self, min_interval: float, draw_share: float | None, clock: Callable[[], float]) -> None:
        self.min_interval = min_interval
        self.draw_share = draw_share
        self.interval = min_interval  # the current one: min_interval, or longer when redraws cost more
        self.redraws = 0
        self.clock = clock
        self.last_draw = -math.inf  # when the last redraw was due (or happened, after a pause)
        self.busy = False  # every core stays busy: the interval stops at MAX_INTERVAL (within MAX_SHARE)

    @property
    def next_draw(self) -> float:
        """When the next redraw is due, on ``clock``."""
        return self.last_draw + self.interval

    def due(self) -> bool:
        """Whether the interval since the last redraw has passed."""
        return self.clock() - self.last_draw >= self.interval

    def drew(self, start: float, cpu: float, added: bool) -> None:
        """Count a redraw that began at ``start`` (on ``clock``) with the thread's CPU time at ``cpu``;
        ``added``: it built widgets (the first redraw, a new figure)."""
        self.redraws += 1
        # the next redraw is due an interval after this one was due, so that the drawer's late
        # wakes do not add up; after a pause, or a redraw longer than the interval, from now
        due = self.last_draw + self.interval
        self.last_draw = due if 0 <= start - due < self.interval else start
        # a redraw that built widgets (the first, a new figure) pays once for what later ones reuse
        if self.draw_share and self.redraws > 1 and not added:
            spent = time.thread_time() - cpu
            budgeted = spent / self.draw_share
            if self.busy:  # never a view still for more than MAX_INTERVAL while it costs under MAX_SHARE
                budgeted = min(budgeted, max(MAX_INTERVAL, spent / MAX_SHARE))
            self.interval = max(self.min_interval, budgeted)


class Drawer:
    """A thread that calls ``wake`` whenever ``pacer`` says a redraw may be due, until stopped or
    until ``wake`` returns False."""

    def __init__(self, wake: Callable[[], bool], pacer: Pacer) -> None:
        self._wake = wake
        self._pacer = pacer
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        """Whether the thread was started and not stopped since."""
        return self._thread is not None

    @property
    def busy(self) -> bool:
        """Whether it found every core busy (a wake came late) and left idle priority where it could."""
        return self._pacer.busy

    @property
    def stopping(self) -> bool:
        """Whether the thread was told to stop (a wake then draws nothing)."""
        return self._stop.is_set()

    def start(self, idle: bool = True) -> None:
        """Start the thread (once), at the OS's idle scheduling priority with ``idle``."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(idle,), name="dtwork-dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (it finishes the redraw it is in)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(DRAWER_JOIN_SECONDS)

    def _loop(self, idle: bool) -> None:
        if idle:
            idle_priority()
        pacer = self._pacer
        next_check = pacer.clock()
        while True:
            wait = max(0.01, next_check - pacer.clock())
            target = pacer.clock() + wait
            if self._stop.wait(wait):
                return
            drawn, cpu = pacer.redraws, time.thread_time()
            if not self._wake():
                return
            # an idle-priority thread runs only when a core has nothing else to run: a wake that
            # waited this long beyond the CPU it used says every core stays busy, and the view
            # would wait for the cell's end
            waited = pacer.clock() - target - (time.thread_time() - cpu)
            if idle and not pacer.busy and waited > DRAWER_LATE:
                pacer.busy = True
                busy_priority()
            next_check = pacer.next_draw
            if pacer.redraws == drawn:  # nothing new yet: look again soon, not at once
                next_check = max(next_check, pacer.clock() + DRAWER_IDLE_CHECK)
