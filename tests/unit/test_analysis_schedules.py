"""Tests for dtwork.analysis.schedules: LR scaling, warmup, decay and LARS."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtwork.analysis import decay_factor, lars_trust_ratio, lr_at, scaled_lr, warmup_factor


def test_scaled_lr_rules():
    assert scaled_lr(0.1, 1024, 256, "none") == pytest.approx(0.1)
    assert scaled_lr(0.1, 1024, 256, "linear") == pytest.approx(0.4)
    assert scaled_lr(0.1, 1024, 256, "sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 64, 256, "linear") == pytest.approx(0.025)
    with pytest.raises(ValueError, match="none, linear, sqrt, got 'cubic'"):
        scaled_lr(0.1, 1024, 256, "cubic")
    with pytest.raises(ValueError, match="at least 1"):
        scaled_lr(0.1, 0, 256, "linear")


def test_warmup_factor():
    assert warmup_factor(0, 0) == 1.0
    assert warmup_factor(0, 4) == pytest.approx(0.25)
    assert warmup_factor(2, 4) == pytest.approx(0.75)
    assert warmup_factor(3, 4) == 1.0
    assert warmup_factor(100, 4) == 1.0
    with pytest.raises(ValueError, match="step must be >= 0"):
        warmup_factor(-1, 4)


@given(step=st.integers(0, 10_000), warmup=st.integers(0, 1000))
def test_warmup_factor_bounds_and_monotone(step, warmup):
    f = warmup_factor(step, warmup)
    assert 0 < f <= 1
    assert warmup_factor(step + 1, warmup) >= f


@pytest.mark.parametrize(
    ("schedule", "step", "kwargs", "want"),
    [
        ("constant", 500, {}, 1.0),
        ("step", 999, {"step_size": 1000, "gamma": 0.1}, 1.0),
        ("step", 2500, {"step_size": 1000, "gamma": 0.1}, 0.01),
        ("exponential", 500, {"step_size": 1000, "gamma": 0.25}, 0.5),
        ("cosine", 0, {}, 1.0),
        ("cosine", 500, {}, 0.5),
        ("cosine", 1000, {}, 0.0),
        ("cosine", 5000, {}, 0.0),
        ("cosine", 500, {"min_factor": 0.2}, 0.6),
        ("cosine", 2000, {"min_factor": 0.2}, 0.2),
        ("polynomial", 250, {}, 0.75),
        ("polynomial", 500, {"power": 2.0}, 0.25),
        ("polynomial", 500, {"power": 2.0, "min_factor": 0.2}, 0.4),
        ("polynomial", 1500, {"min_factor": 0.1}, 0.1),
    ],
)
def test_decay_factor_values(schedule, step, kwargs, want):
    assert decay_factor(step, schedule, 1000, **kwargs) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("schedule", ["cosine", "polynomial"])
def test_decay_needs_total_steps(schedule):
    with pytest.raises(ValueError, match=f"The {schedule} schedule needs total_steps"):
        decay_factor(10, schedule, None)


def test_decay_rejects_unknown_schedule_and_bad_args():
    with pytest.raises(ValueError, match="constant, step, exponential, cosine, polynomial, got 'linear'"):
        decay_factor(10, "linear", 100)
    with pytest.raises(ValueError, match="step_size must be at least 1"):
        decay_factor(10, "step", None, step_size=0)
    with pytest.raises(ValueError, match=r"min_factor must be in \[0, 1\]"):
        decay_factor(10, "cosine", 100, min_factor=1.5)


@given(step=st.integers(0, 5000), total=st.integers(1, 5000), m=st.floats(0.0, 1.0))
def test_cosine_and_polynomial_stay_between_min_and_one(step, total, m):
    for schedule in ("cosine", "polynomial"):
        f = decay_factor(step, schedule, total, min_factor=m)
        assert m - 1e-12 <= f <= 1 + 1e-12
        assert decay_factor(step + 1, schedule, total, min_factor=m) <= f + 1e-12


COMMON = {"global_batch": 1024, "base_batch": 256, "rule": "linear", "warmup_steps": 100, "total_steps": 1100}


@pytest.mark.parametrize(
    ("schedule", "kwargs", "step", "want"),
    [
        ("constant", {}, 0, 0.4 * 0.01),
        ("constant", {}, 49, 0.4 * 0.5),
        ("constant", {}, 99, 0.4),
        ("constant", {}, 5000, 0.4),
        ("step", {"step_size": 300, "gamma": 0.5}, 399, 0.4),  # 299 steps after warmup
        ("step", {"step_size": 300, "gamma": 0.5}, 400, 0.2),  # 300 after warmup: one decay
        ("exponential", {"step_size": 500, "gamma": 0.25}, 350, 0.2),  # 0.25 ** (250 / 500)
        ("exponential", {"step_size": 500, "gamma": 0.25}, 600, 0.1),
        ("cosine", {}, 99, 0.4),
        ("cosine", {}, 600, 0.2),
        ("cosine", {}, 1100, 0.0),
        ("cosine", {"min_factor": 0.1}, 1100, 0.04),
        ("polynomial", {}, 350, 0.3),
        ("polynomial", {"power": 2.0}, 600, 0.1),
    ],
)
def test_lr_at_every_schedule(schedule, kwargs, step, want):
    assert lr_at(step, 0.1, schedule=schedule, **COMMON, **kwargs) == pytest.approx(want, abs=1e-12)


def test_lr_at_sqrt_rule_without_warmup():
    got = lr_at(250, 0.1, global_batch=1024, base_batch=256, rule="sqrt", schedule="cosine", total_steps=1000)
    assert got == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_lr_at_errors():
    with pytest.raises(ValueError, match=r"total_steps \(100\) must exceed warmup_steps \(100\)"):
        lr_at(5, 0.1, global_batch=8, base_batch=8, warmup_steps=100, schedule="cosine", total_steps=100)
    with pytest.raises(ValueError, match="The polynomial schedule needs total_steps"):
        lr_at(5, 0.1, global_batch=8, base_batch=8, schedule="polynomial")


def test_lars_trust_ratio():
    assert lars_trust_ratio(10.0, 0.01) == pytest.approx(0.001 * 10 / (0.01 + 1e-9))
    assert lars_trust_ratio(2.0, 1.0, trust_coefficient=0.02, weight_decay=0.5) == pytest.approx(
        0.02 * 2 / (1 + 0.5 * 2 + 1e-9)
    )
    assert lars_trust_ratio(0.0, 1.0) == 1.0
    assert lars_trust_ratio(1.0, 0.0) == 1.0
    with pytest.raises(ValueError, match="Norms must be >= 0"):
        lars_trust_ratio(-1.0, 1.0)
