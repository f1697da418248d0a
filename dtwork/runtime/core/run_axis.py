"""One step axis per run: where a training loop starts on it, and what it tells the kernel.

A new ``ctx.wrap`` (a new model) starts a new run at step 0; training the same wrapped model in a
later cell goes on from the run's last step. Each loop is a *segment* of its run: it sends one
``SEGMENT`` event (rank 0) with its first step, whether it asks for a new run, and what it trains
with (learning rates, batch); the kernel starts the new run, and stores the segment with what
changed since the previous one. ``new_run`` (a loop's argument) overrides the rule either way.

The ranks learn a run's id only at a cell's start, so a loop that starts a new run mid-cell (the
run already had a loop) checkpoints into a pending folder, ``pending-<token>-<n>``, which its
segment event names: the kernel begins the new run only then, and at the next cell rank 0
renames the folder to the run's (``checkpoint.adopt``). The rank decides; the kernel follows.
The kernel tells the ranks ahead the id it gives the next run, so ``ctx.run_id`` names the new run
in the very cell that begins it (the segment event carries it; the kernel creates the run with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, SupportsFloat, cast

from dtwork.errors import DtworkError
from dtwork.shared.records import SEGMENT

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState


@dataclass
class Opening:
    """A loop's segment, decided and not yet announced (a resume may move its first step)."""

    first: int
    new: bool
    pending: str | None
    loop: str
    settings: dict[str, object]


def begin(
    state: RankState, new_run: bool | None, loop: str, *, resuming: bool = False, **settings: object
) -> int:
    """Open a segment for a training loop and announce it; return its first step (0 for a new run)."""
    return announce(state, open_segment(state, new_run, loop, resuming=resuming, **settings))


def open_segment(
    state: RankState, new_run: bool | None, loop: str, *, resuming: bool = False, **settings: object
) -> Opening:
    """Decide a training loop's segment: a new run or not, its first step. A loop that resumes this
    run's checkpoint (``resuming``) goes on with the run, even after a new wrap."""
    if new_run is not None and not isinstance(new_run, bool):
        raise DtworkError(
            f"{loop}(new_run=...) takes True (start a new run at step 0), False (go on with this "
            f"run's steps) or None (a new run after a new ctx.wrap); got {new_run!r}"
        )
    new = (state.fresh_wrap and not resuming) if new_run is None else new_run
    state.fresh_wrap = False
    if state.wrapped:  # what the run trains (its checkpoints hold): the models wrapped since the last loop
        keep = [] if new or resuming or state.run_models is None else state.run_models
        state.run_models, state.wrapped = keep + state.wrapped, []
    pending = None
    if new and state.run_trained and state.pending_token is not None:
        state.pending_count += 1
        pending = state.run_folder = f"pending-{state.pending_token}-{state.pending_count}"
        if state.next_run is not None:  # the id the kernel gives it (it says so if another took it)
            state.run_id = state.next_run + state.pending_count - 1
    state.run_trained = True
    state.after_loop_step = None
    if new:
        state.run_step = 0
    return Opening(state.run_step, bool(new), pending, loop, settings)


def announce(state: RankState, opening: Opening, resumed: int | None = None) -> int:
    """Tell the kernel (rank 0) the segment begins, at the step a resume reached when it loaded one
    (``resumed``); return that first step."""
    first, loop = opening.first if resumed is None else resumed, opening.loop
    if state.rank == 0:
        state.publisher.record(
            "event",
            first,
            {},
            event=SEGMENT,
            message=f"{loop}: a new run" if opening.new else f"{loop}: goes on with the run at step {first}",
            new_run=opening.new,
            pending=opening.pending,
            run=state.run_id if opening.pending else None,
            settings={**train_settings(state), **opening.settings},
        )
    return first


def end(state: RankState, step: int) -> None:
    """The loop left at ``step``: the run's next loop goes on from there."""
    state.run_step = max(0, int(step))


def new_axis(state: RankState) -> None:
    """The kernel began a run of its own (a new config, ``%dtrain`` new run): steps from 0."""
    state.run_step, state.log_step, state.after_loop_step = 0, -1, None


def told_run(state: RankState, trained: bool, token: str | None) -> None:
    """The kernel named the ranks' run at a cell's start: whether it had a loop yet, and the token
    that names a pending folder (None while it replays: it begins no run then)."""
    state.run_trained, state.pending_token, state.pending_count, state.run_folder = trained, token, 0, None


def train_settings(state: RankState) -> dict[str, object]:
    """What a segment trains with: each optimizer's learning rates now (after its schedule) and
    the batch, for the kernel to tell what changed between segments."""
    lrs = [[_number(g.get("lr")) for g in opt.param_groups] for opt in state.run_optimizers()]
    return {
        "lr": lrs,
        "global_batch_size": state.global_batch_size,
        "per_slot_batch_size": state.per_slot_batch_size,
        "accumulation": state.config.optimizations.aggregation_frequency,
        "precision": state.config.mixed_precision,
    }


def _number(value: object) -> float | None:
    try:
        return float(cast(SupportsFloat, value))
    except (TypeError, ValueError):  # a tensor learning rate with more than one element, say
        return None
