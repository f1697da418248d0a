"""Goodput: efficiency, AdaScale gain and LR rules, the throughput fit, the adaptive-batch decision."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtwork.analysis.gns import GNSInterval
from dtwork.analysis.goodput import (
    BatchBounds,
    Split,
    StepObservation,
    ThroughputModel,
    adascale_gain,
    condense,
    decide,
    efficiency,
    fit_throughput,
    lr_factor,
    progress_increment,
    progress_steps,
)
from dtwork.errors import ConfigError

TRUE = ThroughputModel(a=0.02, b=0.001, c=0.05, d=0.01, gamma=2.0, max_per_slot=10**9)
pos = st.floats(min_value=1.0, max_value=1e5)


def _obs(model: ThroughputModel, per_slot: int, k: int, n: int, noise: float = 1.0) -> StepObservation:
    return StepObservation(per_slot, k, n, model.step_time(per_slot, k, n) * noise, model.comm_time(n))


def _settled(b: float, rel: float = 0.1) -> GNSInterval:
    return GNSInterval(estimate=b, lo=b * (1 - rel), hi=b * (1 + rel), windows=20.0, settled=True)


# A model with a fixed cost per micro-batch and a fit supporting per-slot batches up to 512.
MODEL = ThroughputModel(a=0.01, b=0.001, c=0.02, d=0.0, gamma=2.0, max_per_slot=512)
BOUNDS = BatchBounds(max_global_batch_size=4096, min_per_slot_batch_size=8, max_accumulation=8)
START = Split(16, 1, 2)


@given(b=st.floats(min_value=0.0, max_value=1e6), m0=pos, m=pos)
def test_efficiency_is_one_at_the_start_and_decreasing(b: float, m0: float, m: float) -> None:
    assert efficiency(b, m0, m0) == pytest.approx(1.0)
    e = efficiency(b, m, m0)
    assert efficiency(b, 2 * m, m0) < e or b == 0 and m0 == 0
    assert (e <= 1.0 + 1e-12) if m >= m0 else (e >= 1.0 - 1e-12)


@given(b=st.floats(min_value=0.0, max_value=1e6), m0=pos, scale=st.floats(min_value=1.0, max_value=1e3))
def test_adascale_gain_lies_between_one_and_the_scale(b: float, m0: float, scale: float) -> None:
    r = adascale_gain(b, m0 * scale, m0)
    assert 1.0 - 1e-9 <= r <= scale * (1 + 1e-9)
    assert r == pytest.approx(scale * efficiency(b, m0 * scale, m0))


def test_adascale_gain_matches_the_variance_form() -> None:
    # r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2) with sigma^2 = tr(Sigma) / M0, mu^2 = |G|^2
    trace, g2, m0, m = 50.0, 0.5, 32, 256
    sigma2, s = trace / m0, m / m0
    assert adascale_gain(trace / g2, m, m0) == pytest.approx((sigma2 + g2) / (sigma2 / s + g2))
    assert adascale_gain(0.0, m, m0) == pytest.approx(1.0)
    assert adascale_gain(1e12, m, m0) == pytest.approx(s, rel=1e-6)


def test_lr_rules() -> None:
    r = adascale_gain(100.0, 256, 32)
    assert lr_factor("adascale", 256, 32, 100.0) == pytest.approx(r)
    assert lr_factor("adascale_sqrt", 256, 32, 100.0) == pytest.approx(math.sqrt(r))
    assert lr_factor("linear", 256, 32) == pytest.approx(8.0)
    assert lr_factor("sqrt", 256, 32) == pytest.approx(math.sqrt(8.0))
    with pytest.raises(ValueError, match="needs B_simple"):
        lr_factor("adascale", 256, 32)
    with pytest.raises(ValueError, match="must be one of"):
        lr_factor("cubic", 256, 32)


def test_progress_keeps_a_schedule_in_steps_at_the_starting_batch() -> None:
    # 10 steps at 32 then 5 at 128: 10 + 20 steps' worth of samples at the starting batch
    progress = sum(progress_increment("samples", 32, 32) for _ in range(10))
    progress += sum(progress_increment("samples", 128, 32) for _ in range(5))
    assert progress == pytest.approx(30.0)
    assert progress_steps(10 * 32 + 5 * 128, 32) == pytest.approx(progress)
    assert progress_increment("gain", 128, 32, 64.0) == pytest.approx(adascale_gain(64.0, 128, 32))
    assert progress_increment("gain", 128, 32, 64.0) < progress_increment("samples", 128, 32)
    with pytest.raises(ValueError, match="needs B_simple"):
        progress_increment("gain", 128, 32)


def test_fit_recovers_known_parameters_noise_free() -> None:
    obs = [_obs(TRUE, m, k, n) for m in (8, 32, 128) for k in (1, 2) for n in (2, 4)]
    fit = fit_throughput(obs)
    assert (fit.a, fit.b, fit.c, fit.d) == pytest.approx((TRUE.a, TRUE.b, TRUE.c, TRUE.d), rel=1e-3)
    assert fit.gamma == pytest.approx(TRUE.gamma, abs=0.051)
    assert fit.step_time(64, 3, 4) == pytest.approx(TRUE.step_time(64, 3, 4), rel=1e-3)


def test_fit_with_noise_predicts_within_a_few_percent() -> None:
    rng = np.random.default_rng(0)
    obs = [
        _obs(TRUE, m, k, n, float(rng.lognormal(0.0, 0.03)))
        for m in (8, 16, 32, 64, 128)
        for k in (1, 2, 4)
        for n in (2, 4)
        for _ in range(3)
    ]
    fit = fit_throughput(obs)
    for m, k, n in [(8, 1, 2), (100, 2, 4), (128, 4, 2)]:
        assert fit.step_time(m, k, n) == pytest.approx(TRUE.step_time(m, k, n), rel=0.05)
    assert fit.b == pytest.approx(TRUE.b, rel=0.15)


def test_fit_from_one_batch_size_is_not_optimistic() -> None:
    obs = [_obs(TRUE, 32, 1, 2)] * 3
    fit = fit_throughput(obs, max_extrapolation=2.0)
    assert fit.max_per_slot == 64
    assert fit.throughput(32, 1, 2) == pytest.approx(TRUE.throughput(32, 1, 2), rel=1e-3)
    assert fit.throughput(65, 1, 2) == 0.0
    for cap in (2.0, 4.0):  # a large noise scale wants a huge batch: the jump stops at the cap
        fit = fit_throughput(obs, max_extrapolation=cap)
        decision = decide(_settled(1e6), fit, Split(32, 1, 2), 64, BatchBounds(10**6, max_accumulation=1))
        assert decision.switch and decision.chosen.per_slot == int(32 * cap)


def test_fit_refuses_no_observations() -> None:
    with pytest.raises(ValueError, match="at least one observation"):
        fit_throughput([])


def test_small_noise_scale_keeps_the_batch_small() -> None:
    d = decide(_settled(10.0), MODEL, START, 32, BOUNDS)
    assert not d.switch and d.chosen == START
    assert d.reason is not None and "not above" in d.reason


def test_large_noise_scale_grows_the_batch_to_the_bound() -> None:
    bounds = BatchBounds(max_global_batch_size=512, min_per_slot_batch_size=8, max_accumulation=8)
    d = decide(_settled(30_000.0), MODEL, START, 32, bounds)
    assert d.switch and d.chosen.global_batch == 512
    assert d.lr_factor == pytest.approx(adascale_gain(30_000.0, 512, 32))
    assert d.efficiency == pytest.approx(efficiency(30_000.0, 512, 32))
    assert d.predicted_gain is not None and d.predicted_gain > 0.05


def test_memory_cap_turns_growth_into_accumulation() -> None:
    bounds = BatchBounds(max_global_batch_size=4096, max_per_slot_batch_size=64, max_accumulation=8)
    d = decide(_settled(1e6), MODEL, START, 32, bounds)
    assert d.switch and d.chosen.per_slot <= 64 and d.chosen.accumulation > 1


def test_the_batch_grows_as_the_noise_scale_grows() -> None:
    chosen = [
        decide(_settled(b), MODEL, START, 32, BOUNDS).chosen.global_batch for b in (10, 300, 3000, 30000)
    ]
    assert chosen == sorted(chosen) and chosen[0] == 32 and chosen[-1] >= 32 * 16


@settings(deadline=None)
@given(b=st.floats(min_value=1.0, max_value=1e5), wobble=st.floats(min_value=-0.02, max_value=0.02))
def test_no_oscillation_on_nearly_equal_inputs(b: float, wobble: float) -> None:
    first = decide(_settled(b), MODEL, START, 32, BOUNDS)
    again = decide(_settled(b * (1 + wobble)), MODEL, first.chosen, 32, BOUNDS)
    assert not again.switch


def test_no_switch_under_the_threshold() -> None:
    d = decide(_settled(10_000.0), MODEL, START, 32, BOUNDS, threshold=100.0)
    assert not d.switch and d.chosen == START and d.best is not None and d.best != START


def test_refuses_to_decide_on_an_unsettled_interval() -> None:
    loose = GNSInterval(estimate=1e4, lo=10.0, hi=1e6, windows=2.0, settled=False)
    for gns in (loose, None):
        d = decide(gns, MODEL, START, 32, BOUNDS)
        assert not d.switch and d.reason is not None and d.reason.startswith("not deciding")


def test_a_growing_noise_scale_grows_the_batch_on_its_settled_lower_end_only() -> None:
    """A B_simple that grows keeps the interval's upper end wide (|G|^2 nears its noise): the lower
    end, within 25% of the estimate, is what a larger batch rests on; a smaller one is not chosen."""
    growing = GNSInterval(estimate=10_000.0, lo=8_000.0, hi=90_000.0, windows=12.0, settled=False)
    assert growing.low_settled and not growing.high_settled
    d = decide(growing, MODEL, START, 32, BOUNDS)
    assert d.switch and d.chosen.global_batch > START.global_batch
    big = Split(START.per_slot * 64, 1, START.slots)  # far above what B_simple 10 supports
    assert decide(_settled(10.0), MODEL, big, 32, BOUNDS).chosen.global_batch < big.global_batch
    shrink = decide(GNSInterval(10.0, 8.0, 90.0, 12.0, False), MODEL, big, 32, BOUNDS)
    assert not shrink.switch and shrink.chosen == big  # its upper end is not settled
    loose_low = GNSInterval(estimate=10_000.0, lo=5_000.0, hi=11_000.0, windows=12.0, settled=False)
    assert not decide(loose_low, MODEL, START, 32, BOUNDS).chosen.global_batch > START.global_batch


def test_the_fit_never_predicts_past_twice_the_largest_global_batch_measured() -> None:
    """A step the fit reads as mostly communication (a straggling rank's wait counts as such) makes
    accumulation look nearly free; never measured, it may at most double the global batch."""
    fit = fit_throughput([StepObservation(8, 1, 2, step_time=0.10, comm_time=0.09)])
    assert fit.max_global_batch == 32
    d = decide(_settled(1e4), fit, Split(8, 1, 2), 16, BatchBounds(4096, max_accumulation=64))
    assert d.switch and 16 < d.chosen.global_batch <= 32, d.chosen


def test_respects_the_bounds() -> None:
    bounds = BatchBounds(max_global_batch_size=200, min_per_slot_batch_size=20, max_per_slot_batch_size=40)
    for b in (1.0, 10.0, 1e5):
        d = decide(_settled(b), MODEL, Split(30, 1, 2), 60, bounds)
        if d.switch:
            assert 20 <= d.chosen.per_slot <= 40 and d.chosen.global_batch <= 200
    d = decide(_settled(1.0), MODEL, Split(30, 1, 2), 60, BatchBounds(1000, min_per_slot_batch_size=600))
    assert not d.switch and d.reason == "no split fits the bounds"


def test_split_of_follows_the_batch_rule() -> None:
    assert Split.of(100, 2, 2) == Split(25, 2, 2)
    assert Split.of(101, 2, 1).global_batch == 100
    with pytest.raises(ConfigError):
        Split.of(3, 2, 2)


def test_a_wide_interval_moves_the_batch_less_either_way() -> None:
    tight, wide = _settled(1e4), GNSInterval(estimate=1e4, lo=100.0, hi=1e5, windows=20.0, settled=True)
    grow = [decide(g, MODEL, START, 32, BOUNDS).chosen.global_batch for g in (tight, wide)]
    assert grow[1] < grow[0]
    big = Split(256, 1, 2)
    tight, wide = _settled(10.0), GNSInterval(estimate=10.0, lo=1.0, hi=1e4, windows=20.0, settled=True)
    shrink = [decide(g, MODEL, big, 32, BOUNDS).chosen.global_batch for g in (tight, wide)]
    assert shrink[0] < shrink[1] <= big.global_batch


@settings(deadline=None, max_examples=40)
@given(
    a=st.floats(min_value=1e-3, max_value=0.1),
    b=st.floats(min_value=1e-5, max_value=1e-2),
    c=st.floats(min_value=0.0, max_value=0.2),
    gamma=st.floats(min_value=1.0, max_value=10.0),
)
def test_fit_interpolates_any_true_model_noise_free(a: float, b: float, c: float, gamma: float) -> None:
    true = ThroughputModel(a=a, b=b, c=c, d=0.0, gamma=gamma, max_per_slot=10**9)
    fit = fit_throughput([_obs(true, m, k, 2) for m in (8, 64, 256) for k in (1, 4)])
    for m, k in [(8, 1), (32, 2), (200, 3), (256, 4)]:
        assert fit.step_time(m, k, 2) == pytest.approx(true.step_time(m, k, 2), rel=0.02)


def test_condense_keeps_one_median_per_configuration() -> None:
    obs = [StepObservation(32, 1, 2, t, 0.01) for t in (0.10, 0.11, 5.0)] + [
        StepObservation(64, 2, 2, 0.3, 0.02)
    ]
    profile = condense(obs)
    assert profile == [StepObservation(32, 1, 2, 0.11, 0.01), StepObservation(64, 2, 2, 0.3, 0.02)]
    assert fit_throughput(profile).step_time(32, 1, 2) == pytest.approx(0.11, rel=1e-3)
