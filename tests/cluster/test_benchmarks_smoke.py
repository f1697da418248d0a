"""The benchmark in smoke mode runs end to end and fills the page's tables; its statistics are right.

``python -m benchmarks --smoke`` runs a few steps of every measurement (cold start in fresh
processes, round trip, steps/s under every launcher, iteration latency, dtwork and torchrun
in turns, the GNS, live-view and hand-loop windows, a script re-run against torchrun, the kernel
with simulated ranks) and writes the tables of a copy of the page.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("mlp", "convnet")
TIMEOUT = 420  # a hang guard: the smoke run takes a minute or two on 2 cores


def _positive(x: Any, what: str) -> None:
    assert isinstance(x, (int, float)) and not isinstance(x, bool), f"{what}: {x!r} is not a number"
    assert math.isfinite(x) and x > 0, f"{what}: {x!r} is not finite and positive"


def _run_smoke(out: Path, doc: Path, state: Path, *more: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DTWORK_HOME": str(state / "home"), "DTWORK_STORE": str(state / "runs.sqlite")}
    cmd = [sys.executable, "-m", "benchmarks", "--smoke", "--out", str(out), "--doc", str(doc), *more]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


def test_smoke_run_measures_everything_and_fills_the_pages_tables(tmp_path: Path) -> None:
    out, doc = tmp_path / "bench", tmp_path / "benchmarks.md"
    shutil.copy(ROOT / "docs" / "benchmarks.md", doc)
    proc = _run_smoke(out, doc, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| issue | what | target | measured |" in proc.stdout

    r = json.loads((out / "results.json").read_text())
    plan = r["meta"]["plan"]
    assert r["meta"]["smoke"] is True and r["meta"]["command"].startswith("python -m benchmarks --smoke")
    cold = r["cold_start"]
    assert not cold["errors"], cold["errors"]
    for key in ("dtwork_s", "raw_ipyparallel_s", "raw_ipyparallel_ddp_s"):
        _positive(cold[key]["median"], f"cold_start.{key}")
    for key in ("dtwork_quiet_s", "raw_px_s"):
        _positive(r["round_trip"][key]["median"], f"round_trip.{key}")

    tp, lat = r["throughput"], r["iteration_latency"]
    assert not tp["errors"] and not lat["errors"], (tp["errors"], lat["errors"])
    for alt in ("dtwork", "dtwork_steps", "raw_ipyparallel", "torchrun"):
        for kind in KINDS:
            _positive(tp["ratio_vs_torchrun"][alt][kind], f"ratio_vs_torchrun.{alt}.{kind}")
        _positive(lat[alt]["wall_s"]["median"], f"iteration_latency.{alt}")
        row = r["alternatives"][alt]
        _positive(row["cold_start_s"], f"{alt} cold start")
        _positive(row["iteration_latency_s"], f"{alt} iteration latency")
    for alt in ("accelerate", "fabric"):  # optional: measured, or skipped with the reason
        row = r["alternatives"][alt]
        assert row["skipped"].startswith("skipped:") if "skipped" in row else row["available"], row

    turns = r["turns"]
    assert turns["errors"] == [], turns["errors"]
    for kind in KINDS:
        t = turns[kind]
        assert (t["blocks"], t["cycles"]) == (1, plan["turn_cycles"][kind])
        _positive(t["ratio"], f"turns.{kind}")
        g = r["gns_interleaved"][kind]
        assert g["cycles"] == plan["gns_cycles"][kind] and g["steps_per_window"] == 8  # gns.every 1 (default)
        _positive(g["ratio"], f"gns.{kind}")
        lv = r["live_interleaved"][kind]
        assert (lv["cycles"], lv["steps_per_window"]) == (
            plan["live_cycles"][kind],
            plan["live_window"][kind],
        )
        assert lv["switches"] == 2 * lv["cycles"] and lv["aa"] is False  # the kernel heard every window
        _positive(lv["cpu"]["ratio"], f"live.{kind} CPU")

    for arm in ("wrap", "steps"):  # the hand loop against plain DDP, windows alternating
        h = r["handloop"][arm]
        assert (h["cycles"], h["steps_per_window"]) == (plan["hand_cycles"], plan["hand_window"])
        _positive(h["ratio"], f"handloop.{arm}")
    rerun = r["script_rerun"]
    _positive(rerun["seconds"]["dtwork"]["median"], "script re-run")
    _positive(rerun["speedup"], "script re-run speedup")
    assert [x["ranks"] for x in r["kernel_scale"]] == plan["scale_ranks"]
    _positive(r["kernel_scale"][0]["cpu_share"], "kernel CPU")
    fs = r["fsdp"]  # one transformer under DDP and FSDP in turns: steps/s and what a rank holds
    for strategy in ("ddp", "fsdp"):
        _positive(fs[strategy]["steps_per_s"]["median"], f"fsdp.{strategy}")
    held = {k: fs[k]["memory"]["param_bytes"] for k in ("ddp", "fsdp")}
    assert held["fsdp"] * 2 == held["ddp"]  # half the model on each rank

    ids = [t["id"] for t in r["targets"]]
    assert ids == ["2a", "47-ratio", "47-attach", "2b", "2c-mlp", "2c-mlp-runs", "2c-convnet", "2c-convnet-runs", "2d", "3-mlp",
                   "3-convnet", "4-mlp", "4-convnet", "22-script", "22-wrap", "22-steps", "25-cpu",
                   "25-redraw", "8-time"]  # fmt: skip
    for t in r["targets"]:
        _positive(t["measured"], f"target {t['id']}")
        assert isinstance(t["met"], bool)
    assert next(t for t in r["targets"] if t["id"] == "2c-mlp")["measured"] == turns["mlp"]["ratio"]

    # the tables hold this run; the hand-written prose and the long run's table stay as they were
    page, before = doc.read_text(), (ROOT / "docs" / "benchmarks.md").read_text()
    assert "| command | `python -m benchmarks --smoke" in page
    assert f"| 2 | {r['targets'][0]['what']} | < 1.0 |" in page
    assert (
        page.split("## Headline numbers")[1].split("<!--")[0]
        == before.split("## Headline numbers")[1].split("<!--")[0]
    )
    long = "<!-- generated: live-long -->"
    assert page.split(long)[1].split("<!-- end")[0] == before.split(long)[1].split("<!-- end")[0]
    assert "| hand loop + dtwork's live view (ctx.wrap) | 2 |" in page
    assert "| 4 | " in page.split("<!-- generated: kernel-scale -->")[1]
    assert "| fsdp ÷ ddp | " in page.split("<!-- generated: fsdp -->")[1]


def test_one_phase_replaces_only_its_own_results(tmp_path: Path) -> None:
    """``--only`` runs the phases named and keeps every other phase of results.json as it was."""
    out, doc = tmp_path / "bench", tmp_path / "benchmarks.md"
    out.mkdir()
    shutil.copy(ROOT / "benchmarks" / "results" / "results.json", out / "results.json")
    shutil.copy(ROOT / "docs" / "benchmarks.md", doc)
    before = json.loads((out / "results.json").read_text())
    proc = _run_smoke(out, doc, tmp_path, "--only", "kernel_scale")
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((out / "results.json").read_text())
    assert [x["ranks"] for x in r["kernel_scale"]] == [4] != [x["ranks"] for x in before["kernel_scale"]]
    assert r["turns"] == before["turns"] and r["meta"]["started"] == before["meta"]["started"]
    assert r["meta"]["phases"]["kernel_scale"]["command"].endswith("--only kernel_scale")
    assert [t["id"] for t in r["targets"]] == [t["id"] for t in before["targets"]]
    assert "| 4 | " in doc.read_text().split("<!-- generated: kernel-scale -->")[1]


def test_the_long_run_drives_a_real_kernel_that_imports_the_benchmarks() -> None:
    """``--live`` runs its windows inside an ipykernel started in the repository, whose messages it counts."""
    from benchmarks.util import ROOT as BENCH_ROOT
    from benchmarks.util import Kernel

    code = "import sys, json\nimport benchmarks.windows\nprint('hello', file=sys.stderr)\n"
    code += "print('RESULT', json.dumps(41 + 1))\n"
    with Kernel(BENCH_ROOT) as kernel:
        value, counts = kernel.run(code, timeout=120)
    assert value == 42
    assert counts["stream"] >= 2 and counts["status"] >= 2


def test_the_adaptive_and_search_phases_run_both_arms_and_write_their_tables(tmp_path: Path) -> None:
    """``--only adaptive,search`` (the two opt-in phases with clusters, in one run: one start of the
    suite). Adaptive: the fixed grid under torchrun, the adaptive arm on warm ranks, the B_simple
    probe. Search: ASHA on 2 groups of 2 ranks against the same trials one after another."""
    out, doc = tmp_path / "bench", tmp_path / "benchmarks.md"
    shutil.copy(ROOT / "docs" / "benchmarks.md", doc)
    proc = _run_smoke(out, doc, tmp_path, "--only", "adaptive,search")
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((out / "results.json").read_text())
    a, plan = r["adaptive"], r["meta"]["plan"]["adaptive"]
    assert a["errors"] == [], a["errors"]
    assert [(x["batch"], x["lr"], x["seed"]) for x in a["fixed"]] == [(b, 0.003, 0) for b in plan["batches"]]
    assert [(x["adaptive"], x["seed"]) for x in a["adaptive"]] == [(True, 0)]
    for run in a["fixed"] + a["adaptive"]:  # to the sample cap (the smoke target is out of reach)
        assert run["total_samples"] >= plan["cap_samples"] and run["total_steps"] > 0, run
        _positive(run["total_seconds"], "training seconds")
    # the probe estimated B_simple at every evaluation, from the first to the cap
    probes = a["b_simple"]["probes"]
    assert [p[0] for p in probes][:1] == [0] and probes[-1][0] >= plan["cap_samples"]
    assert len(probes) == plan["cap_samples"] // plan["eval_every"] + 1
    _positive(a["b_simple"]["start"], "B_simple at the start")
    assert a["floor"]["entropy_rate"] == pytest.approx(a["target"] - plan["margin"])
    assert [t["id"] for t in r["targets"]] == ["36-bsimple"]  # no run reached the target: no gates
    page = doc.read_text().split("<!-- generated: adaptive -->")[1].split("<!-- end: adaptive -->")[0]
    assert "| adaptive from 32 (max 64) | 0.003 | 0/1 | not reached |" in page
    assert "| 64 | 0.003 | 0/1 | not reached |" in page and "grows at least 30x" in page
    # the search phase: both arms drew the same trials; ASHA stopped some and trained fewer batches
    s, splan = r["search"], r["meta"]["plan"]["search"]
    assert s["errors"] == [] and s["same_trials"] is True
    (asha,), (seq,) = s["arms"]["asha"], s["arms"]["sequential"]
    assert len(asha["statuses"]) == len(seq["statuses"]) == splan["trials"]
    assert seq["statuses"] == ["completed"] * splan["trials"]
    assert (
        "stopped" in asha["statuses"]
        and asha["batches"] < seq["batches"] == splan["trials"] * splan["length"]
    )
    for run in (asha, seq):
        _positive(run["wall_s"], "a search's wall time")
        _positive(run["to_best_s"], "time to the best trial")
        assert run["to_best_s"] <= run["wall_s"]
    page = doc.read_text().split("<!-- generated: search -->")[1].split("<!-- end: search -->")[0]
    assert "| adaptive_asha on groups | 1 |" in page and "Both arms drew the same trials" in page
