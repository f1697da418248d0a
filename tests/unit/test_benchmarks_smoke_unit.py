"""The benchmark in smoke mode runs end to end and fills the page's tables; its statistics are right.

Its tests that need no engines; the others are in tests/cluster/test_benchmarks_smoke.py.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from typing import Any

import pytest


def test_the_tables_are_written_only_between_their_markers() -> None:
    from benchmarks.tables import fill

    page = "prose\n<!-- generated: a -->\nold\n<!-- end: a -->\nmore prose\n"
    assert fill(page, {"a": "| x |"}) == "prose\n<!-- generated: a -->\n| x |\n<!-- end: a -->\nmore prose\n"
    with pytest.raises(ValueError, match="no '<!-- generated: b -->'"):
        fill(page, {"b": "| y |"})


def test_a_verdict_is_within_noise_when_the_interval_spans_the_target() -> None:
    from benchmarks.suite import _target
    from benchmarks.tables import verdict

    assert _target("2c", 2, "steps/s", 0.99, ">= 0.98", [0.97, 1.01])["conclusive"] is False
    cold = _target("2a", 2, "cold start", 0.6, "< 1.0", [0.55, 0.65])
    assert cold["met"] is True and cold["conclusive"] is True
    assert _target("2b", 2, "round trip", 1.3, "<= 1.2", None)["met"] is False
    assert (
        verdict(0.985, [0.975, 0.995], 0.99)
        == "**not met** (within noise: the 95% interval spans the target)"
    )
    assert verdict(0.993, [0.991, 0.995], 0.99) == "**met**"


def test_interleaved_summary_pairs_each_on_window_with_its_off_window() -> None:
    from benchmarks.stats import interleaved_summary

    # two ranks; cycles (on, off), (off, on), (on, off): on windows 1.0 s, off 0.9 s, but the last (1.8 s)
    arms = [True, False, False, True, True, False]
    g = interleaved_summary([[1.0, 0.9, 0.9, 1.0, 1.0, 1.7], [1.0, 0.9, 0.9, 1.0, 1.0, 1.9]], arms)
    assert g["cycles"] == 3 and g["pair_ratios"] == pytest.approx([0.9, 0.9, 1.8])
    assert g["ratio"] == pytest.approx(0.9)  # the median is robust to the one slow window
    assert g["ratio_of_totals"] == pytest.approx(3.6 / 3.0)
    with pytest.raises(ValueError, match="cycle 1 has two on windows"):
        interleaved_summary([[1.0, 1.0, 1.0, 1.0]], [True, False, True, True])
    with pytest.raises(ValueError, match="whole on/off cycles"):
        interleaved_summary([[1.0, 1.0, 1.0]], [True, False, True])


def test_pooled_runs_take_every_cycle_and_the_totals() -> None:
    from benchmarks.stats import pool
    from benchmarks.windows import _brief

    def run(pairs: list[float], on: float, off: float) -> dict[str, Any]:
        cpu = {"pair_ratios": [x + 0.01 for x in pairs], "on_total": on, "off_total": off}
        return {"pair_ratios": pairs, "on_total": on, "off_total": off, "cpu": cpu}

    p = pool([run([0.98, 1.0], 4.0, 3.9), run([1.02, 0.99, 1.01], 6.0, 6.1)])
    assert (p["runs"], p["cycles"]) == (2, 5) and p["ratio"] == pytest.approx(1.0)  # the median of five
    assert p["ratio_of_totals"] == pytest.approx(1.0)
    assert p["cpu"]["cycles"] == 5 and p["cpu"]["ratio"] == pytest.approx(
        1.01
    )  # the CPU readings pooled alike
    kept = _brief(p)
    assert "pair_ratios" not in kept and "pair_ratios" not in kept["cpu"] and kept["ci95"] == p["ci95"]


def test_turn_blocks_take_the_interval_over_launches_not_over_cycles() -> None:
    from benchmarks.stats import blocks_summary, turns_summary

    # block 1: dtwork's windows 1.0 s, torchrun's 0.9 s (ratio 0.9); block 2: 1.0 s and 1.1 s (1.1)
    b1 = {"dtwork": [1.0, 1.0, 1.0], "torchrun": [0.9, 0.9, 0.9]}
    b2 = {"dtwork": [1.0, 1.0, 1.0], "torchrun": [1.1, 1.1, 1.1]}
    one = turns_summary(b1, "dtwork", "torchrun", steps=30)
    assert one["ratio"] == pytest.approx(0.9) and one["ratio_of_totals"] == pytest.approx(0.9)
    assert one["steps_per_s"]["dtwork"] == pytest.approx(30.0)
    both = blocks_summary([b1, b2], "dtwork", "torchrun", steps=30)
    assert both["blocks"] == 2 and both["cycles"] == 6
    assert both["block_ratios"] == pytest.approx([0.9, 1.1])
    assert both["ratio"] == pytest.approx((0.9 * 1.1) ** 0.5)  # the geometric mean of the blocks
    lo, hi = both["ci95"]
    assert lo < 0.5 and hi > 1.9  # two launches 20% apart leave a wide interval, though every cycle agrees
    with pytest.raises(ValueError, match="positive window"):
        turns_summary({"dtwork": [1.0], "torchrun": []}, "dtwork", "torchrun", steps=30)


def test_turns_coordinator_drives_jobs_in_turns_over_real_sockets() -> None:
    """Two jobs of one rank each, in threads, answering as the workload's ``serve_turns`` does."""
    from benchmarks.turns import Turns, run_in_turns

    turns = Turns({"a": 1, "b": 1}, timeout=30)
    busy: list[str] = []

    def job(name: str, seconds: float) -> None:
        with socket.create_connection(("127.0.0.1", turns.port)) as sock:
            f = sock.makefile("rw")
            f.write(f"HELLO {name} 0\n")
            f.flush()
            for line in f:
                cmd = line.split()
                if cmd[0] != "RUN":
                    break
                busy.append(name)
                time.sleep(seconds * int(cmd[2]))  # stands in for training; no timing is asserted
                busy.append(name)
                f.write(f"DONE {seconds * int(cmd[2])!r}\n")
                f.flush()

    threads = [threading.Thread(target=job, args=(n, s)) for n, s in (("a", 0.001), ("b", 0.002))]
    for t in threads:
        t.start()
    driver, out = run_in_turns(turns, {"mlp": (3, 4)}, seed=1, alive=lambda: True)
    driver.join(30)
    for t in threads:
        t.join(30)
    assert "error" not in out, out
    res = out["mlp"]
    assert res["seconds"]["a"] == pytest.approx([0.003] * 4) and res["seconds"]["b"] == pytest.approx(
        [0.006] * 4
    )
    # never two jobs at once: every window's start is followed by its own end
    assert all(busy[i] == busy[i + 1] for i in range(0, len(busy), 2)) and len(busy) == 2 * 2 * (4 + 2)
    assert all(sorted(o) == ["a", "b"] for o in res["orders"])


