"""Issue 36's phase: dtwork's adaptive batch against a grid of fixed batches, to a target validation loss.

Every arm runs ``benchmarks/adaptive_train.py`` unchanged (a small transformer on a seeded Markov chain
whose entropy rate is the best possible loss). The fixed batches (every global batch x learning rate of
the plan) run under torchrun, one launch per seed training the whole grid; the adaptive arm runs the same
script on warm dtwork ranks (``Cluster.run_script``). Seeds take turns: within a seed the two arms go
in an order rotated by seed, so that a slow minute hits both. One more fixed run estimates
B_simple at every evaluation (``probe``, in the first seed's launch), to check that the workload's critical batch grows 30x.

The best fixed batch is chosen after the fact (the grid's lowest median wall time to the target, an
oracle), and the adaptive arm is held to issue 36's gates against it.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.runners import TORCHRUN
from benchmarks.stats import median
from benchmarks.turns import rotate
from benchmarks.util import ROOT, log, silenced

if TYPE_CHECKING:
    from benchmarks.plan import Plan
    from dtwork import Cluster

SCRIPT = ROOT / "benchmarks" / "adaptive_train.py"
MIN_GROWTH, WALL_GATE, WALL_SEEDS, SAMPLES_GATE, COMPUTE_GATE = 30.0, 0.8, 4, 1.1, 1 / 3


def spec(plan: Plan, runs: list[dict[str, Any]], out: Path, target: float) -> dict:
    """The training script's spec: the runs, the data, the evaluation and the stop (the same for all)."""
    p = plan.adaptive
    keys = "train_sequences val_sequences probe_sequences eval_every cap_samples max_global_batch lr_rule"
    keys += " decide_every"
    return {"runs": runs, "out": str(out), "target": target, **{k: p[k] for k in keys.split()}}


