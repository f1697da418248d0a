"""Gradient noise scale and batch-size advice.

Reference: McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch
Training", arXiv:1812.06162 (Appendix A.1 for the unbiased estimators, section 2 for the
steps/examples trade-off). A batch of size B gives a mean gradient G_B with
E|G_B|^2 = |G|^2 + tr(Sigma)/B, so two batch sizes give unbiased estimates of |G|^2 and of
tr(Sigma); their ratio B_simple = tr(Sigma)/|G|^2 estimates the critical batch size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dtwork.analysis.gns_interval import SETTLED_HALF_WIDTH, GNSInterval, floor_interval, t_quantile_975
from dtwork.shared.batch import split as split_batch


def _check_sizes(b_small: float, b_big: float) -> None:
    if b_small < 1 or b_big < 1:
        raise ValueError(f"Batch sizes must be at least 1, got b_small={b_small} and b_big={b_big}.")
    if b_big <= b_small:
        raise ValueError(
            f"b_big ({b_big}) must be larger than b_small ({b_small}) to estimate the gradient noise scale."
        )


def unbiased_estimates(
    g_small_sq: float, g_big_sq: float, b_small: float, b_big: float
) -> tuple[float, float]:
    """Return the unbiased estimates (|G|^2, tr(Sigma)) from two batch sizes.

    |G|^2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small) and
    tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)
    (McCandlish et al. 2018, arXiv:1812.06162, Appendix A.1). Either may be negative on one
    noisy step; smooth them before taking their ratio.
    """
    _check_sizes(b_small, b_big)
    if not (math.isfinite(g_small_sq) and math.isfinite(g_big_sq)):
        raise ValueError(f"Squared gradient norms must be finite, got {g_small_sq} and {g_big_sq}.")
    g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace_sigma = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace_sigma


def b_simple(trace_sigma: float | None, g2: float | None) -> float | None:
    """Return B_simple = tr(Sigma) / |G|^2, or None when |G|^2 <= 0 or either is unknown.

    (McCandlish et al. 2018, arXiv:1812.06162, eq. 2.8.)
    """
    if trace_sigma is None or g2 is None or not math.isfinite(g2) or g2 <= 0:
        return None
    return trace_sigma / g2


MIN_BLOCKS = 8  # windows (effective) before an interval is computed
BLOCKS_PER_HORIZON = 20
MIN_BLOCK = 10  # measurements per window at least (windows close at O(windows) cost)
_DROP_WEIGHT = 1e-4  # windows weighted less than this are forgotten


class GNSEstimator:
    """Estimate B_simple = tr(Sigma) / |G|^2 with a 95% interval, smoothed over a horizon.

    Each measurement t gives unbiased estimates g_t of |G|^2 and s_t of tr(Sigma). Numerator
    and denominator are averaged separately with exponential weights d^(n - t) (an EMA with
    decay d, horizon 1/(1 - d) measurements); the EMA ratio R = sum w s / sum w g is the plain
    estimate (McCandlish et al. 2018, arXiv:1812.06162, Appendix A.1).

    The measurements are also summed in windows of ``block`` consecutive measurements (batch
    means; Flegal & Jones 2010, Ann. Statist. 38), which are nearly independent even when
    successive steps are not. With window sums
    A_i (numerator), B_i (denominator), weights w_i and centred deviations a_i = A_i - w_i A/W,
    b_i = B_i - w_i B/W (A, B, W the totals) and m = W^2 / sum w_i^2 windows:

    - the deviations are taken after a linear trend in time is removed as well (least squares on
      the columns w_i and w_i (t_i - t_w)), so |G|^2 shrinking as training goes on is counted as a
      change, not as noise; c = m/(m-2) then, and t has m - 2 degrees of freedom;
    - V_A = c sum a_i^2, V_B = c sum b_i^2, C = c sum a_i b_i estimate the totals' (co)variances;
    - the ratio's bias E[R] - rho ~ (rho V_B - C) / B^2 (second-order delta method) is removed:
      R_c = R - (R V_B - C) / B^2;
    - the 95% interval is Fieller's (Fieller 1954, JRSS B 16): the r with (A - r B)^2 <= t^2 (V_A - 2 r C + r^2 V_B),
      t the 0.975 quantile of Student's t with m - 1 degrees of freedom; it is bounded only when
      B^2 > t^2 V_B (|G|^2 clearly positive).

    The interval is given from ``MIN_BLOCKS`` effective windows on, and the estimate is
    "settled" once the interval lies within +-``SETTLED_HALF_WIDTH`` of it. Statistics are
    recomputed when a window closes (O(1) work per measurement otherwise). Non-finite norms
    (a step skipped by the fp16 loss scaler) are not used.
    """

    def __init__(self, ema_decay: float = 0.999, block: int | None = None) -> None:
        """Create an estimator with EMA decay ``ema_decay`` in [0, 1) per measurement and windows
        of ``block`` measurements (default: a twentieth of the horizon 1/(1 - ema_decay), at
        least ``MIN_BLOCK``)."""
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}.")
        if block is not None and block < 1:
            raise ValueError(f"block must be at least 1, got {block}.")
        self.ema_decay = float(ema_decay)
        horizon = 1.0 / (1.0 - self.ema_decay)
        self.block = int(block) if block is not None else max(MIN_BLOCK, round(horizon / BLOCKS_PER_HORIZON))
        self.reset()

    def reset(self) -> None:
        """Forget all updates."""
        self._steps = 0
        self._skipped = 0
        self._tot = [0.0, 0.0, 0.0]  # EMA sums of g, s and of the weights
        self._cur = [0.0, 0.0, 0.0]  # the same for the open window
        self._cur_n = 0
        self._blocks: list[list[float]] = []  # closed windows: [closed at step, g, s, w]
        self._interval: GNSInterval | None = None
        self._floor: GNSInterval | None = None  # a one-sided interval where no two-sided one is bounded

    def update(self, g_small_sq: float, g_big_sq: float, b_small: float, b_big: float) -> bool:
        """Add one measurement: ``g_small_sq`` is the mean over the small batches of their squared
        norms, ``g_big_sq`` the squared norm of their union. Return False (and use nothing) when a
        norm is not finite."""
        if not (math.isfinite(g_small_sq) and math.isfinite(g_big_sq)):
            self._skipped += 1
            return False
        g2, trace_sigma = unbiased_estimates(g_small_sq, g_big_sq, b_small, b_big)
        d, tot, cur = self.ema_decay, self._tot, self._cur
        tot[0], tot[1], tot[2] = d * tot[0] + g2, d * tot[1] + trace_sigma, d * tot[2] + 1.0
        cur[0], cur[1], cur[2] = d * cur[0] + g2, d * cur[1] + trace_sigma, d * cur[2] + 1.0
        self._steps += 1
        self._cur_n += 1
        if self._cur_n >= self.block:
            self._close_window()
        return True

    def _close_window(self) -> None:
        self._blocks.append([float(self._steps), *self._cur])
        self._cur = [0.0, 0.0, 0.0]
        self._cur_n = 0
        d = self.ema_decay
        oldest = self._steps - (math.log(_DROP_WEIGHT) / math.log(d) if d > 0 else 0.0)
        while self._blocks and self._blocks[0][0] < oldest:
            self._blocks.pop(0)
        self._interval, self._floor = self._window_interval()

    def _window_interval(self) -> tuple[GNSInterval | None, GNSInterval | None]:
        """Return the two-sided interval, or else the one-sided one (see :attr:`decision_interval`)."""
        if not self._blocks:
            return None, None
        at, g, s, w = np.array(self._blocks, dtype=np.float64).T
        f = self.ema_decay ** (self._steps - at)
        g, s, w = g * f, s * f, w * f
        tot_g, tot_s, tot_w = float(g.sum()), float(s.sum()), float(w.sum())
        m = tot_w**2 / float(w @ w)
        if m < MIN_BLOCKS:
            return None, None
        # deviations from each window's share of the totals and of a linear trend in time: |G|^2
        # shrinking as training goes on is a change, not noise, and must not widen the interval
        design = np.stack([w, w * (at - float(w @ at) / tot_w)], axis=1)
        coef, *_ = np.linalg.lstsq(design, np.stack([s, g], axis=1), rcond=None)
        dev_s, dev_g = (np.stack([s, g], axis=1) - design @ coef).T
        c = m / (m - 2)
        v_s, v_g, cov = c * float(dev_s @ dev_s), c * float(dev_g @ dev_g), c * float(dev_s @ dev_g)
        t2 = t_quantile_975(m - 2) ** 2
        qa = tot_g**2 - t2 * v_g  # Fieller: qa r^2 - 2 qb r + qc <= 0
        qb = tot_s * tot_g - t2 * cov
        qc = tot_s**2 - t2 * v_s
        if qa <= 0 or tot_g <= 0:
            return None, floor_interval(qa, qb, qc, tot_s, m)
        ratio = tot_s / tot_g
        estimate = ratio - (ratio * v_g - cov) / tot_g**2
        root = math.sqrt(max(0.0, qb * qb - qa * qc))
        lo, hi = (qb - root) / qa, (qb + root) / qa
        half = max(hi - estimate, estimate - lo)
        settled = estimate > 0 and lo > 0 and half <= SETTLED_HALF_WIDTH * estimate
        return GNSInterval(estimate, lo, hi, m, settled), None

    @property
    def steps(self) -> int:
        """Return the number of measurements used so far."""
        return self._steps

    @property
    def skipped(self) -> int:
        """Return the number of measurements left out because a norm was not finite."""
        return self._skipped

    @property
    def g2(self) -> float | None:
        """Return the bias-corrected EMA of |G|^2, or None before the first update."""
        return self._tot[0] / self._tot[2] if self._steps else None

    @property
    def trace_sigma(self) -> float | None:
        """Return the bias-corrected EMA of tr(Sigma), or None before the first update."""
        return self._tot[1] / self._tot[2] if self._steps else None

    @property
    def interval(self) -> GNSInterval | None:
        """Return the estimate with its 95% interval as of the last closed window, or None while
        fewer than ``MIN_BLOCKS`` windows (or no clearly positive |G|^2) support one."""
        return self._interval

    @property
    def decision_interval(self) -> GNSInterval | None:
        """Return the interval a decision to grow the batch rests on: :attr:`interval` when it is
        bounded, else a one-sided one, ``GNSInterval(lo, lo, inf, ...)``, when tr(Sigma) is clearly
        positive but |G|^2 is not clearly above zero.

        That is the usual state of a B_simple far above the batches measured (|G|^2 is then a
        small difference of two large norms): Fieller's set is then two rays, and as B_simple >= 0
        only the upper one, [lo, inf), is possible. Its estimate is taken at lo, the pessimistic
        end for growing; nothing is known on the side of shrinking, which is not "settled".
        """
        return self._interval if self._interval is not None else self._floor

    @property
    def settled(self) -> bool:
        """Return whether the 95% interval is narrow enough to act on."""
        return self._interval is not None and self._interval.settled

    @property
    def b_simple(self) -> float | None:
        """Return the bias-corrected B_simple of the last closed window when an interval exists,
        else the plain EMA ratio; None when unknown or |G|^2 <= 0."""
        if self._interval is not None:
            return self._interval.estimate
        return b_simple(self.trace_sigma, self.g2)

    def record_values(self) -> dict[str, float]:
        """Return the values of a "gns" record: b_simple, g2, trace_sigma, settled (1 or 0),
        when an interval exists, b_simple_lo and b_simple_hi, and after a measurement with a
        non-finite norm, ``left_out``: how many were left out."""
        est, g2, trace = self.b_simple, self.g2, self.trace_sigma
        if est is None or g2 is None or trace is None:
            return {}
        out = {"b_simple": est, "g2": g2, "trace_sigma": trace, "settled": float(self.settled)}
        if self._interval is not None:
            out["b_simple_lo"], out["b_simple_hi"] = self._interval.lo, self._interval.hi
        if self._skipped:
            out["left_out"] = float(self._skipped)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Return the state as a plain dict (numbers and lists of numbers)."""
        return {
            "ema_decay": self.ema_decay,
            "block": self.block,
            "g2_ema": self._tot[0],
            "trace_ema": self._tot[1],
            "weight": self._tot[2],
            "steps": self._steps,
            "skipped": self._skipped,
            "window": [*self._cur, float(self._cur_n)],
            "windows": [list(b) for b in self._blocks],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict`."""
        missing = {"ema_decay", "g2_ema", "trace_ema", "steps"} - set(state)
        if missing:
            raise ValueError(f"GNS state is missing {sorted(missing)}.")
        decay = float(state["ema_decay"])
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {decay}.")
        block = state.get("block")
        if block is not None and int(block) < 1:
            raise ValueError(f"block must be at least 1, got {block}.")
        self.ema_decay = decay
        self.block = int(block) if block is not None else self.block
        self.reset()
        steps = int(state["steps"])
        self._steps = steps
        self._skipped = int(state.get("skipped", 0))
        # a state without "weight" holds EMAs normalised by (1 - d) per step
        weight = float(state.get("weight", 1.0 - decay**steps))
        self._tot = [float(state["g2_ema"]), float(state["trace_ema"]), weight]
        window = state.get("window")
        if window is not None:
            self._cur, self._cur_n = [float(v) for v in window[:3]], int(window[3])
        self._blocks = [[float(v) for v in b] for b in state.get("windows", [])]
        if self._blocks:
            self._interval, self._floor = self._window_interval()

    def __repr__(self) -> str:
        return f"GNSEstimator(ema_decay={self.ema_decay}, steps={self._steps}, b_simple={self.b_simple})"


def no_estimate_reason(world_size: int, accumulation: int) -> str | None:
    """Return why no noise-scale estimate is possible, or None when one is.

    An estimate needs two batch sizes: the per-rank batches and the all-reduced batch at
    world size > 1, or the accumulation micro-batches and their sum at world size 1.
    """
    if world_size < 1 or accumulation < 1:
        raise ValueError(
            f"world_size and accumulation must be at least 1, got {world_size} and {accumulation}."
        )
    if world_size > 1 or accumulation >= 2:
        return None
    return (
        "No gradient noise scale estimate at world size 1 without gradient accumulation: "
        "set optimizations.aggregation_frequency >= 2 or use 2+ ranks."
    )


def batch_sizes_for(per_slot_batch: int, world_size: int, accumulation: int) -> tuple[int, int]:
    """Return (B_small, B_big) for the noise-scale estimate: B_small = b, B_big = b*k*n.

    The small batches are the micro-batches of b examples (k per rank and step with
    accumulation, on each of n ranks); the big batch is their union, the step's gradient.
    """
    if per_slot_batch < 1:
        raise ValueError(f"per_slot_batch must be at least 1, got {per_slot_batch}.")
    reason = no_estimate_reason(world_size, accumulation)
    if reason is not None:
        raise ValueError(reason)
    return per_slot_batch, per_slot_batch * accumulation * world_size


def tradeoff(b_noise: float, batch: float) -> tuple[float, float]:
    """Return (S/S_min, E/E_min) = (1 + B_noise/B, 1 + B/B_noise) at batch size B.

    These satisfy (S/S_min - 1)(E/E_min - 1) = 1 (McCandlish et al. 2018, eq. 2.11).
    """
    if b_noise <= 0 or batch <= 0:
        raise ValueError(f"b_noise and batch must be positive, got {b_noise} and {batch}.")
    return 1.0 + b_noise / batch, 1.0 + batch / b_noise


def tradeoff_curve(b_noise: float, batches: Sequence[float]) -> list[tuple[float, float, float]]:
    """Return the points (B, S/S_min, E/E_min) of the steps/examples trade-off for each B."""
    return [(float(b), *tradeoff(b_noise, b)) for b in batches]


@dataclass(frozen=True)
class BatchAdvice:
    """Batch-size advice derived from B_simple (McCandlish et al. 2018; Goyal et al. 2017)."""

    critical_batch: int
    global_batch: int
    slots: int
    candidates: list[int]
    per_slot: dict[int, int]
    steps_factor: float
    examples_factor: float
    lr_linear: dict[int, float]
    lr_sqrt: dict[int, float]
    warmup_steps: dict[int, int]
    sqrt_dataset_rule: str | None = None
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> list[str]:
        """Return short plain lines describing the advice."""
        lines = [
            f"Critical batch size ~ {self.critical_batch} (B_simple estimate).",
            f"Current global batch {self.global_batch}: {self.steps_factor:.2f}x the minimum steps, "
            f"{self.examples_factor:.2f}x the minimum examples.",
        ]
        for c in self.candidates:
            lines.append(
                f"Batch {c} ({self.per_slot[c]}/slot): lr {self.lr_linear[c]:.3g} linear or "
                f"{self.lr_sqrt[c]:.3g} sqrt, warmup {self.warmup_steps[c]} steps."
            )
        if self.sqrt_dataset_rule:
            lines.append(self.sqrt_dataset_rule)
        return lines + list(self.warnings)


def _candidates(b_noise: float, global_batch: int, slots: int, dataset_size: int | None) -> list[int]:
    lo = max(0, round(math.log2(max(1.0, b_noise / 4))))
    hi = max(lo, round(math.log2(max(1.0, 2 * b_noise))))
    out = {max(slots, round(2**k / slots) * slots) for k in range(lo, hi + 1)}
    if dataset_size is not None:
        out = {c for c in out if c <= dataset_size}
    return sorted(out | {global_batch})


def _warmup_for(candidate: int, global_batch: int, warmup_steps: int) -> int:
    scaled = warmup_steps * candidate / global_batch
    if candidate >= global_batch:
        return max(warmup_steps, math.ceil(scaled))
    return round(scaled)


def _split(global_batch: int, slots: int) -> tuple[int, int]:
    """(per slot, dropped) by Determined's split; a batch smaller than the slots fills none of them."""
    return split_batch(global_batch, slots) if global_batch >= slots else (0, global_batch)


def _advice_warnings(b_noise: float, global_batch: int, slots: int, min_per_slot: int) -> list[str]:
    out: list[str] = []
    per_slot, dropped = _split(global_batch, slots)
    if dropped:
        out.append(f"Global batch {global_batch} is not a multiple of {slots} slots.")
    if per_slot < min_per_slot:
        out.append(
            f"Per-slot batch {per_slot} is below {min_per_slot}: too small to keep a device busy; "
            "use fewer slots or a larger batch."
        )
    if global_batch > 2 * b_noise:
        out.append(
            f"Global batch {global_batch} is well above the critical batch ~{b_noise:.0f}: examples are wasted "
            "(more compute per unit of progress); a smaller batch trains as fast in steps."
        )
    elif global_batch < b_noise / 2:
        out.append(
            f"Global batch {global_batch} is well below the critical batch ~{b_noise:.0f}: steps are wasted; "
            "a larger batch needs fewer steps for the same progress."
        )
    return out


def advise(
    b_simple: float,
    global_batch: int,
    slots: int,
    base_lr: float,
    base_batch: int | None = None,
    warmup_steps: int = 0,
    dataset_size: int | None = None,
    min_per_slot: int = 8,
) -> BatchAdvice:
    """Advise on the global batch size from B_simple (taken as B_noise ~ B_crit).

    Candidates are powers of two from ~B_simple/4 to ~2*B_simple rounded to multiples of
    ``slots`` plus the current batch. S/S_min = 1 + B_noise/B and E/E_min = 1 + B/B_noise
    (McCandlish et al. 2018, arXiv:1812.06162); learning rates scale by B/base (Goyal et al.
    2017, arXiv:1706.02677) or sqrt(B/base) (Krizhevsky 2014, arXiv:1404.5997).
    """
    if not (math.isfinite(b_simple) and b_simple > 0):
        raise ValueError(f"b_simple must be a positive finite number, got {b_simple}.")
    if global_batch < 1 or slots < 1:
        raise ValueError(f"global_batch and slots must be at least 1, got {global_batch} and {slots}.")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}.")
    base = global_batch if base_batch is None else base_batch
    if base < 1:
        raise ValueError(f"base_batch must be at least 1, got {base}.")
    cands = _candidates(b_simple, global_batch, slots, dataset_size)
    steps_factor, examples_factor = tradeoff(b_simple, global_batch)
    rule = None
    if dataset_size is not None and global_batch > math.sqrt(dataset_size):
        root = math.isqrt(dataset_size)
        rule = (
            f"global batch {global_batch} is above sqrt(dataset size)={root}; with so few steps per epoch "
            "large batches tend to generalise worse, so check validation accuracy."
        )
    return BatchAdvice(
        critical_batch=max(1, round(b_simple)),
        global_batch=global_batch,
        slots=slots,
        candidates=cands,
        per_slot={c: _split(c, slots)[0] for c in cands},
        steps_factor=steps_factor,
        examples_factor=examples_factor,
        lr_linear={c: base_lr * c / base for c in cands},
        lr_sqrt={c: base_lr * math.sqrt(c / base) for c in cands},
        warmup_steps={c: _warmup_for(c, global_batch, warmup_steps) for c in cands},
        sqrt_dataset_rule=rule,
        warnings=_advice_warnings(b_simple, global_batch, slots, min_per_slot),
    )
