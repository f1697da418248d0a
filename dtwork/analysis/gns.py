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


class GNSEstimator:
    """Smooth |G|^2 and tr(Sigma) separately with a bias-corrected EMA and report B_simple.

    ema_t = d * ema_{t-1} + (1 - d) * x_t and corrected_t = ema_t / (1 - d**t), as in Adam
    (Kingma & Ba 2015); B_simple = corrected tr(Sigma) / corrected |G|^2 (McCandlish et al. 2018).
    """

    def __init__(self, ema_decay: float = 0.95) -> None:
        """Create an estimator whose EMAs use the decay ``ema_decay`` in [0, 1)."""
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}.")
        self.ema_decay = float(ema_decay)
        self.reset()

    def reset(self) -> None:
        """Forget all updates."""
        self._g2_ema = 0.0
        self._trace_ema = 0.0
        self._steps = 0

    def update(self, g_small_sq: float, g_big_sq: float, b_small: float, b_big: float) -> None:
        """Add one step: ``g_small_sq`` is the mean over the small batches of their squared norms."""
        g2, trace_sigma = unbiased_estimates(g_small_sq, g_big_sq, b_small, b_big)
        d = self.ema_decay
        self._g2_ema = d * self._g2_ema + (1.0 - d) * g2
        self._trace_ema = d * self._trace_ema + (1.0 - d) * trace_sigma
        self._steps += 1

    def _corrected(self, ema: float) -> float | None:
        if self._steps == 0:
            return None
        return ema / (1.0 - self.ema_decay**self._steps)

    @property
    def steps(self) -> int:
        """Return the number of updates so far."""
        return self._steps

    @property
    def g2(self) -> float | None:
        """Return the bias-corrected smoothed |G|^2, or None before the first update."""
        return self._corrected(self._g2_ema)

    @property
    def trace_sigma(self) -> float | None:
        """Return the bias-corrected smoothed tr(Sigma), or None before the first update."""
        return self._corrected(self._trace_ema)

    @property
    def b_simple(self) -> float | None:
        """Return smoothed tr(Sigma) / smoothed |G|^2, or None when unknown or |G|^2 <= 0."""
        return b_simple(self.trace_sigma, self.g2)

    def state_dict(self) -> dict[str, float | int]:
        """Return the state as a plain dict."""
        return {
            "ema_decay": self.ema_decay,
            "g2_ema": self._g2_ema,
            "trace_ema": self._trace_ema,
            "steps": self._steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict`."""
        missing = {"ema_decay", "g2_ema", "trace_ema", "steps"} - set(state)
        if missing:
            raise ValueError(f"GNS state is missing {sorted(missing)}.")
        decay = float(state["ema_decay"])
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {decay}.")
        self.ema_decay = decay
        self._g2_ema = float(state["g2_ema"])
        self._trace_ema = float(state["trace_ema"])
        self._steps = int(state["steps"])

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
    """Return (B_small, B_big) for the noise-scale estimate.

    World size n > 1 with k accumulation steps: B_small = b*k, B_big = b*k*n.
    World size 1 with k >= 2: B_small = b (one micro-batch), B_big = b*k.
    """
    if per_slot_batch < 1:
        raise ValueError(f"per_slot_batch must be at least 1, got {per_slot_batch}.")
    reason = no_estimate_reason(world_size, accumulation)
    if reason is not None:
        raise ValueError(reason)
    if world_size > 1:
        return per_slot_batch * accumulation, per_slot_batch * accumulation * world_size
    return per_slot_batch, per_slot_batch * accumulation


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


def _advice_warnings(b_noise: float, global_batch: int, slots: int, min_per_slot: int) -> list[str]:
    out: list[str] = []
    per_slot = global_batch // slots
    if global_batch % slots:
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
        per_slot={c: c // slots for c in cands},
        steps_factor=steps_factor,
        examples_factor=examples_factor,
        lr_linear={c: base_lr * c / base for c in cands},
        lr_sqrt={c: base_lr * math.sqrt(c / base) for c in cands},
        warmup_steps={c: _warmup_for(c, global_batch, warmup_steps) for c in cands},
        sqrt_dataset_rule=rule,
        warnings=_advice_warnings(b_simple, global_batch, slots, min_per_slot),
    )
