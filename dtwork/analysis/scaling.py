"""Scaling efficiency, speedup and related measurements for data-parallel training.

Throughputs T are in samples/s. Speedup S(n) = T(n)/T(1) and efficiency E(n) = T(n)/(n T(1))
hold for weak scaling (fixed per-slot batch, the global batch grows with n) and strong scaling
(fixed global batch, the per-slot batch shrinks with n); see e.g. Sergeev & Del Balso 2018,
"Horovod: fast and easy distributed deep learning in TensorFlow", arXiv:1802.05799.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dtwork.shared.batch import split as split_batch
from dtwork.shared.records import Kind, Record, make_record

Mode = Literal["weak", "strong"]
MODES: tuple[str, ...] = ("weak", "strong")
EFFICIENCY_NAME = "scaling_efficiency"  # the aggregated "scaling" row the sidebar and the report read
SETTLE_REL = 0.05  # a throughput is settled when its 95% half-width is at most this share of its mean
COMM_BOUND = 0.5  # a step spending more than this share waiting for communication is too short
# two-sided 95% quantiles of Student's t, by degrees of freedom 1-10 (1.96 beyond)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"Scaling mode must be 'weak' or 'strong', got {mode!r}.")


def speedup(t1: float, tn: float) -> float:
    """Return the speedup S = T(n) / T(1) from the throughputs t1 = T(1) and tn = T(n)."""
    if t1 <= 0:
        raise ValueError(f"The baseline throughput must be positive, got {t1}.")
    return tn / t1


def efficiency(throughput_1: float, throughput_n: float, n: int) -> float:
    """Return the scaling efficiency E(n) = T(n) / (n T(1)) from throughputs in samples/s."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}.")
    return speedup(throughput_1, throughput_n) / n


@dataclass(frozen=True)
class ScalingPoint:
    """One measurement: throughput in samples/s, step and communication times in seconds.

    ``low`` and ``high`` bound the throughput's 95% interval over ``repeats`` timings (None: one
    timing); ``settled`` says whether that interval met the sweep's precision.
    """

    world_size: int
    throughput: float
    step_time: float
    comm_time: float
    per_slot_batch: int
    global_batch: int
    low: float | None = None
    high: float | None = None
    repeats: int = 1
    settled: bool = True


