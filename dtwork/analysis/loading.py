"""Is data loading the bottleneck? A verdict with a 95% interval, and measured advice.

The ratio R = real / synthetic throughput is measured in interleaved rounds (one real and one
synthetic timing each, in alternating order, so drift in the machine's load hits both alike); its
geometric mean and 95% Student t interval come from the per-round log ratios
(``scaling.mean_interval``). The verdict follows the interval, not the mean: a bottleneck when the
whole interval lies below the threshold, none when it lies at or above it, else inconclusive. Loader settings are advised from
paired gains G = candidate / current throughput the same way: only a gain whose interval lies
above 1 counts as faster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

from dtwork.analysis.scaling import mean_interval
from dtwork.shared.bench import LoaderFacts, LoaderSetting

THRESHOLD = 0.9  # real below 90% of synthetic throughput: loading costs more than noise would
Verdict = Literal["bottleneck", "no bottleneck", "inconclusive"]


class IntervalDict(TypedDict):
    """An ``Interval`` as stored."""

    mean: float
    low: float | None
    high: float | None
    rounds: int


class TriedDict(TypedDict):
    setting: LoaderSetting
    gain: IntervalDict


class AdviceDict(TypedDict):
    """An ``Advice`` as stored in the "throughput" result."""

    setting: LoaderSetting | None
    gain: IntervalDict | None
    tried: list[TriedDict]


@dataclass(frozen=True)
class Interval:
    """A mean over k paired rounds with its 95% interval (low/high None with one round)."""

    mean: float
    low: float | None
    high: float | None
    rounds: int

    def text(self, unit: str = "x") -> str:
        if self.low is None or self.high is None:
            return f"{self.mean:.2f}{unit} (one round, no interval)"
        return f"{self.mean:.2f}{unit} (95% interval {self.low:.2f}-{self.high:.2f}, {self.rounds} rounds)"

    def to_dict(self) -> IntervalDict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "rounds": self.rounds}


def paired(numerators: Sequence[float], denominators: Sequence[float]) -> Interval:
    """The geometric mean of paired throughput ratios and its 95% interval.

    Ratios are averaged as logarithms (a 2x and a 0.5x round cancel, and the interval can never
    reach below zero); the interval is the t interval of the mean log, exponentiated.
    """
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError("paired ratios need the same positive number of timings on both sides")
    if min(*numerators, *denominators) <= 0:
        raise ValueError(f"throughputs must be positive to compare, got {min(*numerators, *denominators)}")
    logs = [math.log(a / b) for a, b in zip(numerators, denominators, strict=True)]
    mean, low, high = mean_interval(logs)
    return Interval(
        math.exp(mean),
        None if low is None else math.exp(low),
        None if high is None else math.exp(high),
        len(logs),
    )


def verdict(ratio: Interval, threshold: float = THRESHOLD) -> Verdict:
    """Bottleneck when the ratio's interval lies below ``threshold``; none when at or above it."""
    if ratio.low is None or ratio.high is None:
        return "inconclusive"
    if ratio.high < threshold:
        return "bottleneck"
    if ratio.low >= threshold:
        return "no bottleneck"
    return "inconclusive"


def decided(ratio: Interval, at_least: int = 3, threshold: float = THRESHOLD) -> bool:
    """Whether the ratio's rounds suffice: a verdict stands after ``at_least`` rounds."""
    return ratio.rounds >= at_least and verdict(ratio, threshold) != "inconclusive"


def decided_gain(gain: Interval, at_least: int = 3) -> bool:
    """Whether a setting's gain is settled: its interval lies wholly above or below 1."""
    if gain.rounds < at_least or gain.low is None or gain.high is None:
        return False
    return gain.low > 1.0 or gain.high < 1.0


def candidates(facts: LoaderFacts | None) -> list[LoaderSetting]:
    """DataLoader settings worth a measured try, from the facts a rank reports about its loader.

    ``facts``: num_workers, prefetch_factor, pin_memory, persistent_workers, iterable (an
    IterableDataset: more workers would repeat its items), cores (per rank), cuda. Workers 2 and 4
    where the rank's cores allow (2 always: loading that waits on I/O needs no core of its own),
    kept alive across epochs, then with a deeper prefetch; pinned memory only with CUDA.
    """
    if facts is None:  # no loader timed yet: what any loader could try
        facts = {
            "torch": False,
            "iterable": False,
            "num_workers": 0,
            "prefetch_factor": None,
            "pin_memory": False,
            "persistent_workers": False,
            "cores": 1,
            "cuda": False,
        }
    if facts.get("iterable"):
        return []
    now = int(facts.get("num_workers") or 0)
    cores = int(facts.get("cores") or 1)
    out: list[LoaderSetting] = []
    for workers in (2, 4):
        if workers <= now or workers > max(2, cores):
            continue
        out.append({"num_workers": workers, "persistent_workers": True})
        out.append({"num_workers": workers, "persistent_workers": True, "prefetch_factor": 4})
    if now > 0 and int(facts.get("prefetch_factor") or 2) < 4:
        out.append({"prefetch_factor": 4, "persistent_workers": True})
    if facts.get("cuda") and not facts.get("pin_memory"):
        out.append({"pin_memory": True, **(out[0] if out else {})})
    return out


def setting_text(kwargs: Mapping[str, object]) -> str:
    """``num_workers=2, persistent_workers=True`` as one would type it into DataLoader(...)."""
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


@dataclass(frozen=True)
class Advice:
    """The best measured loader setting: its gain over the current loader, or None when none helped."""

    setting: LoaderSetting | None
    gain: Interval | None
    tried: list[tuple[LoaderSetting, Interval]]

    def sentence(self) -> str:
        if not self.tried:
            return "no loader setting to try (an IterableDataset, or workers already at the limit)"
        if self.setting is None or self.gain is None:
            best = max(self.tried, key=lambda t: t[1].mean)
            return (
                f"none of {len(self.tried)} loader settings was measurably faster "
                f"(best: {setting_text(best[0])} at {best[1].text()}); look at the dataset's __getitem__"
            )
        return f"try DataLoader(..., {setting_text(self.setting)}): measured {self.gain.text()} faster"

    def to_dict(self) -> AdviceDict:
        return {
            "setting": self.setting,
            "gain": self.gain.to_dict() if self.gain else None,
            "tried": [{"setting": s, "gain": g.to_dict()} for s, g in self.tried],
        }


def advise(tried: Sequence[tuple[LoaderSetting, Interval]]) -> Advice:
    """The setting with the highest mean gain among those whose interval lies above 1."""
    faster = [(s, g) for s, g in tried if g.low is not None and g.low > 1.0]
    if not faster:
        return Advice(None, None, list(tried))
    setting, gain = max(faster, key=lambda t: t[1].mean)
    return Advice(setting, gain, list(tried))


def headline(kind: Verdict, ratio: Interval, real: float, synthetic: float) -> str:
    """One line: the verdict, the ratio with its interval, the throughputs behind it."""
    detail = (
        f"real batches reach {ratio.text()} of synthetic throughput ({real:.0f} vs {synthetic:.0f} samples/s)"
    )
    if kind == "bottleneck":
        return f"Data loading is the bottleneck: {detail}."
    if kind == "no bottleneck":
        return f"Data loading is not the bottleneck: {detail}."
    return f"Inconclusive, run longer (more --steps or --rounds): {detail}."
