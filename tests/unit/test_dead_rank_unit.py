"""A rank killed under a collective fails the cell within 10 s naming it; a hang names the rank
that stopped first; the engines train again after a restart.

Its tests that need no engines; the others are in tests/cluster/test_dead_rank.py.
"""

from __future__ import annotations


def test_stopped_first_is_the_rank_with_the_fewest_steps() -> None:
    from dtwork.kernel.progress import stopped_first

    progress = {0: {"step": 6, "time": 2.0}, 1: {"step": 5, "time": 1.0}, 2: {"step": 6, "time": 1.5}}
    assert list(stopped_first(progress)) == [1]
    tie = {0: {"step": 5, "time": 2.0}, 1: {"step": 5, "time": 1.0}}
    assert sorted(stopped_first(tie)) == [0, 1]  # the steps do not tell: both are named
    done = {0: {"step": 9, "phase": "done", "time": 1.0}, 1: {"step": 9, "phase": "train", "time": 1.0}}
    assert list(stopped_first(done)) == [1]
