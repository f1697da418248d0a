"""``%dtrain throughput``: is data loading the bottleneck? Real batches against synthetic ones.

The verdict and the loader advice rest on paired, interleaved rounds (``analysis.loading``).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TypedDict

from dtwork.commands import bench_call
from dtwork.errors import DtworkError
from dtwork.shared.bench import BenchRequest, LoaderFacts, LoaderRequest, LoaderSetting

if TYPE_CHECKING:
    from dtwork.analysis.loading import AdviceDict, Interval, Verdict
    from dtwork.cluster import Cluster

__all__ = ["ThroughputResult", "throughput"]


class ThroughputResult(TypedDict):
    """What ``throughput`` returns and stores as the "throughput" result."""

    real: float  # mean samples/s over all ranks, real batches
    synthetic: float  # likewise, synthetic batches of the same shape
    ratio: float
    low: float | None
    high: float | None
    rounds: int
    verdict: Verdict
    bottleneck: bool
    sentence: str
    advice: AdviceDict | None
    advice_sentence: str | None
    world_size: int
    model: str
    loader: str


def _paired_rounds(
    first: Callable[[], float],
    second: Callable[[], float],
    rounds: tuple[int, int],
    decided: Callable[[Interval, int], bool],
) -> tuple[Interval, list[float], list[float]]:
    """Time ``first`` and ``second`` once a round, for ``rounds[0]`` to ``rounds[1]`` rounds until
    ``decided``; return the paired ratio first / second with its interval, and both timings."""
    from dtwork.analysis import loading

    a: list[float] = []
    b: list[float] = []
    least = max(2, min(rounds))
    while True:
        # Alternate which goes first, so a machine slowing down or warming up favours neither.
        for which in (0, 1) if len(a) % 2 == 0 else (1, 0):
            (b if which else a).append(second() if which else first())
        try:
            ratio = loading.paired(a, b)
        except ValueError as exc:
            raise DtworkError(str(exc)) from None
        if len(a) >= max(least, rounds[1]) or (len(a) >= least and decided(ratio, least)):
            return ratio, a, b


def throughput(
    cluster: Cluster,
    model_expr: str,
    loader_expr: str,
    *,
    steps: int = 10,
    warmup: int = 2,
    rounds: tuple[int, int] = (3, 8),
    advise: bool = True,
    quiet: bool = False,
) -> ThroughputResult:
    """Compare real batches from ``loader_expr`` with synthetic ones of the same shape.

    One real and one synthetic timing per round, interleaved (``analysis.loading``), for
    ``rounds[0]`` to ``rounds[1]`` rounds, until the ratio's 95% interval gives a verdict. When
    loading is the bottleneck (and ``advise``), each candidate loader setting is timed against the
    current loader in paired rounds the same way and the best measurably faster one is advised. Returns
    ``{"real", "synthetic" (mean samples/s over all ranks), "ratio", "low", "high", "rounds",
    "verdict", "bottleneck", "sentence", "advice"}``.
    """
    from dtwork.analysis import loading

    if not loader_expr:
        raise DtworkError("throughput needs a loader: --data LOADER_EXPR (e.g. --data ctx.loader(ds))")
    if steps < 1:
        raise DtworkError(f"--steps must be at least 1, got {steps}")
    if rounds[1] < 2:
        raise DtworkError(f"--rounds must be at least 2 (an interval needs two), got {rounds[1]}")
    world = cluster.world_size
    request = BenchRequest(
        model_expr, world, bench_call.DEFAULT_PER_SLOT, steps, warmup, loader=LoaderRequest(loader_expr)
    )
    facts: LoaderFacts | None = None

    def real_one(settings: LoaderSetting | None = None) -> float:
        nonlocal facts
        r = bench_call.real(cluster, replace(request, loader=LoaderRequest(loader_expr, settings)))
        facts = r["loader"] or facts
        return float(r["world_samples_per_s"])

    def synthetic_one() -> float:
        return float(bench_call.synthetic(cluster, request)["world_samples_per_s"])

    ratio, real, synth = _paired_rounds(real_one, synthetic_one, rounds, loading.decided)
    kind = loading.verdict(ratio)
    mean_real, mean_synth = statistics.fmean(real), statistics.fmean(synth)
    sentence = loading.headline(kind, ratio, mean_real, mean_synth)
    advice = None
    if kind == "bottleneck" and advise:
        tried = []
        for setting in loading.candidates(facts):
            changed = functools.partial(real_one, setting)
            gain, _, _ = _paired_rounds(changed, real_one, rounds, loading.decided_gain)
            tried.append((setting, gain))
        advice = loading.advise(tried)
    out: ThroughputResult = {
        "real": mean_real,
        "synthetic": mean_synth,
        "ratio": ratio.mean,
        "low": ratio.low,
        "high": ratio.high,
        "rounds": ratio.rounds,
        "verdict": kind,
        "bottleneck": kind == "bottleneck",
        "sentence": sentence,
        "advice": advice.to_dict() if advice else None,
        "advice_sentence": advice.sentence() if advice else None,
        "world_size": world,
        "model": model_expr,
        "loader": loader_expr,
    }
    bench_call.store_result(cluster, "throughput", out)
    if bench_call.in_ipython():
        from IPython.display import display

        from dtwork.plots import loading_figure

        display(loading_figure(mean_real, mean_synth, sentence.split(":")[0]))
    if not quiet:
        print(f"dtwork: {sentence}")
        if advice is not None:
            print(f"dtwork: advice: {advice.sentence()}")
    return out
