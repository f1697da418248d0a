"""Scaling efficiency, speedup and related measurements for data-parallel training.

Throughputs T are in samples/s. Speedup S(n) = T(n)/T(1) and efficiency E(n) = T(n)/(n T(1))
hold for weak scaling (fixed per-slot batch, the global batch grows with n) and strong scaling
(fixed global batch, the per-slot batch shrinks with n); see e.g. Sergeev & Del Balso 2018,
"Horovod: fast and easy distributed deep learning in TensorFlow", arXiv:1802.05799.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Mode = Literal["weak", "strong"]
MODES: tuple[str, ...] = ("weak", "strong")


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
    """One measurement: throughput in samples/s, step and communication times in seconds."""

    world_size: int
    throughput: float
    step_time: float
    comm_time: float
    per_slot_batch: int
    global_batch: int


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
        eff = self.efficiencies()
        clauses = [
            f"{n} ranks: {s:.2f}x ({eff[n]:.0%} efficient)" for n, s in self.speedups().items() if n > n0
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
    per_slot = global_batch // world_size
    return per_slot, per_slot * world_size


def best_bucket(results: Mapping[float, float]) -> float:
    """Return the bucket size (MB) with the lowest step time (seconds); ties go to the smaller bucket."""
    if not results:
        raise ValueError("No bucket-size measurements to choose from.")
    return min(results, key=lambda mb: (results[mb], mb))


def data_bottleneck(
    real_throughput: float, synthetic_throughput: float, threshold: float = 0.9
) -> tuple[bool, float, str]:
    """Return (is_bottleneck, ratio, sentence) with ratio = real / synthetic throughput.

    Data loading is the bottleneck when the ratio is below ``threshold``.
    """
    if synthetic_throughput <= 0:
        raise ValueError(f"Synthetic throughput must be positive, got {synthetic_throughput}.")
    if real_throughput < 0:
        raise ValueError(f"Real throughput must be >= 0, got {real_throughput}.")
    ratio = real_throughput / synthetic_throughput
    slow = ratio < threshold
    detail = (
        f"real batches reach {ratio:.2f}x of synthetic throughput "
        f"({real_throughput:.0f} vs {synthetic_throughput:.0f} samples/s)."
    )
    if slow:
        sentence = f"Data loading is the bottleneck: {detail}"
    else:
        sentence = f"Data loading is not the bottleneck: {detail}"
    return slow, ratio, sentence
