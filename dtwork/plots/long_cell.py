"""A long training cell's live figures in bounded memory, drawn as a fresh reader of the store draws them.

The live view keeps a cell's rows in its series (every point, exactly) while the store's readers
would draw the raw rows too (:func:`dtwork.store.views.reads_raw`). Past that, a day of training
would hold every value in the kernel: :class:`LongCell` keeps the cell's rows as the store's rollups
do (:class:`dtwork.store.rollups.MemoryRollups`, the same buckets at the same levels), and the
figures are drawn from the rows :func:`dtwork.store.views.bucket_rows` picks out of them, through
the same series as the view of a reopened notebook (:func:`.training.drawn_series`): each bucket's
min and max kept, about a screen's width of points, the same figure.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from dtwork.plots.series import Series
from dtwork.plots.training import drawn_series
from dtwork.shared.records import Row
from dtwork.store.rollups import LEVELS, PRUNED_KINDS, MemoryRollups
from dtwork.store.views import bucket_rows, reads_raw

__all__ = ["LongCell", "bump"]


class LongCell:
    """A cell's rows as rollups, its latest rates and recent step times: what the live view keeps
    of a cell too long to keep every row (:attr:`long`)."""

    def __init__(
        self,
        global_batch: int | None = None,
        recent: int = 20,
        cell_seq: int | None = None,
        world_size: int | None = None,
    ) -> None:
        """``recent``: the step times kept per rank (the header's ETA averages them)."""
        self.global_batch = global_batch
        self.recent = recent
        self.rollups = MemoryRollups(cell_seq, world_size)
        self.version = 0  # bumped by every add that took a row
        self._long = False  # drawn from the rollups (set once: rows only grow)
        self.rates: dict[int, tuple[int, float]] = {}  # rank -> (its highest step, samples/s there)
        self.step_times: dict[int, deque[float]] = {}  # rank -> its last step times, in arrival order

    def add(self, rows: Iterable[Row]) -> None:
        took = False
        for r in rows:
            rank, name, step, value = r["rank"], r["name"], r["step"], r["value"]
            stamp = r["time"]
            self.rollups.add(r["kind"], step, rank, name, value, 0.0 if stamp is None else stamp)
            took = True
            if rank is None or not isinstance(value, float) or value != value:  # NaN: no rate
                continue
            if name == "samples_per_s" and (rank not in self.rates or step >= self.rates[rank][0]):
                self.rates[rank] = (step, value)
            elif name == "step_time":
                self.step_times.setdefault(rank, deque(maxlen=self.recent)).append(value)
        if took:
            self.version += 1

    @property
    def long(self) -> bool:
        """Whether a reader of the store draws the cell from its rollups (and so does the live view):
        once long, always (its rows only grow)."""
        if not self._long:
            r = self.rollups
            pruned = [n for key, n in r.counts.items() if r.series[key] in PRUNED_KINDS]
            self._long = not reads_raw(r.rows, max(pruned, default=0))
        return self._long

    def latest(self) -> dict[int, float]:
        """{rank: samples/s at the rank's highest step}."""
        return {rank: value for rank, (_, value) in sorted(self.rates.items())}

    def recent_step_times(self, rank: int, n: int) -> list[float]:
        """The last ``n`` (at most ``recent``) step times ``rank`` reported."""
        return list(self.step_times.get(rank, ()))[-n:]

    def series(self) -> dict[str, Series]:
        """The cell's series drawn from its rollups, as :func:`dtwork.plots.cell_view.cell_view` draws
        them from the store's (empty before a finite value)."""
        r = self.rollups
        coarse = r.buckets(LEVELS[-1])
        if not coarse:
            return drawn_series([], self.global_batch)
        rows = bucket_rows(0, coarse, r.buckets, len(r.counts), r.levels)  # series with a finite value
        return drawn_series(rows, self.global_batch)

    def size(self) -> int:
        """What it holds: buckets, rates and step times (bounded however long the cell)."""
        return self.rollups.size() + len(self.rates) + sum(len(d) for d in self.step_times.values())


def bump(old: Mapping[str, Series], new: dict[str, Series]) -> dict[str, Series]:
    """``new`` with versions past ``old``'s, so that a view drawn at an old version draws it again."""
    for key, s in new.items():
        if key in old:
            s.version = old[key].version + 1
    return new
