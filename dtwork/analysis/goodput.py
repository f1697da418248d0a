"""Goodput = throughput x statistical efficiency, and the adaptive-batch decision built on it.

Statistical efficiency of a global batch M, relative to the starting batch M0 (Qiao et al., OSDI
2021, "Pollux", with the gradient noise scale B_simple of McCandlish et al. 2018)::

    E(M) = (B_simple + M0) / (B_simple + M)          E(M0) = 1, decreasing in M

AdaScale's gain (Johnson et al. 2020, "AdaScale SGD") at scale S = M / M0, with the variance of a
gradient at M0 sigma^2 = tr(Sigma) / M0 and mu^2 = |G|^2, so sigma^2 / mu^2 = B_simple / M0::

    r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2) = S * E(M)       1 <= r <= S

One optimizer step of k micro-batches of m examples per slot on n ranks (Pollux's model)::

    T_micro(m)  = a + b m
    T_comm(n)   = 0 for n = 1, c + d (n - 2) for n >= 2       (ring all-reduce)
    T_step      = (k - 1) T_micro + (T_micro^g + T_comm^g)^(1/g)     g >= 1 the overlap

and throughput(m, k, n) = m k n / T_step; goodput = throughput x E. The model is fitted in log
space from measured step and communication times (:func:`fit_throughput`); the decision
(:func:`decide`) chooses the split maximising goodput and switches only for a gain above a
threshold, as AdaptDL does (petuum/adaptdl, adaptdl/goodput.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from dtwork.analysis.gns import GNSInterval
from dtwork.shared.batch import split

LrRule = Literal["adascale", "adascale_sqrt", "linear", "sqrt"]
LR_RULES: tuple[str, ...] = ("adascale", "adascale_sqrt", "linear", "sqrt")
ProgressUnit = Literal["samples", "gain"]
GAMMAS = np.linspace(1.0, 10.0, 91)  # the overlap exponents searched, 0.1 apart
MIN_TIME = 1e-9  # seconds: a predicted time is never taken below this


def _check_batches(batch: float, start_batch: float) -> None:
    if batch <= 0 or start_batch <= 0:
        raise ValueError(f"batch sizes must be positive, got {batch} and start {start_batch}.")


def efficiency(b_simple: float, batch: float, start_batch: float) -> float:
    """Return E(M) = (B_simple + M0) / (B_simple + M), Pollux's statistical efficiency."""
    _check_batches(batch, start_batch)
    b = max(0.0, b_simple)
    return (b + start_batch) / (b + batch)


def adascale_gain(b_simple: float, batch: float, start_batch: float) -> float:
    """Return AdaScale's gain r = S E(M) = (B_simple + M0) M / ((B_simple + M) M0), S = M / M0.

    r is 1 for noiseless gradients (B_simple = 0) and tends to S (linear scaling) as B_simple grows.
    """
    return batch / start_batch * efficiency(b_simple, batch, start_batch)


def lr_factor(rule: str, batch: float, start_batch: float, b_simple: float | None = None) -> float:
    """Return the factor on the learning rate tuned at ``start_batch`` for ``batch``.

    adascale: r (SGD-like); adascale_sqrt: sqrt(r) (Adam-like, as AdaptDL); linear: M / M0
    (Goyal et al. 2017); sqrt: sqrt(M / M0) (Krizhevsky 2014). The AdaScale rules need B_simple.
    """
    if rule not in LR_RULES:
        raise ValueError(f"LR rule must be one of {', '.join(LR_RULES)}, got {rule!r}.")
    _check_batches(batch, start_batch)
    if rule in ("linear", "sqrt"):
        scale = batch / start_batch
        return scale if rule == "linear" else math.sqrt(scale)
    if b_simple is None:
        raise ValueError(f"LR rule {rule!r} needs B_simple; measure the GNS or use 'linear' or 'sqrt'.")
    gain = adascale_gain(b_simple, batch, start_batch)
    return gain if rule == "adascale" else math.sqrt(gain)