def _torchrun(spec_: dict[str, Any], folder: Path, timeout: float) -> dict[str, Any]:
    path = folder / f"spec-{time.time_ns()}.json"
    path.write_text(json.dumps(spec_))
    proc = subprocess.run([*TORCHRUN, str(SCRIPT), str(path)], cwd=folder, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    out = Path(spec_["out"])
    if not out.exists():  # a failed teardown after the results keeps them
        raise RuntimeError(f"torchrun exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    res: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return res


def _on_dtwork(spec_: dict[str, Any], folder: Path, cluster: Cluster) -> dict[str, Any]:
    path = folder / f"spec-{time.time_ns()}.json"
    path.write_text(json.dumps(spec_))
    cluster.session.live = False  # the same script as under torchrun: no live view to draw
    with silenced():
        cluster.run_script(SCRIPT, [str(path)])
    out = Path(spec_["out"])
    res: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return res


def floor_and_target(plan: Plan) -> tuple[dict[str, float], float]:
    """The chain's entropy rate (exact) and the target: a fixed margin above it."""
    import importlib.util

    mod_spec = importlib.util.spec_from_file_location("adaptive_train", SCRIPT)
    assert mod_spec is not None and mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    _, _, rate = mod.chain_tables(**mod.CHAIN)
    return {"entropy_rate": rate}, rate + plan.adaptive["margin"]


def measure(plan: Plan, cluster: Cluster) -> dict[str, Any]:
    """B_simple's growth, then every seed: the grid under torchrun and the adaptive arm on dtwork."""
    p, t0 = plan.adaptive, time.perf_counter()
    floor, target = floor_and_target(plan)
    grid = [{"batch": b, "lr": lr} for b in p["batches"] for lr in p["lrs"]]
    start = {"batch": p["start_batch"], "lr": p["start_lr"], "adaptive": True}
    out: dict[str, Any] = dict(plan=p, target=target, floor=floor, b_simple=None, errors=[])
    out |= {"fixed": [], "adaptive": []}
    with tempfile.TemporaryDirectory(prefix="dtwork-bench-adaptive-") as name:
        folder = Path(name)
        with silenced():  # the ranks' GNS horizon, for runs of a few hundred steps
            cluster.configure({"gns": {"ema_decay": p["gns_ema_decay"]}})
        on_dtwork = partial(_on_dtwork, cluster=cluster)
        probe = {"batch": p["probe_batch"], "lr": p["probe_lr"], "seed": 0, "probe": True}
        for seed in range(p["seeds"]):
            fixed = [dict(r, seed=seed) for r in grid] + ([probe] if seed == 0 else [])  # one launch fewer
            arms = {"fixed": fixed, "adaptive": [dict(start, seed=seed)]}
            for arm in rotate(list(arms), seed):
                log(f"adaptive: seed {seed + 1}/{p['seeds']}, {arm} ({len(arms[arm])} runs)")
                s = spec(plan, arms[arm], folder / f"{arm}-{seed}.json", target)
                try:
                    how = {"fixed": partial(_torchrun, timeout=p["timeout_s"]), "adaptive": on_dtwork}
                    got = how[arm](s, folder)
                    out["floor"] |= got["floor"]
                    for r in got["runs"]:
                        if r.get("probe"):
                            out["b_simple"] = growth(r)
                        else:
                            out[arm].append(_brief(r))
                except Exception as exc:  # the other arm's numbers stay; the reason is published
                    out["errors"].append(f"seed {seed} {arm}: {type(exc).__name__}: {_last_line(exc)}")
                    log(f"adaptive: {arm} failed: {_first_line(exc)}")
    out["duration_s"] = time.perf_counter() - t0
    return out | summarize(out)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _last_line(exc: Exception) -> str:
    """The error's own line (a rank's traceback ends with it): what a table cell can hold."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip() and not ln.startswith("(")]
    return (lines or [type(exc).__name__])[-1][:300]


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    """A run as kept in results.json: counts to the target, totals, batch changes; not the whole curve."""
    keep = ("batch", "lr", "seed", "adaptive", "reached", "seconds", "steps", "samples", "total_seconds",
            "total_steps", "total_samples", "batches")  # fmt: skip
    return {k: run[k] for k in keep if k in run} | {"final_val_loss": run["curve"][-1][3]}


def growth(run: dict[str, Any]) -> dict[str, Any]:
    """B_simple at the first evaluation and where the run reached the target (or ended), and their ratio."""
    probes = [pr for pr in run["probes"] if pr["b_simple"] is not None]
    at = run["samples"] if run["reached"] else run["total_samples"]
    first = probes[0]
    last = max((pr for pr in probes if pr["samples"] <= at), key=lambda pr: pr["samples"])
    # near the target |G|^2 is small and its estimate noisy: the last three probes' median is the reading
    tail = [pr["b_simple"] for pr in probes if pr["samples"] <= at][-3:]
    end = median(tail) if all(math.isfinite(x) for x in tail) else math.inf
    ratio = end / first["b_simple"] if first["b_simple"] and end is not None else None
    rows = [[pr["samples"], pr["b_simple"], pr["trace_sigma"], pr["g2"]] for pr in probes]
    return dict(start=first["b_simple"], end=end, end_samples=last["samples"], growth=ratio,
                ok=ratio is not None and ratio >= MIN_GROWTH, probes=rows, reached=run["reached"])  # fmt: skip


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    """The best fixed batch (after the fact), the adaptive arm against it, and the gates."""
    configs: dict[tuple[int, float], list[dict[str, Any]]] = {}
    for run in r["fixed"]:
        configs.setdefault((run["batch"], run["lr"]), []).append(run)

    def med(runs: list[dict[str, Any]], key: str) -> float | None:
        """The median over seeds, a run that did not reach the target counting as infinitely slow."""
        vals = sorted(run[key] if run["reached"] else math.inf for run in runs)
        if not vals:
            return None
        mid = vals[(len(vals) - 1) // 2 : len(vals) // 2 + 1]
        return sum(mid) / len(mid) if all(math.isfinite(v) for v in mid) else math.inf

    table = []
    for (b, lr), runs in sorted(configs.items()):
        row = {"batch": b, "lr": lr, "runs": len(runs), "reached": sum(x["reached"] for x in runs)}
        row |= {k: med(runs, k) for k in ("seconds", "steps", "samples")}
        table.append(row | {"compute_s": sum(x["total_seconds"] for x in runs)})
    reachable = [row for row in table if row["seconds"] is not None and math.isfinite(row["seconds"])]
    best = min(reachable, key=lambda row: row["seconds"]) if reachable else None
    ad = r["adaptive"]
    out: dict[str, Any] = {"grid": table, "best": best}
    a_med = {k: med(ad, k) for k in ("seconds", "steps", "samples")} if ad else {}
    grid_compute, ad_compute = sum(row["compute_s"] for row in table), sum(x["total_seconds"] for x in ad)
    out["adaptive_summary"] = a_med | {"runs": len(ad), "reached": sum(x["reached"] for x in ad),
                                       "compute_s": ad_compute}  # fmt: skip
    gates: dict[str, Any] = {}
    if best and ad:
        per_seed = [x["seconds"] / best["seconds"] if x["reached"] else math.inf for x in ad]
        fast = sum(v <= WALL_GATE for v in per_seed)
        gates["wall"] = dict(per_seed=per_seed, seeds_met=fast, met=fast >= WALL_SEEDS)
        s = (a_med["samples"] / best["samples"]) if a_med.get("samples") is not None else None
        gates["samples"] = dict(ratio=s, met=s is not None and s <= SAMPLES_GATE)
        c = ad_compute / grid_compute if grid_compute else None
        gates["compute"] = dict(ratio=c, met=c is not None and c <= COMPUTE_GATE)
    out["gates"] = gates
    out["grid_compute_s"] = grid_compute
    return out
