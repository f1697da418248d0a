"""The benchmark entry point in smoke mode: runs end to end and writes what it promises.

``python -m benchmarks --smoke --out DIR`` runs a few steps of every measurement (cold start and
memory in fresh kernels, round trip, steps/s under every launcher, iteration latency, feature
on/off pairs) and must leave results.json with finite positive numbers, the plots and a summary.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("mlp", "convnet")
TIMEOUT = 300  # the smoke run takes about a minute on the 2-core machine; this is a hang guard


def _positive(x: Any, what: str) -> None:
    assert isinstance(x, (int, float)) and not isinstance(x, bool), f"{what}: {x!r} is not a number"
    assert math.isfinite(x) and x > 0, f"{what}: {x!r} is not finite and positive"


def _run_smoke(out: Path, state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DTWORK_HOME": str(state / "home"), "DTWORK_STORE": str(state / "runs.sqlite")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the entry point stops the engines it started on SIGTERM
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        raise AssertionError(f"smoke run did not finish in {TIMEOUT} s:\n{stderr[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_smoke_mode_writes_results_plots_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = _run_smoke(out, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "steps/s relative to torchrun" in proc.stdout

    r = json.loads((out / "results.json").read_text())
    assert r["meta"]["smoke"] is True
    assert r["meta"]["command"].startswith("python -m benchmarks")
    for key in ("cpu_model", "logical_cpus", "memory_gib"):
        assert r["meta"]["machine"][key]
    assert r["meta"]["versions"]["torch"] and r["meta"]["versions"]["ipyparallel"]
    _positive(r["meta"]["duration_s"], "duration")

    # (a) cold start, (b) round trip
    cold = r["cold_start"]
    assert not cold["errors"], cold["errors"]
    for key in ("dtwork_s", "raw_ipyparallel_s", "raw_ipyparallel_ddp_s"):
        _positive(cold[key]["median"], f"cold_start.{key}")
    _positive(cold["ratio_vs_raw_ipyparallel"], "cold start ratio")
    rt = r["round_trip"]
    for key in ("dtwork_quiet_s", "dtwork_default_s", "raw_px_s"):
        _positive(rt[key]["median"], f"round_trip.{key}")
    _positive(rt["ratio_quiet"], "round trip ratio")

    # (c) steps/s under every launcher that ran; optional ones ran or say why they were skipped
    tp = r["throughput"]
    assert not tp["errors"], tp["errors"]
    for alt in ("dtwork", "dtwork_steps", "raw_ipyparallel", "torchrun"):
        for kind in KINDS:
            _positive(tp[alt][kind]["median"], f"throughput.{alt}.{kind}")
            _positive(tp["ratio_vs_torchrun"][alt][kind], f"ratio_vs_torchrun.{alt}.{kind}")
    alts = r["alternatives"]
    for alt in ("accelerate", "fabric"):
        row = alts[alt]
        if row.get("skipped"):
            assert row["skipped"].startswith("skipped:"), row
        else:
            assert row["available"], row
            for kind in KINDS:
                _positive(row["steps_per_s"][kind], f"{alt} steps/s {kind}")
            _positive(row["cold_start_s"], f"{alt} cold start")
            _positive(row["iteration_latency_s"], f"{alt} iteration latency")
    for alt in ("dtwork", "raw_ipyparallel", "torchrun"):
        _positive(alts[alt]["cold_start_s"], f"{alt} cold start")
        _positive(alts[alt]["iteration_latency_s"], f"{alt} iteration latency")

    # (d) iteration latency
    lat = r["iteration_latency"]
    assert not lat["errors"], lat["errors"]
    for alt in ("dtwork", "dtwork_steps", "raw_ipyparallel", "torchrun"):
        _positive(lat[alt]["wall_s"]["median"], f"iteration_latency.{alt}")
    _positive(lat["speedup_vs"]["torchrun"], "iteration speedup vs torchrun")

    # feature overheads, memory, GPU placeholder
    for feature in ("log_store", "metric_averaging", "steps_loop"):
        for kind in KINDS:
            f = r["features"][feature][kind]
            _positive(f["ratio"], f"features.{feature}.{kind}")
            assert len(f["on_steps_per_s"]) == len(f["off_steps_per_s"]) >= 1
    for kind in KINDS:
        g = r["gns_interleaved"][kind]
        assert g["cycles"] == r["meta"]["plan"]["gns_cycles"][kind]
        assert g["steps_per_window"] == 8  # 2 * gns.every (4 by default)
        _positive(g["ratio"], f"gns_interleaved.{kind}")
        _positive(g["window_s"], f"gns_interleaved.{kind} window")
    for kind in KINDS:
        lv = r["live_interleaved"][kind]
        cycles = r["meta"]["plan"]["live_cycles"][kind]
        assert lv["cycles"] == cycles and lv["steps_per_window"] == r["meta"]["plan"]["live_window"][kind]
        assert lv["switches"] == 2 * cycles  # the kernel heard every window's start from rank 0
        _positive(lv["ratio"], f"live_interleaved.{kind}")
        _positive(lv["cpu"]["ratio"], f"live_interleaved.{kind} CPU")
        _positive(lv["cpu"]["ms_per_step"]["on_ranks"], f"live_interleaved.{kind} rank CPU")
        _positive(lv["ctx_log_ms"], f"live_interleaved.{kind} ctx.log")
    turns = r["turns"]
    assert turns["errors"] == [], turns["errors"]
    for kind in KINDS:
        t = turns[kind]
        assert t["blocks"] == 1 and t["cycles"] == r["meta"]["plan"]["turn_cycles"][kind]
        assert t["steps_per_window"] == r["meta"]["plan"]["turn_steps"][kind]
        _positive(t["ratio"], f"turns.{kind}")
        for job in ("dtwork", "torchrun"):
            _positive(t["steps_per_s"][job], f"turns.{kind}.{job} steps/s")
    for q in r["long_cell"]["kernel_cpu_share_by_quarter"]:
        assert math.isfinite(q) and q >= 0
    _positive(r["long_cell"]["steps_per_s"], "long cell steps/s")
    mem = r["memory"]
    for who in ("dtwork", "raw_ipyparallel"):
        for phase in ("fresh", "idle", "train"):
            _positive(mem[who][phase]["kernel_mb"], f"memory.{who}.{phase}.kernel")
            assert len(mem[who][phase]["engines_mb"]) == 2
            for i, v in enumerate(mem[who][phase]["engines_mb"]):
                _positive(v, f"memory.{who}.{phase}.engine{i}")
    assert r["gpu"]["measured"] is False and r["gpu"]["note"].startswith("not measured")

    # every target has a measured value and a verdict
    ids = {t["id"] for t in r["targets"]}
    assert {
        "2a",
        "2b",
        "2c-mlp",
        "2c-convnet",
        "2c-mlp-runs",
        "2d",
        "3-mlp",
        "3-convnet",
        "4-mlp",
        "4-convnet",
    } <= ids
    assert next(t for t in r["targets"] if t["id"] == "2c-mlp")["measured"] == turns["mlp"]["ratio"]
    assert (
        next(t for t in r["targets"] if t["id"] == "3-mlp")["measured"]
        == r["live_interleaved"]["mlp"]["ratio"]
    )
    for t in r["targets"]:
        _positive(t["measured"], f"target {t['id']}")
        assert isinstance(t["met"], bool)

    # plots and the markdown summary (a smoke run leaves docs/benchmarks.md alone)
    assert (out / "plots.html").stat().st_size > 1000
    summary = (out / "summary.md").read_text()
    assert "## Targets" in summary and "dtwork against each alternative" in summary
    assert "smoke run" in summary


def test_interleaved_summary_pairs_each_on_window_with_its_off_window() -> None:
    from benchmarks.features import interleaved_summary

    # two ranks; cycles (on, off), (off, on), (on, off): on windows take 1.0 s, off 0.9 s,
    # except the last cycle's off window (1.8 s); the ranks' times are averaged
    arms = [True, False, False, True, True, False]
    rank0 = [1.0, 0.9, 0.9, 1.0, 1.0, 1.7]
    rank1 = [1.0, 0.9, 0.9, 1.0, 1.0, 1.9]
    g = interleaved_summary([rank0, rank1], arms)
    assert g["cycles"] == 3
    assert g["pair_ratios"] == pytest.approx([0.9, 0.9, 1.8])
    assert g["ratio"] == pytest.approx(0.9)  # the median is robust to the one slow window
    assert abs(g["ratio_of_totals"] - 3.6 / 3.0) < 1e-12
    with pytest.raises(ValueError, match="cycle 1 has two on windows"):
        interleaved_summary([[1.0, 1.0, 1.0, 1.0]], [True, False, True, True])
    with pytest.raises(ValueError, match="whole on/off cycles"):
        interleaved_summary([[1.0, 1.0, 1.0]], [True, False, True])


def test_turn_blocks_take_the_interval_over_launches_not_over_cycles() -> None:
    from benchmarks.turns import blocks_summary, turns_summary

    # block 1: dtwork's windows 1.0 s, torchrun's 0.9 s (ratio 0.9); block 2: 1.0 s and 1.1 s (1.1)
    b1 = {"dtwork": [1.0, 1.0, 1.0], "torchrun": [0.9, 0.9, 0.9]}
    b2 = {"dtwork": [1.0, 1.0, 1.0], "torchrun": [1.1, 1.1, 1.1]}
    one = turns_summary(b1, "dtwork", "torchrun", steps=30)
    assert one["ratio"] == pytest.approx(0.9) and one["ratio_of_totals"] == pytest.approx(0.9)
    assert one["steps_per_s"]["dtwork"] == pytest.approx(30.0)
    both = blocks_summary([b1, b2], "dtwork", "torchrun", steps=30)
    assert both["blocks"] == 2 and both["cycles"] == 6
    assert both["block_ratios"] == pytest.approx([0.9, 1.1])
    assert both["ratio"] == pytest.approx((0.9 * 1.1) ** 0.5)  # geometric mean of the blocks
    lo, hi = both["ci95"]
    # two launches that disagree by 20% leave a wide interval, though every cycle inside each agrees
    assert lo < 0.5 and hi > 1.9
    with pytest.raises(ValueError, match="positive window"):
        turns_summary({"dtwork": [1.0], "torchrun": []}, "dtwork", "torchrun", steps=30)


def test_turns_coordinator_drives_jobs_in_turns_over_real_sockets() -> None:
    """Two fake "jobs" of one rank each, in threads, answering as serve_turns does."""
    import socket
    import threading
    import time

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
                time.sleep(seconds * int(cmd[2]))
                busy.append(name)
                f.write(f"DONE {seconds * int(cmd[2])!r}\n")
                f.flush()

    threads = [threading.Thread(target=job, args=(n, s)) for n, s in (("a", 0.001), ("b", 0.002))]
    for t in threads:
        t.start()
    driver, out = run_in_turns(turns, {"mlp": (3, 4)}, seed=1)
    driver.join(30)
    for t in threads:
        t.join(30)
    assert "error" not in out, out
    res = out["mlp"]
    assert len(res["seconds"]["a"]) == len(res["seconds"]["b"]) == 4
    assert res["seconds"]["a"] == pytest.approx([0.003] * 4) and res["seconds"]["b"] == pytest.approx(
        [0.006] * 4
    )
    # never two jobs at once: every window's start is followed by its own end
    assert all(busy[i] == busy[i + 1] for i in range(0, len(busy), 2)) and len(busy) == 2 * 2 * (4 + 2)
    assert all(sorted(o) == ["a", "b"] for o in res["orders"])


def test_long_live_runs_pool_their_cycles_and_reach_the_document(tmp_path: Path) -> None:
    """``python -m benchmarks.live`` pools the cycles of its runs; the report shows the pooled rows."""
    from benchmarks import report
    from benchmarks.live import pool

    def run(pairs: list[float], on: float, off: float) -> dict[str, Any]:
        cpu = {
            "pair_ratios": pairs,
            "on_total": on,
            "off_total": off,
            "ms_per_step": {"on_kernel": 0.3, "off_kernel": 0.2},
        }
        return {
            "pair_ratios": pairs,
            "on_total": on,
            "off_total": off,
            "ratio": pairs[0],
            "ctx_log_ms": 0.02,
            "cpu": cpu,
        }

    p = pool([run([0.98, 1.0], 4.0, 3.9), run([1.02, 0.99, 1.01], 6.0, 6.1)])
    assert p["runs"] == 2 and p["cycles"] == 5
    assert p["ratio"] == pytest.approx(1.0)  # the median of all five cycles
    assert p["ratio_of_totals"] == pytest.approx(10.0 / 10.0)
    assert p["cpu"]["ms_per_step"]["on_kernel"] == pytest.approx(0.3)
    long = {
        "command": "python -m benchmarks.live",
        "started": "now",
        "duration_s": 60.0,
        "runs": [{}],
        "pooled": {"mlp": {"ab": p, "aa": {**p, "ratio": 1.003}}},
    }
    text = report.long_live_section(long)
    assert "| mlp | 2 | 5 | 1.000 |" in text and "| mlp A/A | 2 | 5 | 1.003 |" in text
    (tmp_path / "results.json").write_text(json.dumps({"meta": {}}))
    (tmp_path / "live.json").write_text(json.dumps(long))
    assert report.load(tmp_path)["live_long"]["pooled"]["mlp"]["ab"]["cycles"] == 5


def test_a_long_live_run_keeps_the_readings_of_every_run_before_it(tmp_path: Path) -> None:
    """A new ``python -m benchmarks.live`` result carries the pooled readings of those it replaces, and the
    document lists them: no run drops out of the record because a later one was taken."""
    from benchmarks import report
    from benchmarks.live import brief, earlier_runs

    def result(started: str, ab: float, aa: float) -> dict[str, Any]:
        pooled = {
            "ab": {
                "runs": 2,
                "cycles": 30,
                "ratio": ab,
                "ci95": [ab - 0.01, ab + 0.01],
                "cpu": {"ratio": ab},
            },
            "aa": {"runs": 1, "cycles": 15, "ratio": aa, "ci95": [aa - 0.02, aa + 0.02]},
        }
        return {
            "command": "python -m benchmarks.live",
            "started": started,
            "duration_s": 600.0,
            "runs": [{}],
            "dtwork_commit": "abc1234",
            "pooled": {"mlp": pooled},
        }

    path = tmp_path / "live.json"
    assert earlier_runs(path) == []  # no file yet
    first = result("first", 0.981, 0.987)
    path.write_text(json.dumps({**first, "earlier": earlier_runs(path)}))
    second = {**result("second", 0.994, 1.003), "earlier": earlier_runs(path), "driven_from": "ipykernel"}
    path.write_text(json.dumps(second))
    third = {**result("third", 0.990, 0.999), "earlier": earlier_runs(path)}
    assert [r["started"] for r in third["earlier"]] == ["first", "second"]
    assert (
        third["earlier"][0] == brief(first)
        and third["earlier"][0]["pooled"]["mlp"]["ab"]["cpu_ratio"] == 0.981
    )
    text = report.long_live_section(third)
    assert "- first (10 min, dtwork abc1234): mlp 0.981 (0.971-0.991, 30 cycles) [A/A 0.987]" in text
    assert (
        "- second (10 min, dtwork abc1234, from an ipykernel): mlp 0.994 (0.984-1.004, 30 cycles) [A/A 1.003]"
        in text
    )
    assert "| mlp | 2 | 30 | 0.990 |" in text  # the latest run's own table


def test_a_long_run_entered_by_hand_keeps_its_note_and_no_cycle_count(tmp_path: Path) -> None:
    """A run whose readings were entered from the page (its cycles lost) says so in the record and the
    document, and names no number of cycles; a later run keeps it as it is."""
    from benchmarks import report
    from benchmarks.live import brief, earlier_runs, same_code

    entered = {
        "started": "2026-11-22 04:53 +0000",
        "duration_s": 1620.0,
        "dtwork_tree": "cc5b359",
        "driven_from": "ipykernel",
        "note": "read from that session's log",
        "pooled": {
            "mlp": {"ab": {"cycles": None, "ratio": 0.981, "ci95": [0.966, 0.994]}, "aa": {"ratio": 0.991}}
        },
    }
    path = tmp_path / "live.json"
    path.write_text(json.dumps(entered))
    assert brief(entered)["note"] == "read from that session's log"
    assert "note" not in brief({**entered, "note": None})
    later = {
        "started": "later",
        "duration_s": 60.0,
        "dtwork_tree": "cc5b359",
        "driven_from": "ipykernel",
        "earlier": earlier_runs(path),
        "pooled": {
            "mlp": {
                "ab": {"runs": 1, "cycles": 2, "ratio": 0.99, "ci95": [0.98, 1.0], "pair_ratios": [0.98, 1.0]}
            }
        },
    }
    assert same_code(later) is None  # nothing to pool with: the entered run has no cycles
    text = report.long_live_section(later)
    assert (
        "- 2026-11-22 04:53 +0000 (27 min, from an ipykernel): mlp 0.981 (0.966-0.994) [A/A 0.991] "
        "(read from that session's log)"
    ) in text


def test_long_live_runs_of_the_same_code_are_pooled_again(tmp_path: Path) -> None:
    """Each run keeps its cycles in the record; a new run is pooled with the earlier runs of the same
    dtwork package tree, driven from the same place on as many ranks, and with no other."""
    from benchmarks import report
    from benchmarks.live import brief, earlier_code, earlier_runs, pool, same_code

    def result(
        started: str, pairs: list[float], tree: str, where: str = "ipykernel", ranks: int = 2
    ) -> dict[str, Any]:
        run = {
            "pair_ratios": pairs,
            "on_total": 1.0,
            "off_total": 1.0,
            "ratio": pairs[0],
            "ctx_log_ms": 0.02,
            "cpu": {
                "pair_ratios": [x + 0.001 for x in pairs],
                "on_total": 1.0,
                "off_total": 1.0,
                "ms_per_step": {"on_kernel": 0.3},
            },
        }
        return {
            "command": "python -m benchmarks.live --kernel",
            "started": started,
            "duration_s": 600.0,
            "dtwork_tree": tree,
            "driven_from": where,
            "ranks": ranks,
            "runs": [run],
            "pooled": {"mlp": {"ab": pool([run])}},
        }

    path = tmp_path / "live.json"
    for r in (
        result("a", [0.97, 0.98], "t1"),
        result("a2", [0.96], "t1"),
        result("b", [0.99, 1.0], "t2"),
        result("c", [0.5], "t2", "plain process"),
        result("d", [0.4], "t2", ranks=1),
    ):
        path.write_text(json.dumps({**r, "earlier": earlier_runs(path)}))
    assert brief(json.loads(path.read_text()))["pooled"]["mlp"]["ab"]["pair_ratios"] == [0.4]  # cycles kept
    latest = {**result("e", [1.01, 1.02, 0.995], "t2"), "earlier": earlier_runs(path)}
    same = same_code(latest)
    assert same is not None and same["started"] == [
        "b",
        "e",
    ]  # not t1's, not the plain process's, not 1 rank's
    mlp = same["pooled"]["mlp"]["ab"]
    assert (mlp["runs"], mlp["cycles"]) == (2, 5) and mlp["ratio"] == pytest.approx(1.0)
    assert mlp["cpu_ratio"] == pytest.approx(1.001)
    assert same_code({**latest, "dtwork_tree": "t2+"}) is None  # changed code is nobody's
    assert same_code({**latest, "dtwork_tree": "t9"}) is None
    text = report.long_live_section({**latest, "same_code": same})
    assert "**Every run of this dtwork code** (package tree t2; ipykernel, 2 ranks)" in text
    assert "| mlp | 2 | 5 | 1.000 |" in text
    assert "- d (10 min, from an ipykernel, 1 rank): mlp 0.400" in text
    assert "On one rank the same code leaves this 2-core machine a core for the kernel" in text
    assert "(d, from an ipykernel): mlp 0.400" in text
    # a new tree does not hide what the runs of earlier code read together: t1's two runs, not the lone ones
    assert [(g["dtwork_tree"], g["started"]) for g in earlier_code(latest)] == [("t1", ["a", "a2"])]
    assert (
        "**Earlier dtwork code** (package tree t1; ipykernel, 2 ranks), its cycles pooled: the 2 runs started a, a2"
        in text
    )
    assert "| mlp | 2 | 3 | 0.970 |" in text
    newer = {**result("f", [1.0], "t3"), "earlier": [*latest["earlier"], brief(latest)]}
    assert [g["dtwork_tree"] for g in earlier_code(newer)] == ["t2", "t1"]  # the latest group first
    assert "On one rank dtwork's code of then (package tree t2) leaves" in report.long_live_section(newer)
    # a one-rank run shown first names the latest run on two ranks, which fill the cores
    alone = {**result("g", [0.9], "t3", ranks=1), "earlier": [*newer["earlier"], brief(newer)]}
    text = report.long_live_section(alone)
    assert (
        "On 2 ranks the same code fills this machine's cores with ranks, the kernel sharing them (f, " in text
    )
    assert "On one rank" not in text
    # the target's words say when the interval cannot tell met from not met
    assert report.interval_verdict({"ratio": 0.995, "ci95": [0.98, 1.01]}) == (
        "**met** (within noise: the 95% interval spans the target)"
    )
    assert report.interval_verdict({"ratio": 0.985, "ci95": [0.975, 0.995]}) == (
        "**not met** (within noise: the 95% interval spans the target)"
    )
    assert report.interval_verdict({"ratio": 0.985, "ci95": [0.98, 0.989]}) == "**not met**"
    t1_row = next(line for line in text.splitlines() if line.startswith("| mlp | 2 | 3 | 0.970 |"))
    assert t1_row.endswith(">= 0.99: **not met** |")  # its interval lies below the target


def test_a_long_live_run_names_the_dtwork_code_it_measured() -> None:
    """The package tree names the dtwork code; a change under dtwork/ marks it (not a change elsewhere)."""
    import subprocess

    from benchmarks import live

    tree = live.dtwork_tree()
    if tree is None:
        pytest.skip("not a git checkout")
    root = Path(live.ROOT)
    expect = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD:dtwork"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", "dtwork"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert tree == expect + ("+" if dirty else "")
    assert (live.git_commit() or "").rstrip("+") == subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_long_live_windows_run_in_a_real_kernel_that_sends_the_dashboards_messages() -> None:
    """``python -m benchmarks.live --kernel``: dtwork driven from a real ipykernel, whose live dashboard's widget
    messages reach this process, while the kernel's switch turns the dashboard on and off at every window."""
    from benchmarks import report
    from benchmarks.live import pool, take_runs_in_a_kernel

    plan = {
        "kinds": ["mlp"],
        "window_steps": {"mlp": 10},
        "cycles_per_run": {"mlp": 2},
        "warmup": {"mlp": 5},
        "aa_every": 3,
    }
    runs, sent = take_runs_in_a_kernel(0.0, plan)  # one round: one A/B run of the MLP
    assert [(r["kind"], r["aa"], r["cycles"]) for r in runs] == [("mlp", False, 2)]
    assert runs[0]["switches"] == 4  # rank 0 told the kernel at each of the 4 windows
    assert runs[0]["cpu"]["ms_per_step"]["on_kernel"] > 0
    assert sent["messages"]["comm_open"] > 0  # the dashboard's widgets were made in the kernel...
    assert sent["messages"]["comm_msg"] > 0  # ...and their updates sent to, and read by, this client
    long = {
        "command": "python -m benchmarks.live --kernel",
        "started": "now",
        "duration_s": sent["seconds"],
        "driven_from": "ipykernel",
        "kernel": sent,
        "runs": runs,
        "pooled": {"mlp": {"ab": pool(runs)}},
    }
    text = report.long_live_section(long)
    assert f"({sent['messages']['comm_msg']:,} in all" in text and "| mlp | 1 | 2 |" in text