def second_moment_ratio(b_simple: float, batch: float, old_batch: float) -> float:
    """Return E|g|^2 at ``batch`` over E|g|^2 at ``old_batch`` for a batch-mean gradient g.

    E|g_M|^2 = |G|^2 + tr(Sigma) / M = |G|^2 (1 + B_simple / M): an Adam-like optimizer's second
    moment, an average of g^2, was gathered at the old batch and is off by this factor at the new
    one (too large after a growth, so the steps come out too small for ~1/(1 - beta2) steps).
    """
    _check_batches(batch, old_batch)
    if not math.isfinite(b_simple) or b_simple < 0:
        raise ValueError(f"B_simple must be finite and >= 0, got {b_simple}.")
    return (1.0 + b_simple / batch) / (1.0 + b_simple / old_batch)


def progress_increment(unit: str, batch: float, start_batch: float, b_simple: float | None = None) -> float:
    """Return the progress one optimizer step at ``batch`` adds, in steps at the starting batch.

    samples: M / M0 (the step counts as the samples it consumed); gain: AdaScale's r, its
    scale-invariant iterations (Johnson et al. 2020, section 3). A schedule written in steps at M0
    and evaluated at the accumulated progress keeps its meaning when the batch grows.
    """
    _check_batches(batch, start_batch)
    if unit == "samples":
        return batch / start_batch
    if unit == "gain":
        if b_simple is None:
            raise ValueError("progress in 'gain' needs B_simple; use 'samples' without a GNS.")
        return adascale_gain(b_simple, batch, start_batch)
    raise ValueError(f"progress unit must be 'samples' or 'gain', got {unit!r}.")


def progress_steps(samples_seen: float, start_batch: float) -> float:
    """Return progress in steps at the starting batch for ``samples_seen`` examples trained."""
    _check_batches(1.0, start_batch)
    return samples_seen / start_batch


@dataclass(frozen=True)
class StepObservation:
    """One measured optimizer step: its split, world size, and seconds (whole step, communication)."""

    per_slot: int
    accumulation: int
    world_size: int
    step_time: float
    comm_time: float = 0.0


@dataclass(frozen=True)
class ThroughputModel:
    """The fitted step-time model (see the module docstring); ``max_per_slot`` and
    ``max_global_batch`` cap extrapolation."""

    a: float
    b: float
    c: float
    d: float
    gamma: float
    max_per_slot: int
    max_global_batch: int | None = None  # None: no cap beyond the bounds'

    def micro_time(self, per_slot: float) -> float:
        """Return T_micro(m) = a + b m in seconds."""
        return max(MIN_TIME, self.a + self.b * per_slot)

    def comm_time(self, world_size: int) -> float:
        """Return T_comm(n): 0 on one rank, c + d (n - 2) from two."""
        return _comm_time(self.c, self.d, world_size)

    def step_time(self, per_slot: float, accumulation: int, world_size: int) -> float:
        """Return T_step = (k - 1) T_micro + (T_micro^g + T_comm^g)^(1/g) in seconds."""
        return _step_time(self.micro_time(per_slot), self.comm_time(world_size), accumulation, self.gamma)

    def throughput(self, per_slot: int, accumulation: int, world_size: int) -> float:
        """Return examples per second, m k n / T_step; 0 past ``max_per_slot`` (not supported)."""
        if per_slot > self.max_per_slot:
            return 0.0
        steps = self.step_time(per_slot, accumulation, world_size)
        return per_slot * accumulation * world_size / steps


def _comm_time(c: float, d: float, world_size: int) -> float:
    return 0.0 if world_size <= 1 else max(0.0, c + d * max(0, world_size - 2))


def _step_time(micro: float, comm: float, accumulation: int, gamma: float) -> float:
    return float(_step_times(np.asarray(micro), comm, np.asarray(accumulation), gamma))


def _step_times(
    micro: np.ndarray, comm: np.ndarray | float, k: np.ndarray, gamma: float | np.ndarray
) -> np.ndarray:
    """Return (k - 1) T_micro + (T_micro^g + T_comm^g)^(1/g), elementwise (T_comm = 0 gives k T_micro)."""
    result: np.ndarray = (k - 1) * micro + (micro**gamma + np.power(comm, gamma)) ** (1.0 / gamma)
    return result


