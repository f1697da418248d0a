"""dtwork's own features on and off, side by side, in the same ``ctx.steps`` training loop.

Each comparison is a pair of arms run back to back on the same cluster (their order alternates
from one repetition to the next); the ratio is taken within each pair, then the median over pairs.

- The live dashboard + run store (``%%dtrain``'s defaults with ``ctx.log`` every step, against
  the dashboard paused and no ``ctx.log``) is measured apart, in windows alternating inside one
  loop (``live_interleaved``), as GNS is. The run store cannot be switched off in dtwork: the off
  windows still persist the per-rank throughput records that ``ctx.steps`` publishes itself.
- ``log_store``: the logging + store part of it alone: ``ctx.log`` every step against none, both
  quiet with ``session.live = False``.
- GNS (``gns=True`` against ``gns=False``) is measured apart, in windows alternating inside one loop
  (``gns_interleaved``): whole loops in turn could not resolve its few percent on this machine.
- ``metric_averaging``: ``optimizations.average_training_metrics`` true against false.
- ``steps_loop``: ``ctx.steps`` (per-rank progress, throughput records, the per-step stop/metrics
  all-reduce) against a plain hand-written loop over the same wrapped model, without ``ctx.log``.

Steps/s are timed inside one loop (from the step after the warmup to the end, between barriers):
the steady state. The warmup (about 0.3 s) also covers what the kernel does once per cell while
the ranks train (with the live dashboard: building its widgets, about 20 ms of CPU, and the
first draw); what ``ctx.steps`` costs once per loop, before its first batch, is recorded apart
(``loop_start_s``). Beside wall-clock steps/s, each arm records the CPU seconds it spends per
step (every rank's engine process and the kernel process, over the timed steps): on a
machine whose cores the ranks fill, ``cpu_ratio`` = CPU per step off ÷ on estimates the same
throughput ratio while being far less sensitive to other work on the machine.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from typing import Any

import psutil

from benchmarks import workload as W
from benchmarks.util import bootstrap_ci, median, paired_ratios, summarize

SETUP = """
import random
from dtwork.runtime.ddp import measure_state

_fb = {_k: make_batches(_k, ctx.rank) for _k in KINDS}


def feature_loop(kind, gns, warmup, steps, log=True, hand=False, stamps=False):
    \"\"\"Steps/s of ``steps`` steps after ``warmup`` steps, timed inside one training loop.

    The model is built and wrapped afresh (same initial weights every time) and dropped at the
    end, so that the loop's bookkeeping sees only the model being trained. Also returns the
    seconds from calling ``ctx.steps`` to its first batch, how many models ctx holds, this
    engine process's CPU seconds per timed step, the timed window's wall-clock bounds and
    (``stamps``) the perf_counter time at the end of every timed step.
    \"\"\"
    model = ctx.wrap(make_model(kind), gns=gns)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = _fb[kind]
    if hand:
        train(model, opt, batches, warmup)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        train(model, opt, batches, steps)
        dist.barrier()
        return (steps / (time.perf_counter() - t0), None, None, (time.process_time() - c0) / steps,
                time.time() - (time.perf_counter() - t0), time.time())
    t0 = c0 = None
    t_call = time.perf_counter()
    t_first = None
    ts = [] if stamps else None
    for step, (x, y) in ctx.steps(batches, max_steps=warmup + steps):
        if t_first is None:
            t_first = time.perf_counter() - t_call
        if step == warmup and t0 is None:
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
        loss = F.cross_entropy(model(x), y)
        ctx.backward(loss)
        ctx.step(opt)
        if log:
            ctx.log(loss=loss)
        if ts is not None and t0 is not None:
            ts.append(time.perf_counter())
    dist.barrier()
    return (steps / (time.perf_counter() - t0), t_first, len(ctx.models), (time.process_time() - c0) / steps,
            time.time() - (time.perf_counter() - t0), time.time(), ts and [t - t0 for t in ts])


