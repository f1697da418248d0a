"""The entry points a search's trial groups use (the kernel ships them by reference, as ``entry``'s).

Like ``entry``, this module imports no torch at import time: the kernel imports it to name them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtwork import runtime

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState


def make_groups(groups: list[list[int]]) -> int:
    """Split the world into the search's trial groups (every rank, once per search); this rank's."""
    from dtwork.runtime.core import trial_group

    _as(runtime.current().state, trial_group.end())  # the world, should a search have been cut short
    return trial_group.make(groups)


def begin_trial(
    config: dict[str, object],
    run_id: int,
    store: str,
    token: str,
    rebuild: bool = False,
    resume: int | None = None,
) -> dict[str, object]:
    """Make the rank's group its world for one trial: the trial's config (``ctx.hparams``, the batch
    over the group's slots, the seed) and its run (``token``: this trial's, also naming where a
    failing rank says why); ``rebuild``: the group is made again first; ``resume``: the run whose
    newest checkpoint the trial's loop goes on from (an ASHA promotion)."""
    from dtwork.runtime import entry
    from dtwork.runtime.core import trial_group

    ctx = runtime.current()
    _as(
        ctx.state,
        trial_group.begin(ctx.rank, ctx.world_size, f"dtwork/failed/trial/{token}", rebuild=rebuild),
    )
    try:
        applied = entry.set_config(config, None)
        entry.set_run_id(run_id, store, True, False, token)
        entry.set_auto_resume(resume or False)  # every trial sets it: none inherits the last one's
    except BaseException:
        _as(ctx.state, trial_group.end())
        raise
    return {"rank": ctx.rank, "world_size": ctx.world_size, **applied}


def end_trial() -> None:
    """The cluster's world again on this rank (its config comes back with the kernel's next one)."""
    from dtwork.runtime.core import trial_group

    _as(runtime.current().state, trial_group.end())


def end_search() -> None:
    """The search ended: the world again, and no trial group."""
    from dtwork.runtime.core import trial_group

    _as(runtime.current().state, trial_group.end())
    trial_group.forget()


def abort_group() -> None:
    """Abort this rank's trial group (a peer failed and ranks still wait on this one)."""
    from dtwork.runtime.core import group

    group.abort("another rank of the trial failed")


def _as(state: RankState, seat: tuple[int, int] | None) -> None:
    """The rank state (and its records) take the rank and world size of the group now in use."""
    if seat is not None:
        state.rank, state.world_size = seat
        state.publisher.rank = state.rank
