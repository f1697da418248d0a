"""The 95% interval of B_simple: Fieller's interval for a ratio, its one-sided form, "settled".

Split from :mod:`dtwork.analysis.gns` (the estimator that computes the interval's inputs), which
re-exports these names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SETTLED_HALF_WIDTH = 0.25  # "settled": the 95% interval within +-25% of the estimate

__all__ = ["SETTLED_HALF_WIDTH", "GNSInterval", "floor_interval", "t_quantile_975"]


def t_quantile_975(df: float) -> float:
    """Return the 0.975 quantile of Student's t with ``df`` degrees of freedom.

    Cornish-Fisher expansion around z = 1.96 (Abramowitz & Stegun 26.7.5); within 0.2% of
    the exact value for df >= 5 (MIN_BLOCKS windows give df >= 6).
    """
    z = 1.959963984540054
    if df <= 0:
        return math.inf
    z3, z5, z7 = z**3, z**5, z**7
    return (
        z
        + (z3 + z) / (4 * df)
        + (5 * z5 + 16 * z3 + 3 * z) / (96 * df**2)
        + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * df**3)
    )


@dataclass(frozen=True)
class GNSInterval:
    """The bias-corrected B_simple with its 95% interval, from windows of measurements."""

    estimate: float
    lo: float
    hi: float
    windows: float  # the effective number of windows the interval rests on
    settled: bool

    @property
    def low_settled(self) -> bool:
        """The lower end within ``SETTLED_HALF_WIDTH`` of the estimate. A B_simple that grows as
        training goes on keeps the upper end wide (|G|^2 shrinks towards its own noise), while
        the lower end, all that a larger batch's pessimistic efficiency rests on, is known."""
        return (
            self.estimate > 0
            and self.lo > 0
            and self.estimate - self.lo <= SETTLED_HALF_WIDTH * self.estimate
        )

    @property
    def high_settled(self) -> bool:
        """The upper end within ``SETTLED_HALF_WIDTH`` of the estimate (what a smaller batch rests on)."""
        return self.estimate > 0 and self.hi - self.estimate <= SETTLED_HALF_WIDTH * self.estimate


def floor_interval(qa: float, qb: float, qc: float, tot_s: float, windows: float) -> GNSInterval | None:
    """Return the one-sided interval [lo, inf) of Fieller's set qa r^2 - 2 qb r + qc <= 0 when
    qa <= 0 (|G|^2 not clearly positive) and tr(Sigma) is clearly positive (qc > 0: r = 0 is out),
    else None. Then the set is r <= r1 < 0 or r >= r2 > 0, and B_simple >= 0 leaves r >= r2."""
    if tot_s <= 0 or qc <= 0 or qa > 0:
        return None
    if qa < 0:
        lo = (qb - math.sqrt(qb * qb - qa * qc)) / qa  # qa qc < 0: two real roots, this the positive one
    elif qb > 0:
        lo = qc / (2 * qb)  # qa = 0: the set is the ray r >= qc / (2 qb)
    else:
        return None
    return GNSInterval(lo, lo, math.inf, windows, False) if lo > 0 and math.isfinite(lo) else None
