"""Tests for dtwork.analysis.scaling: efficiency, scaling results, sizes, buckets, data bottleneck."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtwork.analysis import (
    ScalingPoint,
    ScalingResult,
    best_bucket,
    efficiency,
    plan_sizes,
    speedup,
)


def point(
    n: int, throughput: float, step: float = 0.1, comm: float = 0.02, per_slot: int = 32
) -> ScalingPoint:
    return ScalingPoint(n, throughput, step, comm, per_slot, per_slot * n)


def test_efficiency_and_speedup_numbers():
    assert speedup(100.0, 184.0) == pytest.approx(1.84)
    assert efficiency(100.0, 184.0, 2) == pytest.approx(0.92)
    assert efficiency(100.0, 400.0, 4) == pytest.approx(1.0)
    assert efficiency(250.0, 250.0, 1) == pytest.approx(1.0)
    assert efficiency(100.0, 300.0, 8) == pytest.approx(0.375)


@given(t1=st.floats(1e-3, 1e6), tn=st.floats(0.0, 1e7), n=st.integers(1, 1024))
def test_efficiency_is_speedup_over_n(t1, tn, n):
    assert efficiency(t1, tn, n) == pytest.approx(speedup(t1, tn) / n)


def test_efficiency_rejects_bad_inputs():
    with pytest.raises(ValueError, match="baseline throughput must be positive"):
        efficiency(0.0, 10.0, 2)
    with pytest.raises(ValueError, match="n must be at least 1"):
        efficiency(10.0, 10.0, 0)


def test_scaling_result_tables():
    res = ScalingResult("weak", [point(4, 350.0, comm=0.05), point(1, 100.0), point(2, 184.0, comm=0.2)])
    assert [p.world_size for p in res.points] == [1, 2, 4]
    assert res.speedups() == pytest.approx({1: 1.0, 2: 1.84, 4: 3.5})
    assert res.efficiencies() == pytest.approx({1: 1.0, 2: 0.92, 4: 0.875})
    assert res.ideal() == pytest.approx({1: 100.0, 2: 200.0, 4: 400.0})
    assert res.comm_share() == pytest.approx({1: 0.2, 2: 1.0, 4: 0.5})  # 0.2/0.1 clipped to 1


def test_comm_share_clips_and_handles_zero_step_time():
    res = ScalingResult(
        "strong", [ScalingPoint(1, 10.0, 0.0, 0.1, 8, 8), ScalingPoint(2, 18.0, 0.1, -0.01, 4, 8)]
    )
    assert res.comm_share() == {1: 0.0, 2: 0.0}


def test_headline_text():
    res = ScalingResult("weak", [point(1, 100.0), point(2, 184.0), point(4, 350.0)])
    assert res.headline() == "2 ranks: 1.84x (92% efficient); 4 ranks: 3.50x (88% efficient)"


def test_headline_without_one_rank_baseline():
    res = ScalingResult("strong", [point(2, 200.0), point(4, 360.0)])
    assert res.efficiencies() == pytest.approx({2: 1.0, 4: 0.9})
    assert res.ideal() == pytest.approx({2: 200.0, 4: 400.0})
    assert res.headline() == "relative to 2 ranks (no 1-rank baseline): 4 ranks: 1.80x (90% efficient)"


def test_headline_degenerate_cases():
    assert ScalingResult("weak", []).headline() == "No scaling measurements."
    assert "no scaling to report" in ScalingResult("weak", [point(1, 100.0)]).headline()


def test_scaling_result_validation():
    with pytest.raises(ValueError, match="'weak' or 'strong'"):
        ScalingResult("sideways", [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="once"):
        ScalingResult("weak", [point(2, 1.0), point(2, 2.0)])
    with pytest.raises(ValueError, match="no points"):
        ScalingResult("weak", []).speedups()


def test_to_dict_from_dict_roundtrip_through_json():
    res = ScalingResult("strong", [point(1, 100.0), point(2, 190.0)])
    back = ScalingResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res
    assert back.to_dict()["mode"] == "strong"


def test_plan_sizes():
    assert plan_sizes("weak", 32, 999, 4) == (32, 128)
    assert plan_sizes("strong", 32, 256, 4) == (64, 256)
    assert plan_sizes("strong", 32, 100, 3) == (33, 99)
    with pytest.raises(ValueError, match="global batch 2 cannot be split over 4 ranks"):
        plan_sizes("strong", 32, 2, 4)
    with pytest.raises(ValueError, match="'weak' or 'strong'"):
        plan_sizes("diagonal", 32, 256, 4)


@given(per_slot=st.integers(1, 512), global_batch=st.integers(1, 4096), n=st.integers(1, 64))
def test_plan_sizes_invariants(per_slot, global_batch, n):
    b, gb = plan_sizes("weak", per_slot, global_batch, n)
    assert (b, gb) == (per_slot, per_slot * n)
    if global_batch >= n:
        b, gb = plan_sizes("strong", per_slot, global_batch, n)
        assert gb == b * n and global_batch - n < gb <= global_batch


def test_best_bucket():
    assert best_bucket({25.0: 0.30, 50.0: 0.28, 100.0: 0.29}) == 50.0
    assert best_bucket({100.0: 0.2, 10.0: 0.2, 50.0: 0.25}) == 10.0
    with pytest.raises(ValueError, match="No bucket-size measurements"):
        best_bucket({})