@dataclass
class ScalingResult:
    """A weak or strong scaling sweep; the baseline is the 1-rank point, else the smallest."""

    mode: Mode
    points: list[ScalingPoint] = field(default_factory=list)

    def __post_init__(self) -> None:
        """Check the mode and the world sizes, and sort the points by world size."""
        _check_mode(self.mode)
        sizes = [p.world_size for p in self.points]
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"Each world size may appear once in a scaling result, got {sizes}.")
        self.points = sorted(self.points, key=lambda p: p.world_size)

    def baseline(self) -> ScalingPoint:
        """Return the point at the smallest world size (1 rank when measured)."""
        if not self.points:
            raise ValueError("The scaling result has no points.")
        return self.points[0]

    def speedups(self) -> dict[int, float]:
        """Return {n: T(n) / T(n0)} relative to the baseline world size n0."""
        base = self.baseline()
        return {p.world_size: speedup(base.throughput, p.throughput) for p in self.points}

    def efficiencies(self) -> dict[int, float]:
        """Return {n: T(n) / ((n/n0) T(n0))}; with a 1-rank baseline this is T(n) / (n T(1))."""
        n0 = self.baseline().world_size
        return {n: s * n0 / n for n, s in self.speedups().items()}

    def ideal(self) -> dict[int, float]:
        """Return the ideal throughputs {n: (n/n0) T(n0)}; with a 1-rank baseline n T(1)."""
        base = self.baseline()
        return {p.world_size: p.world_size / base.world_size * base.throughput for p in self.points}

    def efficiency_intervals(self) -> dict[int, tuple[float, float]]:
        """Return {n: (low, high)} bounding E(n) from the throughputs' intervals (where measured).

        E(n) = T(n) n0 / (n T(n0)) is increasing in T(n) and decreasing in T(n0), so its bounds are
        low(n) n0 / (n high(n0)) and high(n) n0 / (n low(n0)) (conservative: the two are independent).
        """
        base = self.baseline()
        if base.low is None or base.high is None or base.low <= 0:
            return {}
        n0 = base.world_size
        return {
            p.world_size: (p.low * n0 / (p.world_size * base.high), p.high * n0 / (p.world_size * base.low))
            for p in self.points
            if p.low is not None and p.high is not None
        }

    def warnings(self) -> list[str]:
        """Return one line per world size whose step is too short to measure scaling (more than
        COMM_BOUND of it waits for communication, and the efficiency is below COMM_BOUND: the
        all-reduce's latency, not the model, is measured) or whose throughput did not settle."""
        out = []
        eff, shares = self.efficiencies() if self.points else {}, self.comm_share()
        for p in self.points:
            share = shares[p.world_size]
            if p.world_size > 1 and share > COMM_BOUND and eff[p.world_size] < COMM_BOUND:
                out.append(
                    f"{p.world_size} ranks: {share:.0%} of each {p.step_time * 1e3:.1f} ms step waits for "
                    "communication, so latency dominates: measure a bigger model or per-slot batch"
                )
            if not p.settled:
                out.append(
                    f"{p.world_size} ranks: throughput did not settle within ±{SETTLE_REL:.0%} after "
                    f"{p.repeats} timings: read its interval, or time more steps"
                )
        return out

    def comm_share(self) -> dict[int, float]:
        """Return {n: comm_time / step_time} clipped to [0, 1] (0 when step_time <= 0)."""
        out: dict[int, float] = {}
        for p in self.points:
            share = p.comm_time / p.step_time if p.step_time > 0 else 0.0
            out[p.world_size] = min(1.0, max(0.0, share))
        return out

    def headline(self) -> str:
        """Return one line such as "2 ranks: 1.84x (92% efficient); 4 ranks: 3.50x (88% efficient)"."""
        if not self.points:
            return "No scaling measurements."
        n0 = self.baseline().world_size
        eff, bounds = self.efficiencies(), self.efficiency_intervals()
        clauses = [
            f"{n} ranks: {s:.2f}x ({eff[n]:.0%} efficient"
            + (f", 95% interval {bounds[n][0]:.0%}-{bounds[n][1]:.0%})" if n in bounds else ")")
            for n, s in self.speedups().items()
            if n > n0
        ]
        if not clauses:
            return f"Only world size {n0} measured: no scaling to report."
        text = "; ".join(clauses)
        if n0 != 1:
            text = f"relative to {n0} ranks (no 1-rank baseline): {text}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {"mode": self.mode, "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScalingResult:
        """Build a result from :meth:`to_dict` output."""
        return cls(mode=data["mode"], points=[ScalingPoint(**p) for p in data["points"]])


def plan_sizes(mode: str, per_slot_batch: int, global_batch: int, world_size: int) -> tuple[int, int]:
    """Return (per-slot batch, global batch) at ``world_size`` for a scaling sweep.

    Weak scaling keeps the per-slot batch b: (b, b n). Strong scaling keeps the global batch
    B: (B // n, (B // n) n), dropping the remainder.
    """
    _check_mode(mode)
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}.")
    if mode == "weak":
        if per_slot_batch < 1:
            raise ValueError(f"per_slot_batch must be at least 1, got {per_slot_batch}.")
        return per_slot_batch, per_slot_batch * world_size
    if global_batch < world_size:
        raise ValueError(
            f"Strong scaling needs global batch >= world size: global batch {global_batch} cannot be "
            f"split over {world_size} ranks; raise the global batch or lower the world size."
        )
    per_slot, _ = split_batch(global_batch, world_size)
    return per_slot, per_slot * world_size


