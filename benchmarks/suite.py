"""The measurements in their order, side by side on one machine, and the results dictionary.

Alternatives take turns inside every repetition (the order rotates), so that a slow minute caused by
something else on the machine hits them all alike; ratios are taken between neighbours.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from benchmarks import live, windows
from benchmarks import workload as W
from benchmarks.coldstart import ColdStarts
from benchmarks.runners import (
    DtworkRunner,
    LaunchWorkerRunner,
    RawIpyparallelRunner,
    TorchrunRunner,
    missing,
)
from benchmarks.stats import blocks_summary, bootstrap_ci, median, ratio, summarize
from benchmarks.turns import Turns, run_in_turns
from benchmarks.util import git_commit, log, machine, now, versions

KINDS = W.KINDS
OPTIONAL = ("accelerate", "fabric")


def _kinds(mlp: int, convnet: int) -> Any:
    return field(default_factory=lambda: {"mlp": mlp, "convnet": convnet})


@dataclass
class Plan:
    """How much of everything to run: the full run, or ``--smoke`` (a few steps of everything)."""

    smoke: bool = False
    coldstart_reps: int = 3
    round_trips: int = 30
    throughput_reps: int = 4
    warmup: dict[str, int] = _kinds(10, 3)
    steps: dict[str, int] = _kinds(250, 50)  # 2-3 s: shorter runs measure scheduling more than training
    latency_reps_inprocess: int = 5
    latency_reps_relaunch: int = 3
    window_warmup: dict[str, int] = _kinds(30, 8)  # covers the live view's first draw
    gns_cycles: dict[str, int] = _kinds(160, 40)
    live_window: dict[str, int] = _kinds(180, 44)  # about 2 s: four redraws
    live_cycles: dict[str, int] = _kinds(30, 20)
    turn_blocks: int = 6
    turn_steps: dict[str, int] = _kinds(30, 8)
    turn_cycles: dict[str, int] = _kinds(12, 8)

    @classmethod
    def smoke_plan(cls) -> Plan:
        """A step or two of everything, once: it checks that everything runs."""
        per_kind = (
            "warmup steps window_warmup gns_cycles live_window live_cycles turn_steps turn_cycles".split()
        )
        once = (
            "coldstart_reps throughput_reps latency_reps_inprocess latency_reps_relaunch turn_blocks".split()
        )
        return cls(
            True, **dict.fromkeys(once, 1), round_trips=3, **dict.fromkeys(per_kind, {"mlp": 2, "convnet": 1})
        )


@contextlib.contextmanager
def _record(errors: dict[str, str], name: str) -> Iterator[None]:
    """Keep a launcher's failure as its error, so that the run goes on without it."""
    try:
        yield
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"