def test_the_adaptive_phase_picks_the_best_fixed_batch_after_the_fact_and_judges_the_gates() -> None:
    from benchmarks.adaptive import summarize

    def run(batch: int, seed: int, seconds: float | None, samples: int = 1000, total: float = 10.0) -> dict:
        reached = seconds is not None
        return dict(batch=batch, lr=0.01, seed=seed, reached=reached, seconds=seconds, steps=samples // batch,
                    samples=samples if reached else None, total_seconds=total)  # fmt: skip

    # batch 64 is fastest in 2 of 5 seeds but misses the target in 3: its median is "not reached"
    fixed = [run(64, s, 1.0 if s < 2 else None) for s in range(5)]
    fixed += [run(128, s, 4.0 + s, samples=2000) for s in range(5)]  # median 6.0 s, 2000 samples
    fixed += [run(256, s, None, total=30.0) for s in range(5)]
    adaptive = [run(32, s, t, samples=2100, total=5.0) for s, t in enumerate([4.0, 4.5, 4.8, 7.0, 3.0])]
    for a in adaptive:
        a["adaptive"] = True
    s = summarize({"fixed": fixed, "adaptive": adaptive})
    assert (s["best"]["batch"], s["best"]["seconds"], s["best"]["samples"]) == (128, 6.0, 2000)
    assert [row["reached"] for row in s["grid"]] == [2, 5, 0] and s["grid"][2]["seconds"] == math.inf
    wall = s["gates"]["wall"]
    assert wall["seeds_met"] == 4 and wall["met"]  # <= 0.8 x 6.0 s in four seeds (4.8 just); 7.0 s not
    assert s["gates"]["samples"]["ratio"] == pytest.approx(1.05) and s["gates"]["samples"]["met"]
    assert s["gates"]["compute"]["ratio"] == pytest.approx(25.0 / 250.0) and s["gates"]["compute"]["met"]
