"""How far ``ctx.steps`` goes: its loader, its first step, its epoch, and when it ends.

A loop ends at ``max_steps`` optimizer steps from its first (with an adaptive batch: progress in
steps at the starting batch), at the end of ``max_epochs`` passes, or at a stop the ranks agreed on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from dtwork.runtime.core import run_axis

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState
    from dtwork.runtime.loop.adaptive import AdaptiveBatch


class Span:
    """One loop's extent; ``done`` is asked after every micro-batch."""

    def __init__(
        self,
        loader: Iterable[object],
        max_steps: int | None,
        max_epochs: int | None,
        adaptive: AdaptiveBatch | None,
        new_run: bool | None,
    ) -> None:
        self.loader = loader
        self.new_run = new_run  # None: a new run after a new ctx.wrap, else go on (run_axis.begin)
        self.max_steps = max_steps
        self.max_epochs = 1 if max_steps is None and max_epochs is None else max_epochs
        self.adaptive = adaptive
        self.first = 0  # the run's step this loop began at: max_steps counts from it
        self.epoch = 0
        self.stopped = False  # the ranks agreed to stop (an interrupt, a stop request)

    def begin(self, state: RankState, resuming: bool) -> run_axis.Opening:
        """Decide the loop's segment of the run (announced once a resume is loaded: its first step)."""
        opening = run_axis.open_segment(
            state, self.new_run, "ctx.steps", resuming=resuming, max_steps=self.max_steps
        )
        self.first = opening.first
        return opening

    def done(self, step: int) -> bool:
        if self.stopped:
            return True
        return self.max_steps is not None and self.progress(step) >= self.max_steps

    def progress(self, step: int) -> float:
        """This loop's optimizer steps, or with an adaptive batch the loader's progress in steps at the
        starting batch."""
        return step - self.first if self.adaptive is None else self.adaptive.progress

    def total(self, step: int) -> int | None:
        """The step the loop ends at, for the progress bar (in optimizer steps, as ``step``)."""
        if self.max_steps is None:
            return None
        if self.adaptive is not None:
            return self.adaptive.steps_total(step, self.max_steps)
        return self.first + self.max_steps

    def last_epoch(self) -> bool:
        """After an epoch ends (``epoch`` counted): whether it was the loop's last."""
        return self.max_epochs is not None and self.epoch >= self.max_epochs
