"""The order of the measurements (interleaved, side by side) and the results dictionary.

All alternatives run in one process tree on one machine, one after the other inside every
repetition (the order rotates between repetitions), so a slow minute caused by something else on
the machine hits them all alike; ratios are taken between neighbours and medians over repetitions.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import workload as W
from benchmarks.features import FeatureBench
from benchmarks.runners import (
    DtworkRunner,
    LaunchWorkerRunner,
    RawIpyparallelRunner,
    TorchrunRunner,
    probe_optional,
)
from benchmarks.util import (
    bootstrap_ci,
    load_average,
    machine,
    median,
    paired_ratios,
    ratio,
    summarize,
    versions,
)

KINDS = W.KINDS
OPTIONAL = ("accelerate", "fabric")
ALTERNATIVES = ("dtwork", "dtwork_steps", "raw_ipyparallel", "torchrun", "accelerate", "fabric")
LABELS = {
    "dtwork": "dtwork %%dtrain (same code: DDP + hand loop)",
    "dtwork_steps": "dtwork %%dtrain idiomatic (ctx.wrap + ctx.steps + ctx.log)",
    "raw_ipyparallel": "raw ipyparallel %px + hand-written DDP setup",
    "torchrun": "torchrun --nproc_per_node=2",
    "accelerate": "HuggingFace Accelerate notebook_launcher",
    "fabric": "Lightning Fabric (strategy ddp_notebook)",
}


@dataclass
class Plan:
    """How much of everything to run (the full run, or ``--smoke``)."""

    smoke: bool = False
    coldstart_reps: int = 3
    coldstart_train_steps: int = 40
    round_trips: int = 30
    throughput_reps: int = 3  # at least; more while the time budget allows, up to throughput_max_reps
    throughput_max_reps: int = 6
    warmup: dict[str, int] = field(default_factory=lambda: {"mlp": 10, "convnet": 3})
    # timed windows of 2-3 s: shorter ones measure scheduling noise more than training
    steps: dict[str, int] = field(default_factory=lambda: {"mlp": 250, "convnet": 50})
    latency_reps_inprocess: int = 5
    latency_reps_relaunch: int = 3
    latency_kind: str = "mlp"
    thread_check_reps: int = 3
    thread_check_steps: int = 15
    feature_reps: int = 3  # on/off pairs at least; more while the time budget allows
    feature_max_reps: int = 12
    budget_s: float = 840.0  # the run adds repetitions only while it can still finish within this
    throughput_share: float = 0.30  # steps/s repetitions stop being added past this share of the budget
    reserve_s: float = 45.0  # kept for stopping the clusters and writing the results
    feature_steps: dict[str, int] = field(default_factory=lambda: {"mlp": 250, "convnet": 50})
    # about 0.3 s: covers what a cell costs once in the kernel (the live dashboard's widgets, its first draw)
    feature_warmup: dict[str, int] = field(default_factory=lambda: {"mlp": 30, "convnet": 8})
    # one long MLP cell with the live dashboard: does its kernel CPU grow? How much do its windows scatter?
    long_cell_steps: int = 2500
    # GNS on/off windows (2 * gns.every steps) alternating inside one loop: on/off cycles per workload
    gns_cycles: dict[str, int] = field(default_factory=lambda: {"mlp": 160, "convnet": 40})
    # live dashboard + store on/off windows (about 2 s: four redraws each) alternating inside one loop
    live_window: dict[str, int] = field(default_factory=lambda: {"mlp": 180, "convnet": 44})
    live_cycles: dict[str, int] = field(default_factory=lambda: {"mlp": 30, "convnet": 20})
    # (c) dtwork and torchrun training in turns: blocks (fresh launches of both), each with cycles of windows
    turn_blocks: int = 6  # at least; more while the time budget allows, up to turn_max_blocks
    turn_max_blocks: int = 6
    turn_share: float = 0.62  # blocks stop being added past this share of the budget
    turn_steps: dict[str, int] = field(default_factory=lambda: {"mlp": 30, "convnet": 8})
    turn_cycles: dict[str, int] = field(default_factory=lambda: {"mlp": 12, "convnet": 8})

    @classmethod
    def smoke_plan(cls) -> Plan:
        return cls(
            smoke=True,
            coldstart_reps=1,
            coldstart_train_steps=5,
            round_trips=5,
            throughput_reps=1,
            throughput_max_reps=1,
            warmup={"mlp": 2, "convnet": 1},
            steps={"mlp": 6, "convnet": 2},
            latency_reps_inprocess=2,
            latency_reps_relaunch=1,
            thread_check_reps=1,
            thread_check_steps=2,
            feature_reps=1,
            feature_max_reps=1,
            feature_steps={"mlp": 4, "convnet": 2},
            feature_warmup={"mlp": 1, "convnet": 1},
            long_cell_steps=40,
            gns_cycles={"mlp": 2, "convnet": 1},
            live_window={"mlp": 3, "convnet": 1},
            live_cycles={"mlp": 2, "convnet": 1},
            turn_blocks=1,
            turn_max_blocks=1,
            turn_steps={"mlp": 3, "convnet": 1},
            turn_cycles={"mlp": 2, "convnet": 1},
        )


class Clock:
    """The run's time budget: repetitions beyond the minimum are added only while they fit."""

    def __init__(self, plan: Plan) -> None:
        self.t0 = time.perf_counter()
        self.rounds: dict[str, list[float]] = {}
        self.throughput_deadline = plan.budget_s * plan.throughput_share
        self.turn_deadline = plan.budget_s * plan.turn_share
        self.final_deadline = plan.budget_s - plan.reserve_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    @contextlib.contextmanager
    def round(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.rounds.setdefault(name, []).append(time.perf_counter() - t)

    def per_round(self, name: str) -> float:
        """The longest round so far (a cautious guess at the next one)."""
        return max(self.rounds.get(name, [0.0]))

    def room_for(self, seconds: float, deadline: float) -> bool:
        return self.elapsed() + seconds <= deadline


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- 1. cold start + memory, in fresh kernel processes -----------------------------------------------


class ColdStarts:
    """Fresh kernel processes (``benchmarks.coldstart``), one per sample, dtwork and raw alternating.

    A full run starts them one at a time before anything else runs; ``--smoke`` starts them all at
    once in the background, alongside the rest (its numbers then share the machine, which a smoke
    run accepts: it only checks that everything runs).
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.tmp = Path(tempfile.mkdtemp(prefix="dtwork-bench-cold-"))
        self.jobs: list[tuple[str, Path, subprocess.Popen[str]]] = []
        self.samples: dict[str, list[dict[str, Any]]] = {"dtwork": [], "raw": []}
        self.errors: list[str] = []

    def _order(self) -> list[tuple[int, str]]:
        out = []
        for rep in range(self.plan.coldstart_reps):
            out += [(rep, w) for w in (("dtwork", "raw") if rep % 2 == 0 else ("raw", "dtwork"))]
        return out

    def _spawn(self, rep: int, which: str) -> None:
        path = self.tmp / f"{which}-{rep}.json"
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.coldstart",
            which,
            str(path),
            "--steps",
            str(self.plan.coldstart_train_steps),
        ]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(Path(__file__).resolve().parent.parent),
        )
        self.jobs.append((which, path, proc))

    def _collect(self) -> None:
        import json

        for which, path, proc in self.jobs:
            try:
                _, err = proc.communicate(timeout=300)
                if proc.returncode != 0:
                    raise RuntimeError(f"exit {proc.returncode}: {err[-2000:]}")
                self.samples[which].append(json.loads(path.read_text()))
            except Exception as exc:
                proc.kill()
                self.errors.append(f"{which}: {type(exc).__name__}: {exc}")
        self.jobs = []

    def run_sequential(self) -> None:
        for rep, which in self._order():
            _log(f"cold start {which} ({rep + 1}/{self.plan.coldstart_reps})")
            self._spawn(rep, which)
            self._collect()

    def spawn_all(self) -> None:
        _log("cold start kernels, all at once (smoke)")
        for rep, which in self._order():
            self._spawn(rep, which)

    def results(self) -> dict[str, Any]:
        self._collect()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return coldstart_summary(self.samples, self.errors)

    def abort(self) -> None:
        for _, _, proc in self.jobs:
            if proc.poll() is None:
                proc.terminate()
        for _, _, proc in self.jobs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def coldstart_summary(samples: dict[str, list[dict[str, Any]]], errors: list[str]) -> dict[str, Any]:
    def col(which: str, key: str) -> list[float]:
        return [s[key] for s in samples[which] if s.get(key) is not None]

    d, raw_engines, raw_ddp = col("dtwork", "start_s"), col("raw", "engines_s"), col("raw", "start_s")
    cold = {
        "dtwork_s": summarize(d),
        "raw_ipyparallel_s": summarize(raw_engines),
        "raw_ipyparallel_ddp_s": summarize(raw_ddp),
        "ratio_vs_raw_ipyparallel": ratio(median(d), median(raw_engines)),
        "ratio_vs_raw_ipyparallel_ci95": bootstrap_ci(d, raw_engines),
        "ratio_vs_raw_ipyparallel_ddp": ratio(median(d), median(raw_ddp)),
        "import_s": {
            "dtwork": median(col("dtwork", "import_s")),
            "ipyparallel": median(col("raw", "import_s")),
        },
        "stop_s": {
            "dtwork": median(col("dtwork", "stop_s")),
            "raw_ipyparallel": median(col("raw", "stop_s")),
        },
        "errors": errors,
    }
    memory = {}
    for which, name in (("dtwork", "dtwork"), ("raw", "raw_ipyparallel")):
        mem: dict[str, Any] = {}
        for phase in ("fresh", "idle", "train"):
            rows = [s[f"memory_{phase}"] for s in samples[which] if f"memory_{phase}" in s]
            mem[phase] = {
                "kernel_mb": median([r["kernel_mb"] for r in rows if r["kernel_mb"]]),
                "engines_mb": [
                    median([r["engines_mb"][i] for r in rows if r["engines_mb"][i]]) for i in range(2)
                ]
                if rows
                else [None, None],
            }
        memory[name] = mem
    ratios = {}
    for phase in ("fresh", "idle", "train"):
        dm, rm = memory["dtwork"][phase], memory["raw_ipyparallel"][phase]
        ratios[phase] = {
            "kernel": ratio(dm["kernel_mb"], rm["kernel_mb"]),
            "engine_mean": ratio(_mean(dm["engines_mb"]), _mean(rm["engines_mb"])),
        }
    memory["ratio_dtwork_vs_raw"] = ratios
    memory["note"] = (
        "psutil RSS in MiB, median over the cold-start kernels. fresh: right after start; idle: after the "
        "setup cell built the MLP and its data; train: peak while a training cell runs (dtwork: ctx.wrap + "
        "ctx.steps + ctx.log with the live dashboard and run store; raw: the hand loop)."
    )
    return {"cold_start": cold, "memory": memory}


def same_arm_scatter(stamps: list[float], window: int) -> dict[str, Any]:
    """How much two windows of the *same* arm differ: the machine's resolution for on/off pairs.

    ``stamps``: seconds since the first timed step's start at the end of every step of one long
    cell (all ranks step together). Cut into windows of ``window`` steps, as long as one arm of the
    feature pairs; the ratios of adjacent windows are what a pair measures when on and off cost
    the same.
    """
    ends = [0.0] + list(stamps)
    rates = [window / (ends[(i + 1) * window] - ends[i * window]) for i in range(len(stamps) // window)]
    ratios = [a / b for a, b in zip(rates, rates[1:], strict=False)]
    sd = statistics.stdev(ratios) if len(ratios) > 1 else None
    return {
        "window_steps": window,
        "window_steps_per_s": rates,
        "adjacent_ratios": ratios,
        "ratio_sd": sd,
        # pairs whose mean ratio has a 95% interval of +-1%, at this scatter
        "pairs_for_1pct": None if sd is None else math.ceil((1.96 * sd / 0.01) ** 2),
    }


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


# -- the in-process part ----------------------------------------------------------------------------


class Suite:
    def __init__(self, plan: Plan, clock: Clock | None = None) -> None:
        self.plan = plan
        self.clock = clock or Clock(plan)
        self.dt = DtworkRunner()
        self.raw = RawIpyparallelRunner()
        self.torchrun: TorchrunRunner | None = None
        self.optional: dict[str, LaunchWorkerRunner] = {}
        self.skipped: dict[str, str] = {}
        self.features: FeatureBench | None = None

    # lifecycle
    def start(self) -> dict[str, Any]:
        # Both clusters at once (their start times here are not the cold-start measurement: that one
        # runs in fresh kernels, one at a time); this only saves wall time.
        _log("starting the dtwork cluster and the raw ipyparallel cluster")
        failure: list[BaseException] = []

        def start_dtwork() -> None:
            try:
                self.dt.start()
            except BaseException as exc:  # re-raised below, in the main thread
                failure.append(exc)

        th = threading.Thread(target=start_dtwork, name="bench-dtwork-start")
        th.start()
        try:
            t_raw = self.raw.start(ddp=True)
        finally:
            th.join()
        if failure:
            raise failure[0]
        t_dt = self.dt.start_s
        self.torchrun = TorchrunRunner()
        # The optional launchers' kernels, one at a time (their import time is part of their cold start).
        for name in OPTIONAL:
            why = probe_optional(name)
            if why is None:
                _log(f"{name}: starting its kernel")
                runner = LaunchWorkerRunner(name)
                try:
                    runner.wait_ready()
                    self.optional[name] = runner
                except Exception as exc:
                    runner.stop()
                    why = f"skipped: cannot start ({type(exc).__name__}: {exc})"
            if why is not None:
                self.skipped[name] = why
                _log(f"{name}: {why}")
        return {
            "dtwork_in_driver_s": t_dt,
            "raw_ipyparallel_ddp_in_driver_s": t_raw,
            "raw_ipyparallel_in_driver_s": self.raw.engines_s,
        }

    def stop(self) -> None:
        for r in self.optional.values():
            try:
                r.stop()
            except Exception:
                pass
        if self.torchrun is not None:
            try:
                self.torchrun.stop()
            except Exception:
                pass

        def stop(r: Any) -> None:
            try:
                r.stop()
            except Exception:
                traceback.print_exc()

        threads = [threading.Thread(target=stop, args=(r,)) for r in (self.dt, self.raw)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    # (b) round trip
    def round_trip(self) -> dict[str, Any]:
        _log("round trip of a trivial cell")
        for _ in range(2):  # warm the paths
            self.dt.round_trip(quiet=True)
            self.raw.round_trip()
        dq, dd, rw = [], [], []
        for i in range(self.plan.round_trips):
            trio = [
                lambda: dq.append(self.dt.round_trip(quiet=True)),
                lambda: dd.append(self.dt.round_trip(quiet=False)),
                lambda: rw.append(self.raw.round_trip()),
            ]
            for f in trio[i % 3 :] + trio[: i % 3]:
                f()
        return {
            "dtwork_quiet_s": summarize(dq),
            "dtwork_default_s": summarize(dd),
            "raw_px_s": summarize(rw),
            "ratio_quiet": ratio(median(dq), median(rw)),
            "ratio_quiet_ci95": bootstrap_ci(dq, rw),
            "ratio_default": ratio(median(dd), median(rw)),
            "note": "dtwork: cluster.run('pass', quiet=True) (and with %%dtrain's defaults: output shown, dashboard on); "
            "raw: DirectView.execute('pass', block=True) on a raw ipyparallel cluster (what %px does)",
        }

    # (c) + alternatives: steps/s
    def setup_workloads(self) -> None:
        _log("setup cells (model and data stay on the ranks)")
        self.dt.setup()
        self.raw.setup()
        self.features = FeatureBench(self.dt, KINDS)
        self.features.setup()

    def throughput(self) -> dict[str, Any]:
        p = self.plan
        runs: dict[str, dict[str, list[float]]] = {a: {k: [] for k in KINDS} for a in ALTERNATIVES}
        errors: dict[str, str] = {}

        def dtwork() -> None:
            for k in KINDS:
                runs["dtwork"][k].append(self.dt.throughput(k, p.warmup[k], p.steps[k]))

        def dtwork_steps() -> None:
            assert self.features is not None
            arm = {"cell": {"gns": False, "log": True}, "live": True, "quiet": False}
            for k in KINDS:
                runs["dtwork_steps"][k].append(self.features.arm(k, arm, p.warmup[k], p.steps[k]))

        def raw() -> None:
            for k in KINDS:
                runs["raw_ipyparallel"][k].append(self.raw.throughput(k, p.warmup[k], p.steps[k]))

        def launched(name: str, runner: Any) -> Any:
            def go() -> None:
                if name in errors:
                    return
                try:
                    res = runner.throughput_many(KINDS, p.warmup, p.steps)
                except Exception as exc:
                    errors[name] = f"{type(exc).__name__}: {exc}"
                    return
                for k in KINDS:
                    runs[name][k].append(res[k])

            return go

        order = [
            ("dtwork", dtwork),
            ("dtwork_steps", dtwork_steps),
            ("raw_ipyparallel", raw),
            ("torchrun", launched("torchrun", self.torchrun)),
        ]
        order += [(n, launched(n, r)) for n, r in self.optional.items()]
        rep = 0
        while rep < p.throughput_max_reps:
            if rep >= p.throughput_reps and not self.clock.room_for(
                self.clock.per_round("throughput"), self.clock.throughput_deadline
            ):
                break
            _log(
                f"steps/s, repetition {rep + 1} (at least {p.throughput_reps}, at most {p.throughput_max_reps})"
            )
            with self.clock.round("throughput"):
                shift = rep % len(order)
                for _name, fn in order[shift:] + order[:shift]:
                    fn()
            rep += 1
            for a in ALTERNATIVES:  # a missing run stays a gap, so that pairs stay aligned by repetition
                for k in KINDS:
                    while len(runs[a][k]) < rep:
                        runs[a][k].append(None)
        out: dict[str, Any] = {"plan": {"warmup": p.warmup, "steps": p.steps, "reps": rep}, "errors": errors}
        for a in ALTERNATIVES:
            out[a] = {k: summarize([x for x in runs[a][k] if x is not None]) for k in KINDS}

        def pairs(a: str, b: str, k: str) -> list[float]:
            return [x / y for x, y in zip(runs[a][k], runs[b][k], strict=True) if x and y]

        # The headline ratio: the median over repetitions of (alternative / torchrun) within a repetition,
        # whose runs were minutes apart at most; the ratio of the medians is kept beside it.
        out["ratio_vs_torchrun"] = {
            a: {k: median(pairs(a, "torchrun", k)) for k in KINDS} for a in ALTERNATIVES
        }
        out["ratio_vs_torchrun_ci95"] = {
            a: {k: bootstrap_ci(pairs(a, "torchrun", k)) for k in KINDS} for a in ALTERNATIVES
        }
        out["ratio_of_medians_vs_torchrun"] = {
            a: {k: ratio(out[a][k]["median"], out["torchrun"][k]["median"]) for k in KINDS}
            for a in ALTERNATIVES
        }
        out["ratio_vs_raw_ipyparallel"] = {
            a: {k: median(pairs(a, "raw_ipyparallel", k)) for k in KINDS} for a in ALTERNATIVES
        }
        out["torchrun_default_threads"] = self.torchrun.default_threads if self.torchrun else None
        return out

    # (c) dtwork and torchrun training in turns
    def throughput_turns(self) -> dict[str, Any]:
        """The same code under %%dtrain and under torchrun, in short windows taken in turns (benchmarks.turns).

        A block is one launch of each (block 0: the cluster every other measurement uses; then fresh
        engines via ``restart``, and a fresh torchrun every block) and cycles of one window each, in
        a random order. The ratio is the geometric mean over blocks of each block's ratio of totals.
        The features' setup is run again at the end (a restart leaves fresh engines).
        """
        from benchmarks.turns import blocks_summary

        p = self.plan
        plan = {k: (p.turn_steps[k], p.turn_cycles[k]) for k in KINDS}
        blocks: list[dict[str, dict[str, list[float]]]] = []
        errors: list[str] = []
        block_s: list[float] = []
        b = 0
        while b < p.turn_max_blocks:
            if b >= p.turn_blocks and not self.clock.room_for(
                self.clock.per_round("turns"), self.clock.turn_deadline
            ):
                break
            _log(
                f"dtwork and torchrun in turns, block {b + 1} (at least {p.turn_blocks}, at most {p.turn_max_blocks})"
            )
            t0 = time.perf_counter()
            try:
                with self.clock.round("turns"):
                    out = self._turn_block(b, plan)
            except Exception as exc:  # the run goes on without more blocks; the reason is kept
                out = {"error": f"{type(exc).__name__}: {exc}"}
            block_s.append(time.perf_counter() - t0)
            if out.get("error") or any(k not in out for k in KINDS):
                errors.append(f"block {b + 1}: {out.get('error') or 'ended early'}")
                break
            blocks.append({k: out[k]["seconds"] for k in KINDS})
            b += 1
        assert self.features is not None
        self.features.setup()  # a restart left fresh engines: define the feature loops again
        res: dict[str, Any] = {
            "errors": errors,
            "block_s": block_s,
            "plan": {"steps_per_window": p.turn_steps, "cycles_per_block": p.turn_cycles},
        }
        if blocks:
            for k in KINDS:
                res[k] = blocks_summary([blk[k] for blk in blocks], "dtwork", "torchrun", p.turn_steps[k])
        res["note"] = (
            "dtwork's ranks inside one %%dtrain cell (its defaults: output shown, live dashboard, run store) and "
            "torchrun's workers inside one launch run the same training code in short windows, in turns: each "
            "cycle holds one window of each in a random order; the job that waits blocks in a socket read. "
            "A block is a fresh launch of both (dtwork: restart, torchrun: a new launch); a block's ratio is "
            "torchrun's total window time / dtwork's (= dtwork's steps/s / torchrun's), the headline their "
            "geometric mean with a t-interval over blocks (launches differ from one another, see the block SD)."
        )
        return res

    def _turn_block(self, b: int, plan: dict[str, tuple[int, int]]) -> dict[str, Any]:
        """One block: fresh launches (but the first), then the cycles; the dtwork cell runs in this thread."""
        from benchmarks.turns import Turns, run_in_turns

        if b > 0:
            self.dt.cluster.restart()
        turns = Turns({"dtwork": 2, "torchrun": 2})
        assert self.torchrun is not None
        proc = self.torchrun.serve(turns.port, KINDS)
        try:
            self.dt.setup()
            thread, out = run_in_turns(turns, plan, seed=b, alive=lambda: proc.poll() is None)
            try:
                self.dt.run(W.turns_cell(turns.port, "dtwork"))
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

    # (d) iteration latency
    def iteration_latency(self) -> dict[str, Any]:
        p, kind = self.plan, self.plan.latency_kind
        res: dict[str, list[float]] = {"dtwork": [], "dtwork_steps": [], "raw_ipyparallel": []}
        first: dict[str, list[float]] = {}
        errors: dict[str, str] = {}
        relaunchers: dict[str, Any] = {"torchrun": self.torchrun, **self.optional}
        for name in relaunchers:
            res[name], first[name] = [], []
        self.dt.run(W.LATENCY_STEPS_SETUP.format(kind=kind))
        self.dt.iterate(kind)  # the first changed cell after setup is not special, but warm it anyway
        self.dt.iterate_steps()
        self.raw.iterate(kind)
        reps = max(p.latency_reps_inprocess, p.latency_reps_relaunch)
        for rep in range(reps):
            _log(f"iteration latency, repetition {rep + 1}/{reps}")
            if rep < p.latency_reps_inprocess:
                res["dtwork"].append(self.dt.iterate(kind))
                res["dtwork_steps"].append(self.dt.iterate_steps())
                res["raw_ipyparallel"].append(self.raw.iterate(kind))
            if rep < p.latency_reps_relaunch:
                for name, runner in relaunchers.items():
                    if name in errors:
                        continue
                    try:
                        wall, first_step = runner.iterate(kind)
                    except Exception as exc:
                        errors[name] = f"{type(exc).__name__}: {exc}"
                        continue
                    res[name].append(wall)
                    first[name].append(first_step)
        self.dt.run(W.LATENCY_STEPS_TEARDOWN)
        out: dict[str, Any] = {"kind": kind, "errors": errors}
        for name, vals in res.items():
            out[name] = {"wall_s": summarize(vals)}
            if name in first:
                out[name]["first_step_s"] = summarize(first[name])
        d = median(res["dtwork"])
        out["speedup_vs"] = {
            name: ratio(median(vals), d)
            for name, vals in res.items()
            if name not in ("dtwork", "dtwork_steps")
        }
        out["dtwork_steps_speedup_vs_torchrun"] = ratio(
            median(res.get("torchrun", [])), median(res["dtwork_steps"])
        )
        out["speedup_vs_torchrun_first_step"] = ratio(median(first.get("torchrun", [])), d)
        out["speedup_vs_torchrun_ci95"] = bootstrap_ci(res.get("torchrun", []), res["dtwork"])
        out["note"] = (
            "dtwork / raw ipyparallel: a changed cell (new learning rate, one training step) run on ranks that already "
            "hold the model and data; wall time until every rank finished. torchrun / Accelerate / Fabric: every "
            "change is a relaunch that rebuilds the model and data; wall_s = the whole launch, first_step_s = from "
            "the launch to the first finished step on all ranks (measured inside the ranks)."
        )
        return out

    # dtwork engines' default threads against one per rank
    def thread_check(self) -> dict[str, Any]:
        p = self.plan
        _log("thread check: engine default threads vs one per rank")
        default, pinned = [], []
        for rep in range(p.thread_check_reps):
            pair = [("default", default), ("pinned", pinned)]
            for mode, acc in pair if rep % 2 == 0 else pair[::-1]:
                acc.append(self.dt.throughput("mlp", 2, p.thread_check_steps, threads=mode))
        threads = self.dt.pull("_default_threads")
        return {
            "engine_default_threads": threads,
            "torchrun_worker_threads": self.torchrun.default_threads if self.torchrun else None,
            "logical_cpus": os.cpu_count(),
            "default_steps_per_s": summarize(default),
            "pinned_steps_per_s": summarize(pinned),
            "ratio_default_vs_pinned": ratio(median(default), median(pinned)),
            "pair_ratios": paired_ratios(default, pinned),
        }

    def long_cell(self) -> dict[str, Any]:
        """One long training cell with the live dashboard on: the kernel's CPU share, quarter by quarter."""
        from benchmarks.features import KernelCpu

        assert self.features is not None
        n = self.plan.long_cell_steps
        _log(f"one long cell with the live dashboard ({n} MLP steps)")
        with KernelCpu(0.05) as k:
            self.dt.run(
                f"_res = feature_loop('mlp', warmup={self.plan.feature_warmup['mlp']}, steps={n}, log=True, "
                "gns=False, stamps=True)\n",
                quiet=False,
                live=True,
            )
        res = self.dt.pull("_res")
        t0, t1 = min(x[4] for x in res), max(x[5] for x in res)
        quarters = [
            k.between(t0 + (t1 - t0) * i / 4, t0 + (t1 - t0) * (i + 1) / 4) / ((t1 - t0) / 4)
            for i in range(4)
        ]
        return {
            "steps": n,
            "seconds": t1 - t0,
            "steps_per_s": min(x[0] for x in res),
            "kernel_cpu_share_by_quarter": quarters,
            "note": "CPU seconds the kernel process spends per wall second (1.0 = one core) in each quarter of the "
            "timed steps of one long %%dtrain cell (ctx.steps + ctx.log, live dashboard on)",
            "same_arm": same_arm_scatter(res[0][6], self.plan.feature_steps["mlp"]),
        }

    def gns_interleaved(self) -> dict[str, Any]:
        """GNS measurement on/off in alternating windows of one loop per workload: drift cancels at
        the scale of a window (tenths of a second) instead of a whole loop."""
        assert self.features is not None
        out: dict[str, Any] = {}
        for kind in KINDS:
            n = self.plan.gns_cycles[kind]
            _log(f"GNS on/off windows inside one loop ({kind}, {n} cycles)")
            out[kind] = self.features.gns_interleaved(kind, self.plan.feature_warmup[kind], n)
        out["note"] = (
            "One ctx.steps loop per workload, its model wrapped with gns=True, the measurement switched on and "
            "off in windows of 2 * gns.every steps (on windows measure at every gns.every-th step, as the "
            "default does; off windows compute no norm, as gns=False); each cycle is an on and an off window in "
            "a random order. Ratio: median over cycles of off time / on time (= on / off throughput); the "
            "interval is a bootstrap over cycles. Live dashboard on and ctx.log every step, as in the loop pairs."
        )
        return out

    def live_interleaved(self) -> dict[str, Any]:
        """Live dashboard + run store on/off in alternating windows of one loop per workload."""
        assert self.features is not None
        out: dict[str, Any] = {}
        for kind in KINDS:
            n, window = self.plan.live_cycles[kind], self.plan.live_window[kind]
            _log(
                f"live dashboard + store on/off windows inside one loop ({kind}, {n} cycles of {window} steps)"
            )
            out[kind] = self.features.live_interleaved(kind, self.plan.feature_warmup[kind], n, window)
        out["note"] = LIVE_NOTE
        return out

    def feature_overheads(self) -> dict[str, Any]:
        assert self.features is not None
        p = self.plan
        _log(
            f"feature overheads on/off (at least {p.feature_reps}, at most {p.feature_max_reps} interleaved pairs each)"
        )

        def more(rep: int) -> bool:
            if rep >= p.feature_max_reps:
                return False
            return rep < p.feature_reps or self.clock.room_for(
                self.clock.per_round("features"), self.clock.final_deadline
            )

        out = self.features.measure(more, p.feature_warmup, p.feature_steps, self.clock)
        out["plan"] = {"warmup": p.feature_warmup, "steps": p.feature_steps, "pairs": self.features.reps_done}
        return out


LIVE_NOTE = (
    "One ctx.steps loop per workload runs %%dtrain's defaults (output shown, live dashboard, run store); its "
    "windows alternate between on (ctx.log(loss=...) every step, the kernel feeding the dashboard: redraws twice "
    "a second) and off (no ctx.log, the dashboard paused: session.live = False, so the records that still come, "
    "throughput and progress, go to the store only). At each window's start rank 0 tells the kernel over a socket, "
    "so the kernel switches within a millisecond of the ranks; each cycle is an on and an off window in a random "
    "order. Ratio: median over cycles of off time / on time (= on / off throughput); the interval is a bootstrap "
    "over cycles. The same cycles in CPU seconds (every rank's engine process, the kernel, the controller): "
    "off / on, blind to preemption. What an on window leaves to draw when it ends (at most one trailing redraw) "
    "lands in the next window."
)


def run(plan: Plan, command: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {
            "command": command,
            "smoke": plan.smoke,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "machine": machine(),
            "versions": versions(),
            "plan": asdict(plan),
            "workloads": {
                "mlp": "MLP 784-512-512-10 (ReLU), per-rank batch 64 of 1x28x28, 16 synthetic batches in memory",
                "convnet": "convnet conv32-pool-conv64-pool-fc128-fc10, per-rank batch 32 of 3x32x32, 16 synthetic batches",
                "common": "2 ranks, gloo on CPU, SGD(lr=0.01, momentum=0.9), one intra-op thread per rank",
            },
        },
        "gpu": {"measured": False, "note": "not measured: no GPU in this session"},
    }
    if results["meta"]["machine"].get("gpu") == "present":
        results["gpu"]["note"] = (
            "not measured: this suite runs the CPU path (gloo) only; the GPU section is a placeholder"
        )
    cold = ColdStarts(plan)
    clock = Clock(plan)
    suite = Suite(plan, clock)
    try:
        if plan.smoke:
            cold.spawn_all()  # they run alongside everything else; collected at the end
        else:
            cold.run_sequential()
            results.update(cold.results())
        results["core_in_driver_start_s"] = suite.start()
        results["round_trip"] = suite.round_trip()
        suite.setup_workloads()
        results["throughput"] = suite.throughput()
        results["iteration_latency"] = suite.iteration_latency()
        results["threads"] = suite.thread_check()
        results["turns"] = suite.throughput_turns()
        results["long_cell"] = suite.long_cell()
        results["gns_interleaved"] = suite.gns_interleaved()
        results["live_interleaved"] = suite.live_interleaved()
        results["features"] = suite.feature_overheads()
        if plan.smoke:
            results.update(cold.results())
        results["alternatives"] = alternatives_table(results, suite)
    finally:
        _log("stopping clusters")
        cold.abort()
        suite.stop()
    results["meta"]["duration_s"] = time.perf_counter() - t0
    results["meta"]["load_average_at_end"] = load_average()
    results["targets"] = targets(results)
    return results


def alternatives_table(results: dict[str, Any], suite: Suite) -> dict[str, Any]:
    """One row per launcher: steps/s (median), cold start, iteration latency; or why skipped."""
    tp, lat, cold = results["throughput"], results["iteration_latency"], results["cold_start"]
    imp = cold.get("import_s", {})

    def plus(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a + b

    cold_by = {
        "dtwork": plus(imp.get("dtwork"), cold["dtwork_s"]["median"]),
        "dtwork_steps": plus(imp.get("dtwork"), cold["dtwork_s"]["median"]),
        "raw_ipyparallel": plus(imp.get("ipyparallel"), cold["raw_ipyparallel_ddp_s"]["median"]),
        "torchrun": median(suite.torchrun.cold_starts) if suite.torchrun else None,
        **{n: plus(r.import_s, median(r.cold_starts)) for n, r in suite.optional.items()},
    }
    launch_to_ready = {n: median(r.cold_starts) for n, r in suite.optional.items()}
    rows: dict[str, Any] = {}
    for a in ALTERNATIVES:
        if a in suite.skipped:
            rows[a] = {"label": LABELS[a], "available": False, "skipped": suite.skipped[a]}
            continue
        err = tp["errors"].get(a) or lat["errors"].get(a)
        lat_key = a
        rows[a] = {
            "label": LABELS[a],
            "available": err is None,
            "steps_per_s": {k: tp[a][k]["median"] for k in KINDS},
            "ratio_vs_torchrun": tp["ratio_vs_torchrun"][a],
            "cold_start_s": cold_by.get(a),
            "launch_to_ready_s": launch_to_ready.get(a),
            "iteration_latency_s": lat.get(lat_key, {}).get("wall_s", {}).get("median"),
        }
        if err:
            rows[a]["error"] = err
    if suite.torchrun is not None and suite.torchrun.teardown_failures and "torchrun" in rows:
        rows["torchrun"]["teardown_failures"] = (
            suite.torchrun.teardown_failures
        )  # measured, then crashed on exit
    rows["note"] = (
        "Cold start: from a fresh kernel with nothing imported to a ready process group on 2 ranks. dtwork: "
        "import dtwork + dtwork.start (engines up, torch imported there, process group formed and checked); raw "
        "ipyparallel: import ipyparallel + Cluster.start_and_connect_sync + the hand-written init_process_group; "
        "torchrun: from the command to a ready process group inside the workers; Accelerate / Fabric: importing "
        "them (torch included) in the kernel + the launch call to a ready process group in the forked workers "
        "(that launch part alone: launch_to_ready_s; they pay it again at every launch, see the iteration latency)."
    )
    return rows


def _target(
    tid: str,
    issue: int,
    what: str,
    measured: float | None,
    target: str,
    ok: bool | None,
    detail: str = "",
    ci95: list[float] | None = None,
    threshold: float | None = None,
    higher_is_better: bool = True,
) -> dict[str, Any]:
    """One target. ``conclusive``: the 95% interval lies wholly on one side of the threshold."""
    conclusive = None
    if ci95 is not None and threshold is not None:
        lo, hi = ci95
        conclusive = (
            (lo >= threshold or hi < threshold) if higher_is_better else (hi <= threshold or lo > threshold)
        )
    return {
        "id": tid,
        "issue": issue,
        "what": what,
        "measured": measured,
        "target": target,
        "met": ok,
        "detail": detail,
        "ci95": ci95,
        "conclusive": conclusive,
    }


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(float(x), nd)


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    cold = r.get("cold_start", {})
    c_ratio = cold.get("ratio_vs_raw_ipyparallel")
    out.append(
        _target(
            "2a",
            2,
            "cold start to process group ready, N=2: dtwork / raw ipyparallel's own start",
            c_ratio,
            "< 1.0",
            None if c_ratio is None else c_ratio < 1.0,
            ci95=cold.get("ratio_vs_raw_ipyparallel_ci95"),
            threshold=1.0,
            higher_is_better=False,
            detail=f"dtwork {_r(cold.get('dtwork_s', {}).get('median'))} s, raw ipyparallel {_r(cold.get('raw_ipyparallel_s', {}).get('median'))} s; "
            f"raw ipyparallel + hand-written DDP setup {_r(cold.get('raw_ipyparallel_ddp_s', {}).get('median'))} s",
        )
    )
    rt = r.get("round_trip", {})
    out.append(
        _target(
            "2b",
            2,
            "round trip of a trivial %%dtrain cell / raw %px",
            rt.get("ratio_quiet"),
            "<= 1.2",
            None if rt.get("ratio_quiet") is None else rt["ratio_quiet"] <= 1.2,
            ci95=rt.get("ratio_quiet_ci95"),
            threshold=1.2,
            higher_is_better=False,
            detail=f"dtwork {_r((rt.get('dtwork_quiet_s', {}).get('median') or 0) * 1000, 1)} ms, "
            f"raw {_r((rt.get('raw_px_s', {}).get('median') or 0) * 1000, 1)} ms",
        )
    )
    tpr = r.get("throughput", {})
    tp = tpr.get("ratio_vs_torchrun", {}).get("dtwork", {})
    turns = r.get("turns", {})
    for k in KINDS:
        tk = turns.get(k) or {}
        if tk.get("ratio") is not None:
            wb = tk.get("within_block") or {}
            out.append(
                _target(
                    f"2c-{k}",
                    2,
                    f"steps/s under %%dtrain / torchrun --nproc_per_node=2, same code, in turns ({k})",
                    tk["ratio"],
                    ">= 0.98",
                    tk["ratio"] >= 0.98,
                    f"{tk['blocks']} launches of each, {tk['cycles']} cycles of {tk.get('steps_per_window')}-step windows; "
                    f"block ratios {[round(x, 3) for x in tk.get('block_ratios', [])]}; all cycles pooled "
                    f"{_r(wb.get('ratio_of_totals'), 3)}",
                    tk.get("ci95"),
                    0.98,
                )
            )
        v = tp.get(k)
        out.append(
            _target(
                f"2c-{k}-runs" if tk.get("ratio") is not None else f"2c-{k}",
                2,
                f"steps/s under %%dtrain / torchrun --nproc_per_node=2, same code, whole runs in turn ({k})",
                v,
                ">= 0.98",
                None if v is None else v >= 0.98,
                f"median of the per-repetition ratios; ratio of the medians "
                f"{_r(tpr.get('ratio_of_medians_vs_torchrun', {}).get('dtwork', {}).get(k), 3)}",
                tpr.get("ratio_vs_torchrun_ci95", {}).get("dtwork", {}).get(k),
                0.98,
            )
        )
    lat = r.get("iteration_latency", {})
    sp = lat.get("speedup_vs", {}).get("torchrun")
    out.append(
        _target(
            "2d",
            2,
            "iteration latency: torchrun relaunch / changed %%dtrain cell (x faster)",
            sp,
            ">= 10",
            None if sp is None else sp >= 10,
            ci95=lat.get("speedup_vs_torchrun_ci95"),
            threshold=10.0,
            detail=f"dtwork {_r(lat.get('dtwork', {}).get('wall_s', {}).get('median'), 3)} s, torchrun relaunch "
            f"{_r(lat.get('torchrun', {}).get('wall_s', {}).get('median'))} s; against torchrun's launch-to-first-step "
            f"alone: {_r(lat.get('speedup_vs_torchrun_first_step'), 1)}x",
        )
    )
    inter = r.get("gns_interleaved", {})
    live = r.get("live_interleaved", {})
    for k in KINDS:
        lk = live.get(k) or {}
        v = lk.get("ratio")
        if v is None:
            continue
        cpu = lk.get("cpu") or {}
        out.append(
            _target(
                f"3-{k}",
                3,
                f"throughput, live dashboard + store on / off, windows alternating inside one loop ({k})",
                v,
                ">= 0.99",
                v >= 0.99,
                f"{lk['cycles']} on/off cycles of {lk.get('steps_per_window')}-step windows; ratio of the totals "
                f"{_r(lk.get('ratio_of_totals'), 3)}; in CPU seconds {_r(cpu.get('ratio'), 3)} "
                f"({_r((cpu.get('ci95') or [None])[0], 3)}-{_r((cpu.get('ci95') or [None, None])[1], 3)})",
                lk.get("ci95"),
                0.99,
            )
        )
    for k in KINDS:
        g = inter.get(k) or {}
        v = g.get("ratio")
        if v is None:
            continue
        out.append(
            _target(
                f"4-{k}",
                4,
                f"step throughput, GNS measurement on / off, windows alternating inside one loop ({k})",
                v,
                ">= 0.97",
                v >= 0.97,
                f"{g['cycles']} on/off cycles of {g.get('steps_per_window')}-step windows; ratio of "
                f"the totals {_r(g.get('ratio_of_totals'), 3)}",
                g.get("ci95"),
                0.97,
            )
        )
    dur = r.get("meta", {}).get("duration_s")
    smoke = r.get("meta", {}).get("smoke")
    out.append(
        _target(
            "8-time",
            8,
            "the full benchmark's wall time on this 2-core machine (s)"
            if not smoke
            else "smoke run wall time (s)",
            dur,
            "< 900" if not smoke else "< 120",
            None if dur is None else dur < (900 if not smoke else 120),
        )
    )
    return out
