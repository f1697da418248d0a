"""``%dtrain stacks``: every rank's Python stack now, ranks with the same stack grouped; and
``%dtrain collectives``: whether collectives are checked across the ranks before they run.

The ranks answer on a side channel of their own (``Cluster.stacks``), so this works while a
cell hangs in a collective: run it from another cell after ``%%dtrain --bg``, or read what the
hang detector printed by itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtwork.cluster import Cluster
    from dtwork.kernel.stacks import RankStacks


def show_stacks(cluster: Cluster, ranks: list[int] | None = None, all_threads: bool = False) -> RankStacks:
    """Print every rank's stacks (``all_threads``: the libraries' threads too) and return them."""
    stacks = cluster.stacks(ranks)
    print(stacks.text(all_threads=all_threads))
    return stacks


def check_collectives(cluster: Cluster, state: str | None) -> None:
    """Turn the checks ``on`` or ``off`` (None: leave them), and say where they stand."""
    if state is not None:
        cluster.check_collectives(state == "on")
    checked = "checked across the ranks before they run" if cluster.checks_collectives else "not checked"
    print(f"dtwork: collectives are {checked} (%dtrain collectives on|off)")
