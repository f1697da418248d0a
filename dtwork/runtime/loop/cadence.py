"""The periodic work of ``ctx.steps``: validation, replica checks and checkpoints, each every N steps.

Checkpoints live per run (``runtime/checkpoint/trial.py``); this keeps when they are due, what the
last one was, and the resume a loop starts from (with the optimizer states no known optimizer took).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict, cast

from dtwork.errors import DtworkError
from dtwork.runtime.checkpoint import trial as checkpoint
from dtwork.runtime.loop import guards
from dtwork.runtime.loop.options import LoopOptions

if TYPE_CHECKING:
    import torch

    from dtwork.runtime.checkpoint.files import RngState
    from dtwork.runtime.checkpoint.trial import Waiting
    from dtwork.runtime.core.state import RankState
    from dtwork.runtime.loop.adaptive import AdaptiveState


class LoopPosition(TypedDict, total=False):
    """Where a loop is, as its checkpoints keep it (``rng`` and the pending optimizers on a resume)."""

    step: int
    epoch: int
    micro: int  # micro-batches of the epoch taken
    first: int  # the step the loop began at
    adaptive: AdaptiveState
    rng: RngState
    pending_optimizers: list[Waiting]


class Cadence:
    """When a loop validates, compares replicas and checkpoints; what it resumes from."""

    def __init__(
        self,
        state: RankState,
        opts: LoopOptions,
        trained: dict[int, torch.nn.Module],
        where: Callable[[], LoopPosition],
    ) -> None:
        cfg = state.config
        self.state = state
        self.where = where  # the loop's position, asked when a checkpoint is written
        self.resume = opts.resume or state.auto_resume
        period = cfg.checkpoint.every or cfg.steps_in(cfg.min_checkpoint_period, state.global_batch_size)
        self.every = opts.checkpoint_every if opts.checkpoint_every is not None else period
        if self.every:  # before training: a folder another store's run owns is refused now
            checkpoint.check_owner(state)
        self.validate = opts.validate
        self.validate_every = opts.validate_every or cfg.steps_in(
            cfg.min_validation_period, state.global_batch_size
        )
        self.check_every = opts.check_replicas_every  # steps between replica checks; else at the end only
        self.trained = trained  # the wrapped models the loop trained, by id
        self.saved_step: int | None = None  # the step of the last checkpoint taken or resumed from

    def check(self) -> None:
        """Refuse a validation without a period."""
        if self.validate is not None and not self.validate_every:
            raise DtworkError(
                "ctx.steps(validate=fn) needs a period: min_validation_period in the config, or validate_every=N"
            )

    def validation(self, step: int) -> dict[str, object] | None:
        """The validation's values when due at the end of ``step`` (logged at that step, like ctx.log)."""
        if self.validate is not None and self.validate_every and (step + 1) % self.validate_every == 0:
            return dict(self.validate() or {})
        return None

    def after_step(self, step: int, stopped: bool) -> None:
        """At a step's end (``step`` steps taken): the replica check and checkpoint when due."""
        if self.check_every and step % self.check_every == 0:
            guards.check_replicas(list(self.trained.values()), step, self.state.device)
        if self.every and (step % self.every == 0 or stopped):
            self.save(step)

    def at_end(self, step: int) -> None:
        """At the loop's end: replicas compared, and a checkpoint unless the last step has one."""
        guards.check_replicas(list(self.trained.values()), step, self.state.device)
        if self.every and step and self.saved_step != step:
            self.save(step)  # the loop's end, also between two `every`

    def save(self, step: int) -> None:
        self.state.forget_dropped()  # a checkpoint holds the live models only
        path = checkpoint.save(self.state, dict(self.where()))
        self.saved_step = step
        if path is not None:
            self.state.publisher.record("event", step, {}, event="checkpoint", message=f"checkpoint {path}")

    def load_resume(self) -> tuple[LoopPosition | None, list[Waiting]]:
        """The position to resume from, when ``resume`` asks for one (None: start afresh), and the
        checkpoint's optimizer states that no known optimizer took (for those made in this cell)."""
        if not self.resume:
            return None, []
        self.state.forget_dropped()  # resume into the live models only
        found = checkpoint.resume_from(self.state, self.resume)
        if found is None:
            if self.state.rank == 0:
                print("dtwork: resume=True but no checkpoint yet: starting from step 0")
            return None, []
        path, loaded = found
        position = cast(LoopPosition, loaded)  # the loop state a checkpoint of this module wrote
        pending = position.pop(checkpoint.PENDING, [])  # type: ignore[misc]
        self.saved_step = position["step"]
        if self.state.rank == 0:
            waits = (
                f"; {len(pending)} optimizer state(s) wait for their optimizer's first ctx.step"
                if pending
                else ""
            )
            print(f"dtwork: resumed from {path} (step {position['step']}){waits}")
        return position, pending
