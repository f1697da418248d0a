"""The data-loading verdict and advice (pure: analysis.loading)."""

from __future__ import annotations

import math

import pytest

from dtwork.analysis import loading


def test_paired_ratios_are_averaged_as_logs_with_a_positive_interval() -> None:
    r = loading.paired([50.0, 200.0], [100.0, 100.0])  # 0.5x and 2x cancel
    assert r.mean == pytest.approx(1.0) and r.rounds == 2
    assert r.low is not None and r.high is not None and 0 < r.low < 1 < r.high
    assert r.low * r.high == pytest.approx(1.0)  # symmetric on the log scale
    one = loading.paired([80.0], [100.0])
    assert one.mean == pytest.approx(0.8) and one.low is None and "no interval" in one.text()
    with pytest.raises(ValueError, match="positive"):
        loading.paired([0.0], [100.0])
    with pytest.raises(ValueError, match="same positive number"):
        loading.paired([1.0, 2.0], [1.0])


def test_the_verdict_follows_the_interval_not_the_mean() -> None:
    below = loading.Interval(0.5, 0.4, 0.6, 3)
    straddles = loading.Interval(0.8, 0.49, 1.1, 3)  # the 0.79x: a mean below, no verdict
    above = loading.Interval(1.0, 0.95, 1.05, 3)
    assert loading.verdict(below) == "bottleneck"
    assert loading.verdict(straddles) == "inconclusive"
    assert loading.verdict(above) == "no bottleneck"
    assert loading.verdict(loading.Interval(0.5, None, None, 1)) == "inconclusive"
    assert loading.decided(below) and not loading.decided(straddles)
    assert not loading.decided(loading.Interval(0.5, 0.4, 0.6, 2))  # too few rounds yet
    assert loading.headline("inconclusive", straddles, 80, 100).startswith("Inconclusive, run longer")
    assert "95% interval 0.40-0.60, 3 rounds" in loading.headline("bottleneck", below, 50, 100)


def test_candidates_follow_the_loader_and_the_cores() -> None:
    plain = loading.candidates({"num_workers": 0, "cores": 1, "cuda": False})
    assert plain == [
        {"num_workers": 2, "persistent_workers": True},
        {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4},
    ]
    many = loading.candidates({"num_workers": 0, "cores": 8, "cuda": True})
    assert {c["num_workers"] for c in many if "num_workers" in c} == {2, 4}
    assert [c for c in many if c.get("pin_memory")] == [{"pin_memory": True, **many[0]}]  # CUDA only
    assert not any(c.get("pin_memory") for c in plain)
    busy = loading.candidates({"num_workers": 4, "prefetch_factor": 2, "cores": 4})
    assert busy == [{"prefetch_factor": 4, "persistent_workers": True}]
    assert loading.candidates({"iterable": True, "num_workers": 0, "cores": 8}) == []


def test_advice_takes_the_best_measurably_faster_setting() -> None:
    two = {"num_workers": 2}
    four = {"num_workers": 4}
    noisy = loading.Interval(3.0, 0.9, 10.0, 3)  # the highest mean, but not measurably faster
    a = loading.advise([(two, loading.Interval(1.8, 1.5, 2.1, 3)), (four, noisy)])
    assert a.setting == two and a.gain is not None and math.isclose(a.gain.mean, 1.8)
    assert a.sentence().startswith("try DataLoader(..., num_workers=2): measured 1.80x")
    none = loading.advise([(four, noisy)])
    assert none.setting is None and "none of 1 loader settings was measurably faster" in none.sentence()
    assert loading.decided_gain(loading.Interval(1.8, 1.5, 2.1, 3))
    assert not loading.decided_gain(noisy)