class Suite:
    """The runners, started once, and one method per measurement."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.dt = DtworkRunner()
        self.raw = RawIpyparallelRunner()
        self.torchrun = TorchrunRunner()
        self.optional: dict[str, LaunchWorkerRunner] = {}
        self.skipped: dict[str, str] = {}

    def start(self) -> None:
        """Both clusters at once, to save wall time (cold start is measured apart, in fresh kernels)."""
        log("starting the dtwork cluster and the raw ipyparallel cluster")
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(self.dt.start), pool.submit(self.raw.start)]:
                started.result()
        for name in OPTIONAL:  # one at a time: their import is part of their cold start
            why = missing(name)
            if why is None:
                try:
                    self.optional[name] = LaunchWorkerRunner(name)
                except RuntimeError as exc:
                    why = f"skipped: cannot start ({exc})"
            if why is not None:
                self.skipped[name] = why
                log(f"{name}: {why}")
        log("setup cells (model and data stay on the ranks)")
        self.dt.setup()
        self.raw.setup()

    def stop(self) -> None:
        for r in [*self.optional.values(), self.torchrun]:
            with contextlib.suppress(Exception):
                r.stop()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda r: r.stop(), (self.dt, self.raw)))

    def relaunchers(self) -> dict[str, TorchrunRunner | LaunchWorkerRunner]:
        return {"torchrun": self.torchrun, **self.optional}

    def round_trip(self) -> dict[str, Any]:
        log("round trip of a trivial cell")
        for _ in range(2):  # warm the paths
            self.dt.round_trip()
            self.raw.round_trip()
        dt: list[float] = []
        raw: list[float] = []
        pair = [(self.dt.round_trip, dt), (self.raw.round_trip, raw)]
        for i in range(self.plan.round_trips):
            for measure, into in pair if i % 2 == 0 else pair[::-1]:
                into.append(measure())
        return {
            "dtwork_quiet_s": summarize(dt),
            "raw_px_s": summarize(raw),
            "ratio_quiet": ratio(median(dt), median(raw)),
            "ratio_quiet_ci95": bootstrap_ci(dt, raw),
        }

    def throughput(self) -> dict[str, Any]:
        """Whole runs of every launcher in turn, each repetition in a rotated order."""
        p = self.plan

        def in_cells(measure: Callable[[str, int, int], float]) -> Callable[[], dict[str, float]]:
            return lambda: {k: measure(k, p.warmup[k], p.steps[k]) for k in KINDS}

        measure = {
            "dtwork": in_cells(self.dt.throughput),
            "dtwork_steps": in_cells(self.dt.throughput_steps),
            "raw_ipyparallel": in_cells(self.raw.throughput),
            **{n: partial(r.throughput_many, p.warmup, p.steps) for n, r in self.relaunchers().items()},
        }
        runs: dict[str, dict[str, list[float | None]]] = {a: {k: [] for k in KINDS} for a in measure}
        errors: dict[str, str] = {}
        names = list(measure)
        for rep in range(p.throughput_reps):
            log(f"steps/s, repetition {rep + 1}/{p.throughput_reps}")
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                res: dict[str, float] = {}
                if name not in errors:
                    with _record(errors, name):
                        res = measure[name]()
                for k in KINDS:  # a failed run stays a gap, so that repetitions stay aligned
                    runs[name][k].append(res.get(k))

        def pairs(a: str, k: str) -> list[float]:
            return [x / y for x, y in zip(runs[a][k], runs["torchrun"][k], strict=True) if x and y]

        out: dict[str, Any] = {"reps": p.throughput_reps, "errors": errors}
        for a in measure:
            out[a] = {k: summarize([x for x in runs[a][k] if x is not None]) for k in KINDS}
        # the headline: the median over repetitions of the ratio within a repetition
        out["ratio_vs_torchrun"] = {a: {k: median(pairs(a, k)) for k in KINDS} for a in measure}
        out["ratio_vs_torchrun_ci95"] = {a: {k: bootstrap_ci(pairs(a, k)) for k in KINDS} for a in measure}
        return out

    def turns(self) -> dict[str, Any]:
        """dtwork and torchrun in turns; each block a fresh launch of both, the interval over blocks."""
        p = self.plan
        blocks: list[dict[str, list[float]]] = []
        errors: list[str] = []
        for b in range(p.turn_blocks):
            log(f"dtwork and torchrun in turns, block {b + 1}/{p.turn_blocks}")
            try:
                out = self._turn_block(b)
            except Exception as exc:  # the run goes on without more blocks; the reason is kept
                out = {"error": f"{type(exc).__name__}: {exc}"}
            if out.get("error") or any(k not in out for k in KINDS):
                errors.append(f"block {b + 1}: {out.get('error') or 'ended early'}")
                break
            blocks.append({k: out[k]["seconds"] for k in KINDS})
        res: dict[str, Any] = {"errors": errors}
        for k in KINDS:
            if blocks:
                res[k] = blocks_summary([blk[k] for blk in blocks], "dtwork", "torchrun", p.turn_steps[k])
        return res

    def _turn_block(self, b: int) -> dict[str, Any]:
        """Fresh launches of both (the first block reuses the cluster); dtwork's cell runs in this thread."""
        if b > 0:
            assert self.dt.cluster is not None
            self.dt.cluster.restart()
            self.dt.setup()
        turns = Turns({"dtwork": 2, "torchrun": 2})
        proc = self.torchrun.serve(turns.port, KINDS)
        plan = {k: (self.plan.turn_steps[k], self.plan.turn_cycles[k]) for k in KINDS}
        try:
            thread, out = run_in_turns(turns, plan, seed=b, alive=lambda: proc.poll() is None)
            try:
                self.dt.run(W.TURNS_CELL.format(port=turns.port))
            finally:
                turns.stop()
                thread.join()
        finally:
            turns.stop()
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        return out

    def iteration_latency(self, kind: str = "mlp") -> dict[str, Any]:
        """A changed cell on ranks that keep their state, against a relaunch for the launchers that must."""
        p = self.plan
        self.dt.run(W.LATENCY_STEPS_SETUP.format(kind=kind))
        cells = {
            "dtwork": partial(self.dt.iterate, kind),
            "dtwork_steps": partial(self.dt.seconds, W.CHANGED_STEPS_CELL),
            "raw_ipyparallel": partial(self.raw.iterate, kind),
        }
        for cell in cells.values():  # warm the paths
            cell()
        relaunchers = self.relaunchers()
        res: dict[str, list[float]] = {n: [] for n in [*cells, *relaunchers]}
        first: dict[str, list[float]] = {n: [] for n in relaunchers}
        errors: dict[str, str] = {}
        for rep in range(max(p.latency_reps_inprocess, p.latency_reps_relaunch)):
            log(f"iteration latency, repetition {rep + 1}")
            for name, cell in cells.items() if rep < p.latency_reps_inprocess else ():
                res[name].append(cell())
            for name, runner in relaunchers.items() if rep < p.latency_reps_relaunch else ():
                if name not in errors:
                    with _record(errors, name):
                        wall, first_step = runner.iterate(kind)
                        res[name].append(wall)
                        first[name].append(first_step)
        self.dt.run(W.LATENCY_STEPS_TEARDOWN)
        out: dict[str, Any] = {"kind": kind, "errors": errors}
        for name, vals in res.items():
            out[name] = {
                "wall_s": summarize(vals),
                **({"first_step_s": summarize(first[name])} if name in first else {}),
            }
        d = median(res["dtwork"])
        out["speedup_vs"] = {n: ratio(median(v), d) for n, v in res.items() if not n.startswith("dtwork")}
        out["speedup_vs_torchrun_first_step"] = ratio(median(first["torchrun"]), d)
        out["speedup_vs_torchrun_ci95"] = bootstrap_ci(res["torchrun"], res["dtwork"])
        return out

    def gns(self) -> dict[str, Any]:
        out = {}
        for k in KINDS:
            log(f"GNS on/off windows inside one loop ({k}, {self.plan.gns_cycles[k]} cycles)")
            out[k] = windows.gns(self.dt, k, self.plan.window_warmup[k], self.plan.gns_cycles[k])
        return out

    def live(self) -> dict[str, Any]:
        log("live view + run store on/off windows inside one loop")
        p = self.plan
        return {
            r["kind"]: r for r in live.take_runs(self.dt, 0, p.live_window, p.live_cycles, p.window_warmup)
        }


