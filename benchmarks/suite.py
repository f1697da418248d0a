"""The measurements (phases) in their order, side by side on one machine, and the targets. Alternatives
take turns inside every repetition, so that a slow minute hits them all alike.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import adaptive, kernel_scale, long_run, windows
from benchmarks import fsdp as fsdp_phase
from benchmarks import search as search_phase
from benchmarks import workload as W
from benchmarks.plan import Plan
from benchmarks.runners import TORCHRUN, ColdStarts, DtworkRunner, LaunchWorkerRunner, missing
from benchmarks.runners import RawIpyparallelRunner as Raw
from benchmarks.runners import TorchrunRunner as Torchrun
from benchmarks.stats import blocks_summary, bootstrap_ci, median, ratio, summarize
from benchmarks.turns import Turns, rotate, run_in_turns
from benchmarks.util import ROOT, git_commit, log, machine, now, silenced, versions

KINDS = W.KINDS
OPTIONAL = ("accelerate", "fabric")
SCRIPT = ROOT / "tests" / "fixtures" / "ddp_tutorial.py"  # the PyTorch DDP tutorial's structure
PHASES = "cold_start round_trip throughput iteration_latency turns gns_interleaved live_interleaved handloop"
PHASES += " script_rerun kernel_scale fsdp adaptive long_run search"
OPT_IN = ("adaptive", "long_run", "search")  # long on their own: run only when named (--only adaptive)
# start their own processes or none: no suite clusters
CLUSTERLESS = {"cold_start", "kernel_scale", "long_run", "search"}


def _guarded(errors: dict[str, str], name: str, measure: Callable[[], Any]) -> Any:
    """``measure()``, or {} once it failed: its error is kept, and the run goes on without it."""
    if name not in errors:
        try:
            return measure()
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    return {}


class Suite:
    """The runners, started once, and one method per measurement."""

    def __init__(self, plan: Plan) -> None:
        self.plan, self.dt, self.raw, self.torchrun = plan, DtworkRunner(), Raw(), Torchrun()
        self.optional, self.skipped = dict[str, LaunchWorkerRunner](), dict[str, str]()

    def start(self, raw: bool = True, optional: bool = True, setup: bool = True) -> None:
        """The clusters at once, to save wall time (cold start is measured apart, in fresh kernels)."""
        log("starting the clusters")
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(self.dt.start), *([pool.submit(self.raw.start)] if raw else [])]:
                started.result()
        for name in OPTIONAL if optional else ():  # one at a time: their import is part of their cold start
            if (why := missing(name)) is None:
                try:
                    self.optional[name] = LaunchWorkerRunner(name)
                except RuntimeError as exc:
                    why = f"skipped: cannot start ({exc})"
            if why is not None:
                self.skipped[name] = why
                log(f"{name}: {why}")
        self.relaunchers: dict[str, Any] = {"torchrun": self.torchrun, **self.optional}
        if not setup:  # the phases asked for bring their own workload
            return
        log("setup cells (model and data stay on the ranks)")
        self.dt.setup()
        if raw:
            self.raw.setup()

    def stop(self) -> None:
        for r in [*self.optional.values(), self.torchrun]:
            with contextlib.suppress(Exception):
                r.stop()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda r: r.stop(), (self.dt, self.raw)))

    def round_trip(self) -> dict[str, Any]:
        log("round trip of a trivial cell")
        for _ in range(2):  # warm the paths
            self.dt.round_trip()
            self.raw.round_trip()
        t = in_rotation({"dt": self.dt.round_trip, "raw": self.raw.round_trip}, self.plan.round_trips)
        ci = bootstrap_ci(t["dt"], t["raw"])
        ratio_quiet = ratio(median(t["dt"]), median(t["raw"]))
        # autoreload on and off in turns: each switch sends the ranks one message, before either cell
        session = self.dt.cluster.session if self.dt.cluster is not None else None
        switched = {}
        if session is not None:

            def with_reload(on: bool) -> float:
                session.autoreload = on
                return self.dt.round_trip()

            switched = in_rotation({"on": partial(with_reload, True), "off": partial(with_reload, False)},
                                   self.plan.round_trips)  # fmt: skip
            session.autoreload = True
        reload = {k: summarize(v) for k, v in switched.items()}
        if session is not None:  # the check itself, timed on the ranks: the slower rank's
            self.dt.run(W.RELOAD_CHECK_CELL.format(reps=10 * self.plan.round_trips), quiet=True)
            reload["rank_check_s"] = summarize(max(self.dt.pull("_reload_check_s"), key=median))
        if switched:
            reload["cost_ms"] = 1e3 * (median(switched["on"]) - median(switched["off"]))
            reload["ratio"], reload["ci95"] = ratio(median(switched["on"]), median(switched["off"])), bootstrap_ci(
                switched["on"], switched["off"])  # fmt: skip
        return dict(dtwork_quiet_s=summarize(t["dt"]), raw_px_s=summarize(t["raw"]), ratio_quiet=ratio_quiet,
                    ratio_quiet_ci95=ci, autoreload=reload)  # fmt: skip

    def throughput(self) -> dict[str, Any]:
        """Whole runs of every launcher in turn, each repetition in a rotated order."""
        p, errors = self.plan, dict[str, str]()

        def in_cells(measure: Callable[[str, int, int], float]) -> Callable[[], dict[str, float]]:
            return lambda: {k: measure(k, p.warmup[k], p.steps[k]) for k in KINDS}

        measure = {"dtwork": in_cells(self.dt.throughput), "dtwork_steps": in_cells(self.dt.throughput_steps)}
        measure["raw_ipyparallel"] = in_cells(self.raw.throughput)
        measure |= {n: partial(r.throughput_many, p.warmup, p.steps) for n, r in self.relaunchers.items()}
        log(f"steps/s, {p.throughput_reps} repetitions")
        res = in_rotation({n: partial(_guarded, errors, n, f) for n, f in measure.items()}, p.throughput_reps)
        # a failed run stays a gap, so that repetitions stay aligned
        runs = {a: {k: [r.get(k) for r in res[a]] for k in KINDS} for a in measure}

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
        p, blocks, errors = self.plan, list[dict[str, list[float]]](), list[str]()
        for b in range(p.turn_blocks):
            log(f"dtwork and torchrun in turns, block {b + 1}/{p.turn_blocks}")
            failed: dict[str, str] = {}  # the run goes on without more blocks; the reason is kept
            out = _guarded(failed, "error", partial(self._turn_block, b)) or failed
            if out.get("error") or any(k not in out for k in KINDS):
                errors.append(f"block {b + 1}: {out.get('error') or 'ended early'}")
                break
            blocks.append({k: out[k]["seconds"] for k in KINDS})
        res: dict[str, Any] = {"errors": errors}
        for k in KINDS if blocks else ():
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
        cells = {"dtwork": partial(self.dt.iterate, kind), "raw_ipyparallel": partial(self.raw.iterate, kind)}
        cells["dtwork_steps"] = partial(self.dt.seconds, W.CHANGED_STEPS_CELL)
        for cell in cells.values():  # warm the paths
            cell()
        res: dict[str, list[float]] = {n: [] for n in [*cells, *self.relaunchers]}
        first: dict[str, list[float]] = {n: [] for n in self.relaunchers}
        errors: dict[str, str] = {}
        for rep in range(max(p.latency_reps_inprocess, p.latency_reps_relaunch)):
            log(f"iteration latency, repetition {rep + 1}")
            for name, cell in cells.items() if rep < p.latency_reps_inprocess else ():
                res[name].append(cell())
            for name, runner in self.relaunchers.items() if rep < p.latency_reps_relaunch else ():
                if got := _guarded(errors, name, partial(runner.iterate, kind)):
                    res[name].append(got[0])
                    first[name].append(got[1])
        self.dt.run(W.LATENCY_STEPS_TEARDOWN)
        out: dict[str, Any] = {"kind": kind, "errors": errors}
        for name, vals in res.items():
            more = {"first_step_s": summarize(first[name])} if name in first else {}
            out[name] = {"wall_s": summarize(vals), **more}
        d = median(res["dtwork"])
        out["speedup_vs"] = {n: ratio(median(v), d) for n, v in res.items() if not n.startswith("dtwork")}
        out["speedup_vs_torchrun_first_step"] = ratio(median(first["torchrun"]), d)
        out["speedup_vs_torchrun_ci95"] = bootstrap_ci(res["torchrun"], res["dtwork"])
        return out

    def gns(self) -> dict[str, Any]:
        log("GNS on/off windows inside one loop")
        p = self.plan
        return {k: windows.gns(self.dt, k, p.window_warmup[k], p.gns_cycles[k]) for k in KINDS}

    def live(self) -> dict[str, Any]:
        log("live view + run store on/off windows inside one loop")
        p = self.plan
        runs = windows.take_runs(self.dt, 0, p.live_window, p.live_cycles, p.window_warmup)
        return {r["kind"]: r for r in runs}

    def handloop(self) -> dict[str, Any]:
        """The MLP hand loop with dtwork's view of it (ctx.wrap), or in ctx.steps, ÷ on a plain DDP model."""
        p = self.plan
        log(f"hand loop: live view and ctx.steps against plain DDP ({p.hand_cycles} cycles each)")
        hand = partial(windows.hand, self.dt, "mlp", p.hand_cycles, p.hand_window)
        return {arm: hand(arm) for arm in ("wrap", "steps")}

    def script_rerun(self) -> dict[str, Any]:
        """The DDP tutorial's script from scratch: ``Cluster.run_script`` on warm ranks ÷ torchrun."""
        p, cluster = self.plan, self.dt.cluster
        assert cluster is not None

        def args(f: str) -> list[str]:  # a fresh folder: no snapshot, so that every run trains from scratch
            return f"{p.rerun_epochs} 1000 --snapshot {f}/snap.pt --out {f}/final.pt".split()

        def warm() -> float:
            cluster.session.live = False
            with tempfile.TemporaryDirectory() as f, silenced():
                t0 = time.perf_counter()
                cluster.run_script(SCRIPT, args(f))
                return time.perf_counter() - t0

        def relaunch() -> float:
            for _ in range(3):  # ranks that abort at exit (tests/torchrun_ref.py) make a relaunch again
                with tempfile.TemporaryDirectory() as f:
                    t0, cmd = time.perf_counter(), [*TORCHRUN, str(SCRIPT), *args(f)]
                    if (proc := subprocess.run(cmd, cwd=f, capture_output=True, text=True)).returncode == 0:
                        return time.perf_counter() - t0
                    log(f"torchrun exited {proc.returncode}, reading left out: {proc.stderr.strip()[-300:]}")
            raise RuntimeError(f"torchrun exited {proc.returncode} three times:\n{proc.stderr[-3000:]}")

        log("an unchanged torchrun script: re-run on warm ranks and relaunched, in turns")
        first = warm()  # imports what the script imports
        s = in_rotation({"dtwork": warm, "torchrun": relaunch}, p.rerun_reps)
        out = dict(script=str(SCRIPT.relative_to(ROOT)), epochs=p.rerun_epochs, first_warm_run_s=first)
        out |= {"seconds": {k: summarize(v) for k, v in s.items()}}
        t, d = s["torchrun"], s["dtwork"]
        return out | {"speedup": ratio(median(t), median(d)), "speedup_ci95": bootstrap_ci(t, d)}

    def adaptive(self) -> dict[str, Any]:
        assert self.dt.cluster is not None
        return adaptive.measure(self.plan, self.dt.cluster)

    def kernel_scale(self) -> list[dict[str, Any]]:
        p, out = self.plan, []
        with tempfile.TemporaryDirectory(prefix="dtwork-kernel-scale-") as folder, kernel_scale.wired():
            for n in p.scale_ranks:
                log(f"the kernel with {n} simulated ranks ({p.scale_seconds:.0f} s)")
                out.append(kernel_scale.measure(n, p.scale_seconds, Path(folder)))
        return out

    def long_run(self) -> list[dict[str, Any]]:
        out = []
        for hours, ranks in self.plan.long_run:
            with tempfile.TemporaryDirectory(prefix="dtwork-long-run-") as folder:
                log(f"a {hours:g} h run of {ranks} simulated ranks through the store writer")
                out.append(long_run.measure(hours, ranks, Path(folder)))
        return out

    def search(self) -> dict[str, Any]:
        return search_phase.measure(self.plan)

    def fsdp(self) -> dict[str, Any]:
        p = self.plan
        log(f"a small transformer under DDP and FSDP, in turns ({p.fsdp_reps} each)")
        return fsdp_phase.measure(self.dt, 2, p.fsdp_steps, p.fsdp_reps)


