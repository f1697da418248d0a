"""The statistics behind every published ratio: medians, bootstrap and t intervals, on/off cycles, turns."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

# two-sided 95% quantiles of Student's t, by degrees of freedom 1-30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145)
_T975 += (2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048)
_T975 += (2.045, 2.042)


def median(values: Sequence[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(vals) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else float(a) / float(b)


def sd(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def summarize(runs: Sequence[float]) -> dict[str, Any]:
    return {"runs": [float(v) for v in runs], "median": median(runs)}


def bootstrap_ci(a: Sequence[float], b: Sequence[float] | None = None, n: int = 2000, seed: int = 0) -> Any:
    """95% percentile-bootstrap interval of median(a), or of median(a) / median(b) resampled apart."""
    aa, bb = [float(x) for x in a], None if b is None else [float(x) for x in b]
    if len(aa) < 2 or (bb is not None and len(bb) < 2):
        return None
    rng, stats = random.Random(seed), []
    for _ in range(n):
        m = statistics.median(rng.choices(aa, k=len(aa)))
        if bb is not None:
            d = statistics.median(rng.choices(bb, k=len(bb)))
            m = m / d if d else math.nan
        stats.append(m)
    stats.sort()
    return [stats[int(0.025 * (n - 1))], stats[int(0.975 * (n - 1))]]


def geometric_mean_ci(ratios: Sequence[float]) -> tuple[float | None, list[float] | None]:
    """Geometric mean of independent ratios and its 95% t-interval, computed on their logarithms."""
    logs = [math.log(float(x)) for x in ratios if x and x > 0]
    if not logs:
        return None, None
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(m), None
    half = _T975[min(len(logs) - 1, len(_T975)) - 1] * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(m), [math.exp(m - half), math.exp(m + half)]


def cycles_summary(pairs: list[float], on_total: float, off_total: float) -> dict[str, Any]:
    """Cycle ratios (off time / on time = on / off throughput): median, bootstrap interval, totals."""
    out = dict(cycles=len(pairs), ratio=median(pairs), ci95=bootstrap_ci(pairs), on_total=on_total)
    out |= dict(ratio_of_totals=ratio(off_total, on_total), off_total=off_total, pair_sd=sd(pairs))
    return out | {"pair_ratios": pairs}


def interleaved_summary(windows_by_rank: list[list[float]], arms: list[bool]) -> dict[str, Any]:
    """Cycles of one on and one off window: a window's time is the mean over ranks (they step together)."""
    if not windows_by_rank or len(arms) % 2 or any(len(w) != len(arms) for w in windows_by_rank):
        raise ValueError("every rank must time every window, in whole on/off cycles")
    times = [sum(ws) / len(ws) for ws in zip(*windows_by_rank, strict=True)]
    pairs = []
    for i in range(0, len(times), 2):
        if arms[i] == arms[i + 1]:
            raise ValueError(f"cycle {i // 2} has two {'on' if arms[i] else 'off'} windows")
        on, off = (times[i], times[i + 1]) if arms[i] else (times[i + 1], times[i])
        pairs.append(off / on)
    on_total = sum(t for t, a in zip(times, arms, strict=True) if a)
    off_total = sum(t for t, a in zip(times, arms, strict=True) if not a)
    return {**cycles_summary(pairs, on_total, off_total), "window_s": median(times)}


def pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The cycles of several interleaved runs taken together, in wall-clock and in CPU seconds."""
    pairs = [x for run in runs for x in run["pair_ratios"]]
    out = cycles_summary(pairs, sum(r["on_total"] for r in runs), sum(r["off_total"] for r in runs))
    out["runs"] = len(runs)
    if runs and all(r.get("cpu") for r in runs):
        out["cpu"] = pool([r["cpu"] for r in runs])
    return out


def turns_summary(seconds: dict[str, list[float]], job: str, reference: str, steps: int) -> dict[str, Any]:
    """``job``'s throughput over ``reference``'s from windows taken in turns (reference s / job s)."""
    a, b = seconds[job], seconds[reference]
    if not a or len(a) != len(b) or min(a + b) <= 0:
        raise ValueError("every cycle needs a positive window of both jobs")
    out = cycles_summary([y / x for x, y in zip(a, b, strict=True)], sum(a), sum(b))
    out["window_s"] = {job: median(a), reference: median(b)}
    return out | {"steps_per_s": {job: steps * len(a) / sum(a), reference: steps * len(b) / sum(b)}}


def blocks_summary(blocks: list[dict[str, list[float]]], job: str, reference: str, steps: int) -> dict:
    """Blocks of turns, each a fresh launch of both jobs: the geometric mean of the blocks' ratios of totals,
    with a t-interval over blocks (launches of a job differ more than the cycles inside one launch show)."""
    if not blocks:
        raise ValueError("no blocks")
    ratios = [turns_summary(b, job, reference, steps)["ratio_of_totals"] for b in blocks]
    gm, ci95 = geometric_mean_ci(ratios)
    jobs = {j: [x for b in blocks for x in b[j]] for j in (job, reference)}
    pooled = turns_summary(jobs, job, reference, steps)
    within = {k: pooled[k] for k in ("ratio", "ci95", "ratio_of_totals", "pair_sd")}
    out = {"blocks": len(blocks), "ratio": gm, "ci95": ci95, "block_ratios": ratios, "block_sd": sd(ratios)}
    out["steps_per_window"] = steps
    return out | {k: pooled[k] for k in ("cycles", "window_s", "steps_per_s")} | {"within_block": within}