def run(plan: Plan, command: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {
            "command": command,
            "smoke": plan.smoke,
            "started": now(),
            "dtwork_commit": git_commit(),
            "machine": machine(),
            "versions": versions(),
            "plan": asdict(plan),
        }
    }
    cold = ColdStarts(plan.coldstart_reps)
    suite = Suite(plan)
    try:
        cold.start(sequential=not plan.smoke)
        if not plan.smoke:
            results["cold_start"] = cold.results()
        suite.start()
        results["round_trip"] = suite.round_trip()
        results["throughput"] = suite.throughput()
        results["iteration_latency"] = suite.iteration_latency()
        results["turns"] = suite.turns()
        results["gns_interleaved"] = suite.gns()
        results["live_interleaved"] = suite.live()
        if plan.smoke:
            results["cold_start"] = cold.results()
        results["alternatives"] = alternatives(results, suite)
    finally:
        log("stopping clusters")
        cold.abort()
        suite.stop()
    results["meta"]["duration_s"] = time.perf_counter() - t0
    results["meta"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["targets"] = targets(results)
    return results


def alternatives(results: dict[str, Any], suite: Suite) -> dict[str, Any]:
    """One row per launcher: steps/s, cold start from a fresh kernel, iteration latency; or why skipped."""
    tp, lat, cold = results["throughput"], results["iteration_latency"], results["cold_start"]
    imp = cold["import_s"]

    def plus(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a + b

    cold_by = {
        "dtwork": plus(imp["dtwork"], cold["dtwork_s"]["median"]),
        "raw_ipyparallel": plus(imp["ipyparallel"], cold["raw_ipyparallel_ddp_s"]["median"]),
        "torchrun": median(suite.torchrun.cold_starts),
        **{n: plus(r.import_s, median(r.cold_starts)) for n, r in suite.optional.items()},
    }
    cold_by["dtwork_steps"] = cold_by["dtwork"]
    rows: dict[str, Any] = {a: {"available": False, "skipped": why} for a, why in suite.skipped.items()}
    for a in tp["ratio_vs_torchrun"]:
        err = tp["errors"].get(a) or lat["errors"].get(a)
        rows[a] = {
            "available": err is None,
            "steps_per_s": {k: tp[a][k]["median"] for k in KINDS},
            "ratio_vs_torchrun": tp["ratio_vs_torchrun"][a],
            "cold_start_s": cold_by.get(a),
            "iteration_latency_s": lat[a]["wall_s"]["median"],
            **({"error": err} if err else {}),
        }
    return rows


def _target(
    tid: str, issue: int, what: str, measured: float | None, target: str, ci95: list[float] | None
) -> dict[str, Any]:
    """One target: ``met`` by the reading, ``conclusive`` when its 95% interval lies on one side."""
    op, value = target.split()
    t = float(value)
    met = None if measured is None else {"<": measured < t, "<=": measured <= t, ">=": measured >= t}[op]
    conclusive = None
    if ci95:
        lo, hi = ci95
        conclusive = (hi <= t or lo > t) if op.startswith("<") else (lo >= t or hi < t)
    return dict(
        id=tid,
        issue=issue,
        what=what,
        measured=measured,
        target=target,
        met=met,
        ci95=ci95,
        conclusive=conclusive,
    )


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    cold, rt, tp, lat = r["cold_start"], r["round_trip"], r["throughput"], r["iteration_latency"]
    same = "steps/s under %%dtrain / torchrun --nproc_per_node=2, same code"
    rows: list[tuple[Any, ...]] = [
        ("2a", 2, "cold start to process group ready, N=2: dtwork / raw ipyparallel's own start",
         cold["ratio_vs_raw_ipyparallel"], "< 1.0", cold["ratio_vs_raw_ipyparallel_ci95"]),
        ("2b", 2, "round trip of a trivial %%dtrain cell / raw %px", rt["ratio_quiet"], "<= 1.2",
         rt["ratio_quiet_ci95"]),
    ]  # fmt: skip
    for k in KINDS:
        if k in r["turns"]:
            t = r["turns"][k]
            rows.append((f"2c-{k}", 2, f"{same}, in turns ({k})", t["ratio"], ">= 0.98", t["ci95"]))
        v, ci = tp["ratio_vs_torchrun"]["dtwork"][k], tp["ratio_vs_torchrun_ci95"]["dtwork"][k]
        rows.append((f"2c-{k}-runs", 2, f"{same}, whole runs in turn ({k})", v, ">= 0.98", ci))
    rows.append(
        ("2d", 2, "iteration latency: torchrun relaunch / changed %%dtrain cell (x faster)",
         lat["speedup_vs"]["torchrun"], ">= 10", lat["speedup_vs_torchrun_ci95"])
    )  # fmt: skip
    for k, v in r["live_interleaved"].items():
        what = f"throughput, live view + run store on / off, windows alternating inside one loop ({k})"
        rows.append((f"3-{k}", 3, what, v["ratio"], ">= 0.99", v["ci95"]))
    for k, v in r["gns_interleaved"].items():
        what = f"step throughput, GNS measurement on / off, windows alternating inside one loop ({k})"
        rows.append((f"4-{k}", 4, what, v["ratio"], ">= 0.97", v["ci95"]))
    limit = "< 120" if r["meta"]["smoke"] else "< 900"
    rows.append(
        ("8-time", 8, "the benchmark's wall time on this machine (s)", r["meta"]["duration_s"], limit, None)
    )
    return [_target(*row) for row in rows]