def in_windows(kind, warmup, cycles, window, seed, tops, arms, cpus=None):
    \"\"\"``ctx.steps`` over the workload's batches, cut after ``warmup`` steps into windows of
    ``window`` steps, on and off in turn: yields (x, y, arm) where arm is True or False at the
    first step of a window and None at the others. Each cycle is one on and one off window in an
    order drawn from ``seed`` (the same on every rank). Every window's start (perf_counter, and
    this process's CPU time when ``cpus`` is a list) goes to ``tops``, its arm to ``arms``; the
    last start closes the last window.
    \"\"\"
    rng = random.Random(seed)
    on_first = [rng.random() < 0.5 for _ in range(cycles)]
    end = warmup + 2 * cycles * window
    for step, (x, y) in ctx.steps(_fb[kind], max_steps=end + 1):
        arm = None
        if step >= warmup and (step - warmup) % window == 0:
            w = (step - warmup) // window
            if w == 0:
                dist.barrier()
            tops.append(time.perf_counter())
            if cpus is not None:
                cpus.append(time.process_time())
            if step == end:
                return
            arm = on_first[w // 2] != bool(w % 2)
            arms.append(arm)
        yield x, y, arm


def gns_interleaved(kind, warmup, cycles, seed=0):
    \"\"\"GNS measurement on and off in windows of 2 * gns.every steps inside ONE training loop.

    The model is wrapped with ``gns=True``; at the start of every window its measuring state is
    switched on or off (``gns`` off: the hook computes no norm and the loop sends none, as with
    ``gns=False``). Each cycle is one on window and one off window, in an order drawn from
    ``seed`` (the same on every rank). Windows start at multiples of ``gns.every``, so every on
    window holds the same number of measured steps. The time of a window runs from the start of
    its first step's body to the start of the next window's: it includes the loop's end-of-step
    work (norms, sync) of all its steps. Returns (window seconds, window arms, steps per window).
    \"\"\"
    every = ctx.config.gns.every
    window = 2 * every
    warmup = -(-warmup // every) * every
    model = ctx.wrap(make_model(kind), gns=True)
    state = measure_state(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tops, arms = [], []
    for x, y, arm in in_windows(kind, warmup, cycles, window, seed, tops, arms):
        if arm is not None:
            state.gns = arm
        loss = F.cross_entropy(model(x), y)
        ctx.backward(loss)
        ctx.step(opt)
        ctx.log(loss=loss)
    return [b - a for a, b in zip(tops, tops[1:])], arms, window


def live_interleaved(kind, warmup, cycles, window, port, seed=0, on_arm=(True, True), off_arm=(False, False)):
    \"\"\"The live dashboard + run store on and off in windows of ``window`` steps inside ONE loop.

    On windows call ``ctx.log(loss=...)`` every step and the kernel feeds the live dashboard;
    off windows log nothing and the kernel's dashboard is paused (``session.live = False``: the
    records that still come, throughput and progress, go to the store only). At the start of
    every window rank 0 tells the kernel the window's arm over a socket (``port``), so the
    kernel switches within a millisecond of the ranks. Each cycle is one on and one off window
    in an order drawn from ``seed`` (the same on every rank). An arm is (ctx.log every step,
    dashboard fed): ``off_arm=on_arm`` is the A/A control (how far apart two identical windows
    land); (True, True) against (True, False) isolates the kernel's part. Returns
    (window seconds, window arms, steps per window, this process's CPU seconds per window, CPU
    seconds spent inside ``ctx.log``).
    \"\"\"
    import socket

    model = ctx.wrap(make_model(kind), gns=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sock = socket.create_connection(("127.0.0.1", port)) if ctx.rank == 0 else None
    tops, cpus, arms = [], [], []
    log_s = 0.0  # CPU seconds inside ctx.log (timed windows and warmup)
    log = True  # the warmup: the dashboard builds its widgets and draws a first time
    try:
        for x, y, arm in in_windows(kind, warmup, cycles, window, seed, tops, arms, cpus):
            if arm is not None:
                log, live = on_arm if arm else off_arm
                if sock is not None:
                    sock.sendall(b"1\\n" if live else b"0\\n")
            loss = F.cross_entropy(model(x), y)
            ctx.backward(loss)
            ctx.step(opt)
            if log:
                t_log = time.thread_time()
                ctx.log(loss=loss)
                log_s += time.thread_time() - t_log
    finally:
        if sock is not None:
            sock.close()
    return ([b - a for a, b in zip(tops, tops[1:])], arms, window,
            [b - a for a, b in zip(cpus, cpus[1:])], log_s)
"""

# name -> (description, on arm, off arm); an arm: (cell keyword arguments, run options)
ARMS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "log_store": (
        "the live dashboard + run store comparison without the dashboard: ctx.log every step (its values "
        "averaged, sent and written to the run store) vs no ctx.log, with session.live=False and quiet in both arms",
        {"cell": {"gns": False, "log": True}, "live": False, "quiet": True},
        {"cell": {"gns": False, "log": False}, "live": False, "quiet": True},
    ),
    "metric_averaging": (
        "optimizations.average_training_metrics true vs false",
        {"cell": {"gns": False, "log": True}, "live": True, "quiet": False, "average": True},
        {"cell": {"gns": False, "log": True}, "live": True, "quiet": False, "average": False},
    ),
    "steps_loop": (
        "ctx.steps (per-rank progress, perf records, per-step all-reduce) vs a plain hand-written loop",
        {"cell": {"gns": False, "log": False}, "live": True, "quiet": False},
        {"cell": {"gns": False, "log": False, "hand": True}, "live": True, "quiet": False},
    ),
}


def _ms(xs: list[float]) -> float | None:
    m = median(xs)
    return None if m is None else m * 1000.0


class KernelCpu:
    """Sample this (kernel) process's CPU time at 50 Hz, to read it over a window the ranks timed."""

    def __init__(self, interval: float = 0.02) -> None:
        self.proc = psutil.Process()
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        t = self.proc.cpu_times()
        self.samples.append((time.time(), t.user + t.system))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> KernelCpu:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def at(self, t: float) -> float:
        s = self.samples
        if t <= s[0][0]:
            return s[0][1]
        for (ta, ca), (tb, cb) in zip(s, s[1:], strict=False):
            if ta <= t <= tb:
                return ca + (cb - ca) * ((t - ta) / (tb - ta) if tb > ta else 0.0)
        return s[-1][1]

    def between(self, t0: float, t1: float) -> float:
        return max(0.0, self.at(t1) - self.at(t0))


class LiveSwitch:
    """The kernel's end of ``live_interleaved``: sets ``session.live`` as rank 0 says, at once.

    A thread accepts rank 0's connection and blocks reading it (no CPU while it waits); every
    line ("1" on, "0" off) switches the session's live dashboard. At every switch, and when rank
    0 hangs up (the end of the last window), it reads the CPU seconds spent so far by this
    (kernel) process and by ``others`` (the controller): ``cpu`` holds one tuple per read.
    """

    def __init__(self, session: Any, others: tuple[int, ...] = ()) -> None:
        self.session = session
        self.switches = 0
        self.cpu: list[tuple[float, ...]] = []
        self._others = []
        for pid in others:
            with contextlib.suppress(psutil.Error):
                self._others.append(psutil.Process(pid))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self._server.accept()
            with conn, conn.makefile("r") as lines:
                for line in lines:
                    self.session.live = line.strip() == "1"
                    self.switches += 1
                    self._read_cpu()
                self._read_cpu()

    def _read_cpu(self) -> None:
        times = [time.process_time()]
        for proc in self._others:
            t = proc.cpu_times()
            times.append(t.user + t.system)
        self.cpu.append(tuple(times))

    def __enter__(self) -> LiveSwitch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.close()
        self._thread.join(5.0)
        self.session.live = True


def interleaved_summary(windows_by_rank: list[list[float]], arms: list[bool]) -> dict[str, Any]:
    """On/off ratios from alternating windows of one loop (``gns_interleaved``).

    A window's time is the mean over ranks (they step together); each cycle (one on window, one off
    window, back to back) gives the ratio off time / on time = on throughput / off throughput.
    """
    if not windows_by_rank or len(arms) % 2 or any(len(w) != len(arms) for w in windows_by_rank):
        raise ValueError("every rank must time every window, in whole on/off cycles")
    times = [sum(ws) / len(ws) for ws in zip(*windows_by_rank, strict=True)]
    pairs = []
    for i in range(0, len(times), 2):
        (a, ta), (b, tb) = (arms[i], times[i]), (arms[i + 1], times[i + 1])
        if a == b:
            raise ValueError(f"cycle {i // 2} has two {'on' if a else 'off'} windows")
        on, off = (ta, tb) if a else (tb, ta)
        pairs.append(off / on)
    on_total = sum(t for t, a in zip(times, arms, strict=True) if a)
    off_total = sum(t for t, a in zip(times, arms, strict=True) if not a)
    sd = statistics.stdev(pairs) if len(pairs) > 1 else None
    return {
        "cycles": len(pairs),
        "ratio": median(pairs),
        "ci95": bootstrap_ci(pairs),
        "ratio_of_totals": off_total / on_total if on_total > 0 else None,
        "on_total": on_total,
        "off_total": off_total,
        "pair_sd": sd,
        "window_s": median(times),
        "seconds": sum(times),
        "pair_ratios": pairs,
    }


class FeatureBench:
    def __init__(self, runner: Any, kinds: tuple[str, ...]) -> None:
        self.r = runner
        self.kinds = kinds
        self._average: bool | None = None
        self.loop_start_s: list[float] = []  # ctx.steps: from the call to the first batch
        self.models_seen = 0  # models registered on ctx during a loop (1 = no other model took part)
        self.cpu = self.cpu_ranks = self.cpu_kernel = 0.0  # CPU seconds per step of the last arm
        self.reps_done = 0

    def setup(self) -> None:
        self._average = None  # fresh engines (the first setup, or after a restart) hold the config's default
        self.r.run(f"KINDS = {tuple(self.kinds)!r}\n" + W.PIN_THREADS + SETUP)

    def _set_average(self, value: bool) -> None:
        if self._average is value:
            return
        self.r.cluster.configure({"optimizations": {"average_training_metrics": value}})
        self._average = value

    def arm(self, kind: str, arm: dict[str, Any], warmup: int, steps: int) -> float:
        """Run one arm; return steps/s (the slower rank's); its CPU cost per step goes to ``self.cpu``."""
        self._set_average(arm.get("average", True))
        args = ", ".join(f"{k}={v!r}" for k, v in arm["cell"].items())
        with KernelCpu() as kernel:
            self.r.run(
                f"_res = feature_loop({kind!r}, warmup={warmup}, steps={steps}, {args})\n",
                quiet=arm["quiet"],
                live=arm["live"],
            )
        res = self.r.pull("_res")
        if not arm["cell"].get("hand"):
            self.loop_start_s.append(max(r[1] for r in res))
            self.models_seen = max(self.models_seen, *(r[2] for r in res))
        # CPU seconds per timed step: every rank's engine, plus the kernel over the same window
        t0, t1 = min(r[4] for r in res), max(r[5] for r in res)
        self.cpu_ranks = sum(r[3] for r in res)
        self.cpu_kernel = kernel.between(t0, t1) / steps
        self.cpu = self.cpu_ranks + self.cpu_kernel
        return float(min(r[0] for r in res))

    def gns_interleaved(self, kind: str, warmup: int, cycles: int, seed: int = 0) -> dict[str, Any]:
        """GNS on/off windows alternating inside one loop (live dashboard on, as in the loop pairs)."""
        self._set_average(True)
        self.r.run(
            f"_res = gns_interleaved({kind!r}, warmup={warmup}, cycles={cycles}, seed={seed})\n",
            quiet=False,
            live=True,
        )
        res = self.r.pull("_res")
        out = interleaved_summary([r[0] for r in res], res[0][1])
        out["steps_per_window"] = res[0][2]
        return out

    def live_interleaved(
        self,
        kind: str,
        warmup: int,
        cycles: int,
        window: int,
        aa: bool = False,
        seed: int = 0,
        on_arm: tuple[bool, bool] = (True, True),
        off_arm: tuple[bool, bool] = (False, False),
    ) -> dict[str, Any]:
        """Live dashboard + run store on/off windows alternating inside one loop (``%%dtrain``'s
        defaults: output shown). An arm: (ctx.log every step, dashboard fed); ``aa``: both windows
        of every cycle run ``on_arm`` (the A/A control)."""
        if aa:
            off_arm = on_arm
        self._set_average(True)
        ctrl = getattr(getattr(self.r.cluster._ipp, "controller", None), "pid", None)
        with LiveSwitch(self.r.cluster.session, (ctrl,) if ctrl else ()) as switch:
            self.r.run(
                f"_res = live_interleaved({kind!r}, warmup={warmup}, cycles={cycles}, window={window}, "
                f"port={switch.port}, seed={seed}, on_arm={on_arm}, off_arm={off_arm})\n",
                quiet=False,
                live=True,
            )
        res = self.r.pull("_res")
        arms = res[0][1]
        out = interleaved_summary([r[0] for r in res], arms)
        out["steps_per_window"] = res[0][2]
        out["switches"] = switch.switches
        logged = warmup + res[0][2] * sum(on_arm[0] if a else off_arm[0] for a in arms)
        # CPU inside ctx.log per logged step, the mean over ranks (the rest of its cost is in the sync)
        out["ctx_log_ms"] = 1000.0 * statistics.fmean(r[4] for r in res) / logged
        out["aa"] = aa
        out["arms"] = {
            "on": {"log": on_arm[0], "live": on_arm[1]},
            "off": {"log": off_arm[0], "live": off_arm[1]},
        }
        # The same cycles read in CPU seconds: every rank's engine process, the kernel and the
        # controller, window by window (off / on: a throughput-like ratio, blind to preemption)
        others = [
            [b - a for a, b in zip(col, col[1:], strict=False)] for col in zip(*switch.cpu, strict=True)
        ]
        if all(len(w) == len(arms) for w in others):
            parts = {
                "ranks": [sum(ws) for ws in zip(*(r[3] for r in res), strict=True)],
                "kernel": others[0],
                "controller": others[1] if len(others) > 1 else [0.0] * len(arms),
            }
            total = [sum(ws) for ws in zip(*parts.values(), strict=True)]
            cpu = interleaved_summary([total], arms)
            steps = out["steps_per_window"]
            out["cpu"] = {
                "ratio": cpu["ratio"],
                "ci95": cpu["ci95"],
                "ratio_of_totals": cpu["ratio_of_totals"],
                "pair_sd": cpu["pair_sd"],
                "pair_ratios": cpu["pair_ratios"],
                "on_total": cpu["on_total"],
                "off_total": cpu["off_total"],
                # milliseconds of CPU per step, by process and arm (means over windows)
                "ms_per_step": {
                    f"{arm}_{name}": 1000.0
                    * statistics.fmean(v for v, a in zip(vals, arms, strict=True) if a == on)
                    / steps
                    for name, vals in parts.items()
                    for arm, on in (("on", True), ("off", False))
                },
            }
        return out

    def measure(
        self, more: Any, warmup: dict[str, int], steps: dict[str, int], clock: Any = None
    ) -> dict[str, Any]:
        """Every feature, every workload: interleaved on/off pairs while ``more(rep)`` says so."""
        raw: dict[str, dict[str, dict[str, list[float]]]] = {
            f: {
                k: {
                    f"{arm}{part}": []
                    for arm in ("on", "off")
                    for part in ("", "_cpu", "_cpu_ranks", "_cpu_kernel")
                }
                for k in self.kinds
            }
            for f in ARMS
        }
        rep = 0
        while more(rep):
            with clock.round("features") if clock is not None else contextlib.nullcontext():
                self._round(rep, raw, warmup, steps)
            rep += 1
        self.reps_done = rep
        self._set_average(True)
        return self._summarize(raw)

    def _round(self, rep: int, raw: dict[str, Any], warmup: dict[str, int], steps: dict[str, int]) -> None:
        """One on/off pair of every feature and workload (the order within pairs alternates by round)."""
        for feature, (_, on, off) in ARMS.items():
            for kind in self.kinds:
                order = [("on", on), ("off", off)] if rep % 2 == 0 else [("off", off), ("on", on)]
                for label, arm in order:
                    raw[feature][kind][label].append(self.arm(kind, arm, warmup[kind], steps[kind]))
                    raw[feature][kind][f"{label}_cpu"].append(self.cpu)
                    raw[feature][kind][f"{label}_cpu_ranks"].append(self.cpu_ranks)
                    raw[feature][kind][f"{label}_cpu_kernel"].append(self.cpu_kernel)

    def _summarize(self, raw: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "loop_start_s": summarize(self.loop_start_s),
            "models_registered_during_loops": self.models_seen,
        }
        for feature, (desc, _, _) in ARMS.items():
            out[feature] = {"description": desc}
            for kind in self.kinds:
                on, off = raw[feature][kind]["on"], raw[feature][kind]["off"]
                on_cpu, off_cpu = raw[feature][kind]["on_cpu"], raw[feature][kind]["off_cpu"]
                pairs = paired_ratios(on, off)
                cpu_pairs = paired_ratios(off_cpu, on_cpu)  # CPU per step off / on: a throughput-like ratio
                out[feature][kind] = {
                    "on_steps_per_s": on,
                    "off_steps_per_s": off,
                    "pair_ratios": pairs,
                    "ratio": median(pairs),
                    "ci95": bootstrap_ci(pairs),
                    "ratio_of_medians": (median(on) or 0) / (median(off) or 1),
                    "on_cpu_s_per_step": on_cpu,
                    "off_cpu_s_per_step": off_cpu,
                    "cpu_ratio": median(cpu_pairs),
                    "cpu_ci95": bootstrap_ci(cpu_pairs),
                    # where the CPU per step goes (medians, milliseconds): the ranks' engines, the kernel
                    "cpu_ms_per_step": {
                        f"{arm}_{part}": _ms(raw[feature][kind][f"{arm}_cpu_{part}"])
                        for arm in ("on", "off")
                        for part in ("ranks", "kernel")
                    },
                }
        return out
