"""A background cell (``%%dtrain --bg``): its watcher polled on a thread of its own until the cell ends."""

from __future__ import annotations

import threading
from collections.abc import Callable

from dtwork.kernel.watcher import POLL_SECONDS, CellWatcher


class BackgroundCell:
    """One cell trained in the background; ``%dtrain wait`` brings it back."""

    def __init__(self, watcher: CellWatcher, replays: Callable[[], bool]) -> None:
        self.watcher = watcher
        self.replays = replays  # whether the session replays the run after a dead rank (max_restarts)
        self.concluded = False  # brought back by %dtrain wait (its thread may still restart engines)
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        watcher = self.watcher
        while not watcher.poll():
            watcher.ar.wait(POLL_SECONDS)
        watcher.quiet = True
        if watcher.dead and not watcher.restarted and not self.replays():
            watcher.restarted = True  # before the end is known: %dtrain wait then restarts nothing
            watcher.restart_after = f"{', '.join(f'rank {r}' for r in sorted(watcher.dead))} died"
        watcher.finish()
        if watcher.restart_after is not None:  # a rank died: the failure is known, now fresh engines
            watcher.host.restart_after_failure(watcher.restart_after)

    @property
    def running(self) -> bool:
        return not self.watcher.done.is_set()

    def join(self) -> None:
        """Wait for the cell's end (not for a restart after it); Ctrl-C relays an interrupt to its
        ranks and goes on waiting."""
        try:
            while not self.watcher.done.wait(0.1):
                if self.watcher.watch.stops:  # ranks at breakpoint(): their prompts, here
                    self.watcher.drive_stops()
        except KeyboardInterrupt:
            self.watcher.interrupt()
            while not self.watcher.done.wait(0.1):
                pass

    def settle(self) -> None:
        """Wait for its thread's last work: the restart after a dead rank, if any."""
        while self._thread.is_alive():
            self._thread.join(0.1)