def test_widget_messages_counts_a_redraws_messages_in_a_real_kernel(tmp_path: Path) -> None:
    """``python -m benchmarks.widget_messages`` times redraws in this process and in a real ipykernel, whose
    client sees the widget messages each redraw sends (one per changed figure's restyle and more)."""
    from benchmarks import report, widget_messages

    assert widget_messages.main(["--redraws", "3", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "widget_messages.json").read_text())
    assert m["plain"]["redraws"] == m["kernel"]["redraws"] == 3
    assert m["plain"]["redraw_ms"] > 0 and m["kernel"]["redraw_ms"] > 0
    # the three base figures are rows of one widget: one restyle a redraw (one message); the header with both
    # ranks' bars is one more
    assert m["kernel"]["messages"] == 3 * (1 + 1)
    assert m["kernel"]["widgets_opened"] == 0  # built before the timed redraws
    (tmp_path / "results.json").write_text(json.dumps({"meta": {}}))
    text = report.widget_messages_section(report.load(tmp_path)["widget_messages"])
    assert "redrawn 3 times" in text and "2.0 widget messages a redraw" in text


def test_rank_log_times_ctx_log_on_a_cpu_rank(tmp_path: Path) -> None:
    """``python -m benchmarks.rank_log`` trains the MLP with and without ``ctx.log`` in one process and
    reports the difference per step; the benchmark page shows it."""
    from benchmarks import rank_log, report

    assert rank_log.main(["--rounds", "2", "--steps", "20", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "rank_log.json").read_text())
    assert m["rounds"] == 2 and len(m["cpu_diff_us"]) == 2
    assert m["off_us_per_step"] > 0 and m["on_us_per_step"] > 0 and m["wall_ratio"] > 0
    (tmp_path / "results.json").write_text(json.dumps({"meta": {}}))
    text = report.rank_log_section(report.load(tmp_path)["rank_log"])
    assert "2 pairs of 20-step windows" in text and "ctx.log(loss=loss)" in text
