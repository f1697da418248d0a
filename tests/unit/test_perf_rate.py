"""The kernel's rate rule for per-rank perf records (dtwork.store.perf_thinner)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dtwork.store.perf_thinner import BASE_SECONDS, RATE_RANKS, PerfThinner, perf_interval


def perf(rank: int, step: int, t: float, rate: float) -> dict:
    return {"kind": "perf", "step": step, "rank": rank, "time": t, "values": {"samples_per_s": rate}}


def test_interval_grows_past_the_threshold_and_bounds_the_rate() -> None:
    assert perf_interval(8) == perf_interval(RATE_RANKS) == BASE_SECONDS
    assert perf_interval(256) == BASE_SECONDS * 8
    for n in (64, 256, 4096):  # records a second over all ranks stay at RATE_RANKS / BASE_SECONDS
        assert abs(n / perf_interval(n) - RATE_RANKS / BASE_SECONDS) < 1e-6


def test_few_ranks_keep_every_record() -> None:
    recs = [perf(r, s, s * BASE_SECONDS, 1.0) for s in range(20) for r in range(4)]
    assert PerfThinner(4)(recs) == recs


def test_many_ranks_keep_one_mean_per_interval_and_pass_other_kinds() -> None:
    thin = PerfThinner(256)  # 0.8 s
    log = {"kind": "log", "step": 3, "rank": 0, "time": 0.0, "values": {"loss": 1.0}}
    out = thin([perf(0, 0, 0.0, 5.0), log] + [perf(0, s, s * 0.1, float(s)) for s in range(1, 20)])
    assert out[1] is log
    kept = [r for r in out if r["kind"] == "perf"]
    assert [r["step"] for r in kept] == [0, 8, 16]  # the first at once, then one every 0.8 s
    assert kept[1]["values"]["samples_per_s"] == sum(range(1, 9)) / 8  # the window's mean
    rest = thin.flush()
    assert [(r["step"], r["values"]["samples_per_s"]) for r in rest] == [(19, 18.0)]
    assert thin.flush() == []


def test_malformed_and_aggregated_records_pass_unchanged() -> None:
    odd = [{"kind": "perf", "rank": None, "time": 1.0, "values": {"a": 1}}, "text", {"kind": "perf"}]
    assert PerfThinner(512)(odd) == odd


@given(
    st.integers(1, 1024),
    st.lists(st.tuples(st.integers(0, 7), st.floats(0, 1e4, allow_nan=False)), max_size=200),
)
def test_the_kept_and_flushed_records_account_for_every_value(n: int, seq: list[tuple[int, float]]) -> None:
    thin = PerfThinner(n)
    recs = [perf(rank, i, i * BASE_SECONDS / 3, v) for i, (rank, v) in enumerate(seq)]
    out = thin(recs)
    pending = thin.flush()
    # a kept record stands for the records it folded: its value times their count sums them
    total = sum(v for _, v in seq)
    counted = 0.0
    for rank in {r for r, _ in seq}:
        mine = [i for i, (r, _) in enumerate(seq) if r == rank]
        kept = [r for r in out + pending if r["rank"] == rank]
        last = mine[0] - 1
        for rec in sorted(kept, key=lambda r: r["step"]):
            counted += rec["values"]["samples_per_s"] * sum(1 for i in mine if last < i <= rec["step"])
            last = rec["step"]
        assert last == mine[-1]  # nothing left behind after flush
    assert abs(counted - total) <= 1e-6 * max(1.0, total)