def _invert_micro(step: np.ndarray, comm: np.ndarray, k: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """Return the T_micro that gives each observed step time under each ``gamma`` (a column: one row
    per gamma), by bisection (T_step >= k T_micro); every gamma in one pass, as numpy's cost on
    arrays this small is per call, not per element."""
    lo = np.zeros(np.broadcast_shapes(np.shape(gamma), step.shape))
    hi = lo + step / k
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        below = _step_times(mid, comm, k, gamma) < step
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    result: np.ndarray = np.maximum(MIN_TIME, 0.5 * (lo + hi))
    return result


def _fit_line_relative(m: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Fit y = a + b m, a, b >= 0, minimising relative error (weights 1 / y ~ log space)."""
    if len(np.unique(m)) < 2:
        half = float(np.mean(y)) / 2  # one batch size: half fixed, half per example (AdaptDL)
        return half, half / float(m[0])
    w = 1.0 / y
    design = np.stack([np.ones_like(m), m], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    if a < 0:
        return 0.0, float(np.sum(w * w * m * y) / np.sum(w * w * m * m))
    if b < 0:
        return float(np.sum(w * w * y) / np.sum(w * w)), 0.0
    return float(a), float(b)


def _fit_comm(obs: Sequence[StepObservation]) -> tuple[float, float]:
    """Fit T_comm(n) = c + d (n - 2) to the measured communication times of multi-rank steps."""
    multi = [o for o in obs if o.world_size >= 2 and o.comm_time > 0]
    if not multi:
        return 0.0, 0.0
    x = np.array([max(0, o.world_size - 2) for o in multi], dtype=float)
    y = np.array([o.comm_time for o in multi], dtype=float)
    if len(np.unique(x)) < 2:
        return float(np.mean(y)), 0.0  # one world size: no slope to fit
    d, c = np.polyfit(x, y, 1)
    return (float(c), float(d)) if d >= 0 else (float(np.mean(y)), 0.0)


def condense(observations: Sequence[StepObservation]) -> list[StepObservation]:
    """Return one observation per (per_slot, accumulation, world_size): the medians of its times.

    The loop keeps this profile (as AdaptDL keeps one per configuration), so the fit and the
    checkpoint stay the size of the configurations tried, and a slow outlier step moves nothing.
    """
    groups: dict[tuple[int, int, int], list[StepObservation]] = {}
    for o in observations:
        groups.setdefault((o.per_slot, o.accumulation, o.world_size), []).append(o)
    return [
        StepObservation(
            *key, float(np.median([o.step_time for o in g])), float(np.median([o.comm_time for o in g]))
        )
        for key, g in sorted(groups.items())
    ]


def fit_throughput(
    observations: Sequence[StepObservation], max_extrapolation: float = 2.0
) -> ThroughputModel:
    """Fit the step-time model to measured steps by least squares in log space.

    Communication: c, d from the measured communication times. Compute and overlap: for each
    overlap exponent g in :data:`GAMMAS`, invert every step time to its per-micro-batch compute,
    fit a + b m to those, and keep the g with the smallest sum of squared log errors of the
    predicted step times. With a single observed per-slot batch a and b cannot be separated: the
    fit splits the compute evenly, a = b m (AdaptDL's choice), and where the overlap cannot be told
    apart it takes the smallest g; both are optimistic about growing, so that growing is tried and
    measured, and what bounds the jump is that the
    model never predicts past ``max_extrapolation`` times the largest per-slot batch observed, nor
    past that many times the largest global batch (Pollux's pitfall: an optimistic fit from one
    batch size jumps too far; accumulation never measured is the same leap).
    """
    obs = [o for o in observations if o.step_time > 0 and o.per_slot >= 1 and o.accumulation >= 1]
    if not obs:
        raise ValueError("fit_throughput needs at least one observation with a positive step time.")
    if max_extrapolation < 1:
        raise ValueError(f"max_extrapolation must be at least 1, got {max_extrapolation}.")
    c, d = _fit_comm(obs)
    m = np.array([o.per_slot for o in obs], dtype=float)
    k = np.array([o.accumulation for o in obs], dtype=float)
    step = np.array([o.step_time for o in obs], dtype=float)
    comm = np.array([_comm_time(c, d, o.world_size) for o in obs])
    cap = int(max_extrapolation * max(o.per_slot for o in obs))
    # the global batch too: accumulation that was never measured rests on the fit's split of the step
    # into compute and communication, which noise in the measured communication skews
    global_cap = int(max_extrapolation * max(o.per_slot * o.accumulation * o.world_size for o in obs))
    micro = _invert_micro(step, comm, k, GAMMAS[:, None])
    best: tuple[float, ThroughputModel] | None = None
    # on a tie the least overlap wins, as AdaptDL's pull towards g = 1
    for gamma, row in zip(GAMMAS, micro, strict=True):
        a, b = _fit_line_relative(m, row)
        pred = _step_times(np.maximum(MIN_TIME, a + b * m), comm, k, float(gamma))
        loss = float(np.sum(np.log(pred / step) ** 2))
        if best is None or loss < best[0] - 1e-12:
            best = (loss, ThroughputModel(a, b, c, d, float(gamma), cap, global_cap))
    assert best is not None
    return best[1]


@dataclass(frozen=True)
class Split:
    """A global batch as per-slot batch x accumulation x slots."""

    per_slot: int
    accumulation: int
    slots: int

    @property
    def global_batch(self) -> int:
        """Return the examples per optimizer step, per_slot x accumulation x slots."""
        return self.per_slot * self.accumulation * self.slots

    @classmethod
    def of(cls, global_batch: int, slots: int, accumulation: int = 1) -> Split:
        """Return the split of ``global_batch`` by dtwork's rule (the remainder dropped)."""
        per_slot, _dropped = split(global_batch, slots * accumulation)
        return cls(per_slot, accumulation, slots)


@dataclass(frozen=True)
class BatchBounds:
    """Where the decision may go: the global cap, the per-slot floor and memory cap, accumulation."""

    max_global_batch_size: int
    min_per_slot_batch_size: int = 1
    max_per_slot_batch_size: int | None = None  # the largest per-slot batch that fits in memory
    max_accumulation: int = 64


@dataclass(frozen=True)
class BatchDecision:
    """One adaptive-batch decision: what to run next and why (goodputs in examples/s x E)."""

    switch: bool
    chosen: Split
    best: Split | None
    lr_factor: float | None
    efficiency: float | None
    goodput_current: float | None
    goodput_best: float | None
    reason: str | None

    @property
    def predicted_gain(self) -> float | None:
        """Return goodput_best / goodput_current - 1, or None without a prediction."""
        if self.goodput_best is None or not self.goodput_current:
            return None
        return self.goodput_best / self.goodput_current - 1.0


def _candidates(model: ThroughputModel, bounds: BatchBounds, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the (per_slot, accumulation) pairs allowed by the bounds and the fit's support."""
    hi = model.max_per_slot
    if bounds.max_per_slot_batch_size is not None:
        hi = min(hi, bounds.max_per_slot_batch_size)
    top = bounds.max_global_batch_size
    if model.max_global_batch is not None:
        top = min(top, model.max_global_batch)
    hi = min(hi, top // slots)
    lo = max(1, bounds.min_per_slot_batch_size)
    if hi < lo:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    p, k = np.meshgrid(np.arange(lo, hi + 1), np.arange(1, bounds.max_accumulation + 1), indexing="ij")
    keep = p * k * slots <= top
    return p[keep], k[keep]


def _throughputs(model: ThroughputModel, p: np.ndarray, k: np.ndarray, slots: int) -> np.ndarray:
    micro = np.maximum(MIN_TIME, model.a + model.b * p)
    result: np.ndarray = p * k * slots / _step_times(micro, model.comm_time(slots), k, model.gamma)
    return result


def _unsettled_reason(gns: GNSInterval | None) -> str | None:
    if gns is None:
        return "no GNS interval yet"
    if not (math.isfinite(gns.lo) and math.isfinite(gns.estimate)):
        return "the GNS interval is not finite"
    if not (gns.low_settled or gns.high_settled):
        return f"the GNS interval is not settled ({gns.windows:.1f} windows)"
    return None


def decide(
    gns: GNSInterval | None,
    model: ThroughputModel,
    current: Split,
    start_batch: int,
    bounds: BatchBounds,
    threshold: float = 0.05,
    lr_rule: str = "adascale",
) -> BatchDecision:
    """Choose the split maximising goodput = throughput x E(M); switch only above ``threshold``.

    Candidates are every per-slot batch m and accumulation k with m k slots within the bounds,
    m at least the per-slot floor and at most the memory cap and the fit's support. Each is
    compared with the current split at a pessimistic B_simple: the interval's lower end for a
    larger batch (a smaller B_simple makes growing less efficient) and its upper end for a smaller
    one, so a noisy estimate moves the batch in neither direction. A move needs that end settled
    (within 25% of the estimate): a B_simple that grows keeps the upper end wide for long, which
    must not stop the batch from growing on a known lower end. E(M) is known to under-predict
    large batches, which only adds to the caution. The move is taken when the predicted goodput
    gain exceeds ``threshold`` (AdaptDL: 5%), which with the two-sided pessimism keeps repeated
    calls on nearly equal inputs from oscillating. ``lr_factor`` is relative to ``start_batch``
    under ``lr_rule`` at the point estimate of B_simple, for the split to run next (the current
    one when not switching: AdaScale's gain moves with B_simple even at a fixed batch).
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}.")
    if lr_rule not in LR_RULES:
        raise ValueError(f"LR rule must be one of {', '.join(LR_RULES)}, got {lr_rule!r}.")
    stay = BatchDecision(False, current, None, None, None, None, None, None)
    reason = _unsettled_reason(gns)
    if reason is not None or gns is None:
        return _with(stay, reason=f"not deciding: {reason}")
    b_est, b_lo = max(0.0, gns.estimate), max(0.0, gns.lo)
    b_hi = max(b_est, gns.hi)
    m_cur = current.global_batch
    thr_cur = m_cur / model.step_time(current.per_slot, current.accumulation, current.slots)
    good_cur = thr_cur * efficiency(b_est, m_cur, start_batch)
    p, k = _candidates(model, bounds, current.slots)
    if p.size == 0:
        return _with(stay, goodput_current=good_cur, reason="no split fits the bounds")
    m = p * k * current.slots
    b = np.where(m > m_cur, b_lo, b_hi)
    e_ratio = np.where(np.isfinite(b), (b + m_cur) / (b + m), 1.0)
    ratio = _throughputs(model, p, k, current.slots) / thr_cur * e_ratio
    unsettled = ((m > m_cur) & (not gns.low_settled)) | ((m < m_cur) & (not gns.high_settled))
    ratio = np.where(unsettled, 0.0, ratio)  # no move on the side the interval has not settled
    i = int(np.argmax(ratio))
    best = Split(int(p[i]), int(k[i]), current.slots)
    good_best = good_cur * float(ratio[i])
    base = _with(
        stay,
        best=best,
        goodput_current=good_cur,
        goodput_best=good_best,
        lr_factor=lr_factor(lr_rule, m_cur, start_batch, b_est),
        efficiency=efficiency(b_est, m_cur, start_batch),
    )
    if best == current or ratio[i] <= 1.0 + threshold:
        gain = 100 * (float(ratio[i]) - 1.0)
        return _with(base, reason=f"predicted gain {gain:.1f}% is not above {100 * threshold:.0f}%")
    return _with(
        base,
        switch=True,
        chosen=best,
        lr_factor=lr_factor(lr_rule, best.global_batch, start_batch, b_est),
        efficiency=efficiency(b_est, best.global_batch, start_batch),
    )


def _with(decision: BatchDecision, **changes: object) -> BatchDecision:
    return replace(decision, **changes)  # type: ignore[arg-type]