def in_rotation(measure: dict[str, Callable[[], Any]], reps: int) -> dict[str, list[Any]]:
    """``reps`` readings of each, every repetition in a rotated order."""
    out: dict[str, list[Any]] = {n: [] for n in measure}
    for rep in range(reps):
        for name in rotate(list(measure), rep):
            out[name].append(measure[name]())
    return out


def run(plan: Plan, command: str, only: list[str] | None = None) -> dict[str, Any]:
    """Every phase (``only``: those) and the meta of the run."""
    phases, t0 = only or [p for p in PHASES.split() if p not in OPT_IN], time.perf_counter()
    meta = dict(command=command, smoke=plan.smoke, started=now(), dtwork_commit=git_commit())
    meta |= {"machine": machine(), "versions": versions(), "plan": asdict(plan)}
    results: dict[str, Any] = {"meta": meta}
    cold, suite = ColdStarts(plan.coldstart_reps), Suite(plan)
    try:
        if "cold_start" in phases:
            cold.start(sequential=not plan.smoke)
            if not plan.smoke:
                results["cold_start"] = cold.results()
        if set(phases) - CLUSTERLESS:
            raw = {"round_trip", "throughput", "iteration_latency"} & set(phases)
            setup = bool(set(phases) - CLUSTERLESS - set(OPT_IN))
            suite.start(raw=bool(raw), optional="throughput" in phases, setup=setup)
        for name in (n for n in phases if n != "cold_start"):
            try:
                results[name] = getattr(suite, name.removesuffix("_interleaved"))()
            except Exception as exc:  # the other phases' numbers stay: the run goes on without it
                log(f"{name} failed, left out of the results: {str(exc).splitlines()[0]}")
                meta.setdefault("failed", {})[name] = str(exc)[-3000:]
        if plan.smoke and "cold_start" in phases:
            results["cold_start"] = cold.results()
        if {"throughput", "iteration_latency", "cold_start"} <= set(results):
            results["alternatives"] = alternatives(results, suite)
    finally:
        log("stopping clusters")
        cold.abort()
        suite.stop()
    meta["duration_s"] = time.perf_counter() - t0
    meta["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def alternatives(results: dict[str, Any], suite: Suite) -> dict[str, Any]:
    """One row per launcher: steps/s, cold start from a fresh kernel, iteration latency; or why skipped."""
    tp, lat, cold = results["throughput"], results["iteration_latency"], results["cold_start"]
    imp = cold["import_s"]

    def plus(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a + b

    cold_by = {"dtwork": plus(imp["dtwork"], cold["dtwork_s"]["median"])}
    cold_by |= {"torchrun": median(suite.torchrun.cold_starts)}
    cold_by |= {n: plus(r.import_s, median(r.cold_starts)) for n, r in suite.optional.items()}
    cold_by |= {"raw_ipyparallel": plus(imp["ipyparallel"], cold["raw_ipyparallel_ddp_s"]["median"])}
    cold_by["dtwork_steps"] = cold_by["dtwork"]
    rows: dict[str, Any] = {a: {"available": False, "skipped": why} for a, why in suite.skipped.items()}
    for a in tp["ratio_vs_torchrun"]:
        err = tp["errors"].get(a) or lat["errors"].get(a)
        rows[a] = {"available": err is None, "steps_per_s": {k: tp[a][k]["median"] for k in KINDS}}
        rows[a] |= {"ratio_vs_torchrun": tp["ratio_vs_torchrun"][a], "cold_start_s": cold_by.get(a)}
        rows[a] |= {"iteration_latency_s": lat[a]["wall_s"]["median"], **({"error": err} if err else {})}
    return rows


def _target(tid: str, issue: int, what: str, measured: float | None, target: str, ci95: Any) -> dict:
    """One target: ``met`` by the reading, ``conclusive`` when its 95% interval lies on one side."""
    op, t = target.split()[0], float(target.split()[1])
    met = None if measured is None else {"<": measured < t, "<=": measured <= t, ">=": measured >= t}[op]
    conclusive = None
    if ci95:
        lo, hi = ci95
        conclusive = (hi <= t or lo > t) if op.startswith("<") else (lo >= t or hi < t)
    row = dict(id=tid, issue=issue, what=what, measured=measured, target=target, met=met, ci95=ci95)
    return row | {"conclusive": conclusive}


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of the phases that ``r`` holds."""
    same = "steps/s under %%dtrain / torchrun --nproc_per_node=2, same code"
    within = "windows alternating inside one loop"
    rows: list[tuple[Any, ...]] = []
    if c := r.get("cold_start"):
        what = "cold start to process group ready, N=2: dtwork / raw ipyparallel's own start"
        ci = c["ratio_vs_raw_ipyparallel_ci95"]
        rows.append(("2a", 2, what, c["ratio_vs_raw_ipyparallel"], "< 1.0", ci))
        if c.get("attach_vs_start") is not None:
            what = "a kept cluster taken up by a fresh process (attach) / a cold start, N=2"
            rows.append(("47-ratio", 47, what, c["attach_vs_start"], "<= 0.25", c["attach_vs_start_ci95"]))
            rows.append(
                ("47-attach", 47, "attach to a kept cluster, N=2 (s)", c["attach_s"]["median"], "<= 1", None)
            )
    if rt := r.get("round_trip"):
        what = "round trip of a trivial %%dtrain cell / raw %px"
        rows.append(("2b", 2, what, rt["ratio_quiet"], "<= 1.2", rt["ratio_quiet_ci95"]))
    for k in KINDS:
        if t := r.get("turns", {}).get(k):
            rows.append((f"2c-{k}", 2, f"{same}, in turns ({k})", t["ratio"], ">= 0.98", t["ci95"]))
        if tp := r.get("throughput"):
            v, ci = tp["ratio_vs_torchrun"]["dtwork"][k], tp["ratio_vs_torchrun_ci95"]["dtwork"][k]
            rows.append((f"2c-{k}-runs", 2, f"{same}, whole runs in turn ({k})", v, ">= 0.98", ci))
    if lat := r.get("iteration_latency"):
        what = "iteration latency: torchrun relaunch / changed %%dtrain cell (x faster)"
        rows.append(("2d", 2, what, lat["speedup_vs"]["torchrun"], ">= 10", lat["speedup_vs_torchrun_ci95"]))
    for key, tid, issue, what, goal in (
        ("live_interleaved", "3", 3, "throughput, live view + run store on / off", ">= 0.99"),
        ("gns_interleaved", "4", 4, "step throughput, GNS measurement on / off", ">= 0.97"),
    ):
        for k in KINDS:
            if v := r.get(key, {}).get(k):
                rows.append((f"{tid}-{k}", issue, f"{what}, {within} ({k})", v["ratio"], goal, v["ci95"]))
    if sr := r.get("script_rerun"):
        what = "an unchanged torchrun script: torchrun relaunch / re-run on warm ranks (x faster)"
        rows.append(("22-script", 22, what, sr["speedup"], ">= 10", sr["speedup_ci95"]))
    for arm, what in (("wrap", "the hand loop's live view (ctx.wrap)"), ("steps", "ctx.steps' bookkeeping")):
        if v := r.get("handloop", {}).get(arm):
            what = f"MLP steps/s, {what} / a plain DDP hand loop, {within}"
            rows.append((f"22-{arm}", 22, what, v["ratio"], ">= 0.98", v["ci95"]))
    if ks := r.get("kernel_scale"):
        top = max(ks, key=lambda x: x["ranks"])
        what = f"the kernel with {top['ranks']} simulated ranks"
        rows.append(("25-cpu", 25, f"{what}: CPU (share of one core)", top["cpu_share"], "<= 0.10", None))
        rows.append(("25-redraw", 25, f"{what}: redraw (s)", top["redraw_interval_s"], "<= 0.5", None))
    if (a := r.get("adaptive")) and a.get("gates"):
        g, best = a["gates"], "the best fixed batch of the grid (an oracle)"
        what = f"adaptive batch: seeds reaching the target in <= 0.8x the wall time of {best}"
        rows.append(("36-wall", 36, what, g["wall"]["seeds_met"], ">= 4", None))
        rows.append(("36-samples", 36, f"adaptive batch: samples to target / {best}'s", g["samples"]["ratio"],
                     "<= 1.1", None))  # fmt: skip
        what = "adaptive batch: compute / the whole grid's compute"
        rows.append(("36-compute", 36, what, g["compute"]["ratio"], "<= 0.333", None))
    if a and a.get("b_simple"):
        what = "adaptive benchmark's workload: B_simple growth over the run (x)"
        rows.append(("36-bsimple", 36, what, a["b_simple"]["growth"], ">= 30", None))
    if "cold_start" in r and "throughput" in r:  # the whole suite
        limit = "< 120" if r["meta"]["smoke"] else "< 900"
        what = "the benchmark's wall time on this machine (s)"
        rows.append(("8-time", 8, what, r["meta"]["duration_s"], limit, None))
    return [_target(*row) for row in rows]