def best_bucket(results: Mapping[float, float]) -> float:
    """Return the bucket size (MB) with the lowest step time (seconds); ties go to the smaller bucket."""
    if not results:
        raise ValueError("No bucket-size measurements to choose from.")
    return min(results, key=lambda mb: (results[mb], mb))


def mean_interval(samples: Sequence[float]) -> tuple[float, float | None, float | None]:
    """Return (mean, low, high): the mean and its two-sided 95% Student t interval (None with one sample).

    half-width = t(0.975, k-1) s / sqrt(k) over k samples with standard deviation s.
    """
    if not samples:
        raise ValueError("No samples to summarise.")
    mean = statistics.fmean(samples)
    if len(samples) < 2:
        return mean, None, None
    t = _T975[len(samples) - 2] if len(samples) - 1 <= len(_T975) else 1.96
    half = t * statistics.stdev(samples) / math.sqrt(len(samples))
    return mean, mean - half, mean + half


def settled(samples: Sequence[float], rel: float = SETTLE_REL, at_least: int = 3) -> bool:
    """Whether ``samples`` (at least ``at_least``) give a mean whose 95% half-width is <= rel x mean."""
    if len(samples) < at_least:
        return False
    mean, low, high = mean_interval(samples)
    return low is not None and high is not None and (high - low) / 2 <= rel * abs(mean)


def sweep_baseline(results: Iterable[Mapping[str, Any]], per_slot: int | None) -> float | None:
    """Return T(1) in samples/s from the latest stored scaling sweep with a 1-rank point at ``per_slot``."""
    for data in reversed(list(results)):
        for p in data.get("points", ()) if isinstance(data, Mapping) else ():
            if p.get("world_size") == 1 and per_slot and p.get("per_slot_batch") == per_slot:
                return float(p["throughput"]) if p.get("throughput") else None
    return None


class LiveEfficiency:
    """Estimate the scaling efficiency of a running n-rank run from its ranks' perf records.

    With a single-rank throughput T(1) of the same model and per-slot batch (from a sweep), it is
    the measured E(n) = sum_r T_r / (n T(1)); without one, the share of a step not spent waiting for
    communication, E ~ 1 - mean_r(comm_time_r / step_time_r) (an upper bound: it ignores the
    compute a rank loses to the exchange). ``add`` returns an aggregated "scaling" record of it at most
    every ``every`` seconds.
    """

    def __init__(self, world_size: int, baseline: float | None = None, every: float = 1.0) -> None:
        self.world_size = world_size
        self.baseline = baseline
        self.every = every
        self.last: Record | None = None  # the latest record returned
        self._perf: dict[int, tuple[float, float, float]] = {}  # rank -> samples/s, step, comm
        self._step = 0
        self._at = -math.inf

    def add(self, records: Iterable[Mapping[str, Any]], now: float) -> Record | None:
        for rec in records:
            values = rec.get("values") if isinstance(rec, Mapping) else None
            if rec.get("kind") != Kind.PERF or not isinstance(values, Mapping):
                continue
            try:
                perf = tuple(float(values[k]) for k in ("samples_per_s", "step_time", "comm_time"))
                self._perf[int(rec["rank"])] = perf  # type: ignore[assignment]
                self._step = max(self._step, int(rec.get("step") or 0))
            except (KeyError, TypeError, ValueError):
                continue
        value = self.estimate()
        if value is None or now - self._at < self.every:
            return None
        self._at = now
        self.last = make_record(Kind.SCALING, self._step, 0, {EFFICIENCY_NAME: value})
        return self.last

    def estimate(self) -> float | None:
        """The current estimate, or None until every rank has reported its step times."""
        if self.world_size < 2 or len(self._perf) < self.world_size:
            return None
        if self.baseline:
            return sum(p[0] for p in self._perf.values()) / (self.world_size * self.baseline)
        shares = [min(1.0, max(0.0, c / s)) for _, s, c in self._perf.values() if s > 0]
        return 1.0 - statistics.fmean(shares) if shares else None
