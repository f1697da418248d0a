"""Launchers training in turns: short windows of the same code, alternating, inside long-lived jobs.

Whole runs of two launchers one after the other are seconds apart, and on a small shared machine
the speed of the same code drifts by several percent over seconds (docs/benchmarks.md measures
it). Here each job (dtwork's ranks inside one ``%%dtrain`` cell, torchrun's workers inside one
launch, ...) runs ``serve_turns`` from the workload source: it connects to the ``Turns``
coordinator in the benchmark process, then blocks in a socket read until told to train a
window of N steps. The coordinator gives the windows to the jobs in turn, a cycle holding one
window of each job in a random order, so a cycle's windows run within about a second of each
other and the machine's drift cancels within it. A job that is not training uses no CPU (its
ranks wait in ``recv``), so the job whose turn it is has the machine as it would alone.

A window's time is the slower rank's, measured inside the ranks around ``train(...)``: the same
clock and the same code for every job. What a launcher adds while its ranks train (dtwork: the
kernel polling the cell, the engines' threads) lands in its windows; what runs in neither (the
coordinator's socket writes and reads between windows) is outside them.
"""

from __future__ import annotations

import random
import socket
import statistics
import threading
import time
from typing import Any

from benchmarks.util import bootstrap_ci, geometric_mean_ci, median


class TurnsError(RuntimeError):
    pass


class Turns:
    """The coordinator: a listening socket on 127.0.0.1; every rank of every job connects once."""

    def __init__(self, jobs: dict[str, int], timeout: float = 180.0) -> None:
        self.jobs = dict(jobs)  # job name -> number of ranks
        self.timeout = timeout
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(sum(self.jobs.values()) + 4)
        self.port: int = self.server.getsockname()[1]
        self.conns: dict[str, dict[int, Any]] = {j: {} for j in self.jobs}
        self._socks: list[socket.socket] = []
        self._stopped = False

    def wait_for_jobs(self, alive: Any = None) -> None:
        """Accept connections until every rank of every job said hello (``alive()`` False: give up)."""
        deadline = time.monotonic() + self.timeout
        self.server.settimeout(0.5)
        while any(len(self.conns[j]) < n for j, n in self.jobs.items()):
            if time.monotonic() > deadline:
                missing = {j: n - len(self.conns[j]) for j, n in self.jobs.items() if len(self.conns[j]) < n}
                raise TurnsError(f"ranks never connected within {self.timeout:.0f} s: {missing}")
            if alive is not None and not alive():
                raise TurnsError("a job ended before all its ranks connected")
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            sock.settimeout(self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks.append(sock)
            f = sock.makefile("rw")
            hello = f.readline().split()
            if len(hello) != 3 or hello[0] != "HELLO" or hello[1] not in self.jobs:
                raise TurnsError(f"unexpected hello {hello!r}")
            self.conns[hello[1]][int(hello[2])] = f

    def window(self, job: str, kind: str, steps: int) -> float:
        """Let ``job`` train ``steps`` steps of ``kind``; its slower rank's seconds."""
        ranks = self.conns[job]
        for f in ranks.values():
            f.write(f"RUN {kind} {steps}\n")
            f.flush()
        times = []
        for r, f in ranks.items():
            reply = f.readline().split()
            if len(reply) != 2 or reply[0] != "DONE":
                raise TurnsError(f"{job} rank {r} answered {reply!r} (did its training fail?)")
            times.append(float(reply[1]))
        return max(times)

    def cycles(
        self, kind: str, steps: int, cycles: int, warmup_cycles: int = 2, seed: int = 0
    ) -> dict[str, Any]:
        """``cycles`` cycles of one window per job, each cycle in a random order; the windows' seconds."""
        rng = random.Random(seed)
        jobs = list(self.jobs)
        for _ in range(warmup_cycles):
            for j in jobs:
                self.window(j, kind, steps)
        out: dict[str, list[float]] = {j: [] for j in jobs}
        orders = []
        for _ in range(cycles):
            order = jobs[:]
            rng.shuffle(order)
            orders.append(order)
            for j in order:
                out[j].append(self.window(j, kind, steps))
        return {"seconds": out, "orders": orders, "steps": steps}

    def stop(self) -> None:
        """Tell every connected rank to leave its loop, then close everything (once)."""
        if self._stopped:
            return
        self._stopped = True
        for ranks in self.conns.values():
            for f in ranks.values():
                try:
                    f.write("STOP\n")
                    f.flush()
                except (OSError, ValueError):
                    pass
        for sock in self._socks:
            try:
                sock.close()
            except OSError:
                pass
        self.server.close()


def turns_summary(seconds: dict[str, list[float]], job: str, reference: str, steps: int) -> dict[str, Any]:
    """``job``'s throughput over ``reference``'s, cycle by cycle (reference seconds / job seconds).

    The headline is the median over cycles with a bootstrap interval; the ratio of the totals is
    kept beside it, with the scatter of one cycle's ratio.
    """
    a, b = seconds[job], seconds[reference]
    if not a or len(a) != len(b) or min(a + b) <= 0:
        raise ValueError("every cycle needs a positive window of both jobs")
    pairs = [y / x for x, y in zip(a, b, strict=True)]
    return {
        "cycles": len(pairs),
        "ratio": median(pairs),
        "ci95": bootstrap_ci(pairs),
        "ratio_of_totals": sum(b) / sum(a),
        "pair_sd": statistics.stdev(pairs) if len(pairs) > 1 else None,
        "window_s": {job: median(a), reference: median(b)},
        "steps_per_s": {job: steps / sum(a) * len(a), reference: steps / sum(b) * len(b)},
        "pair_ratios": pairs,
    }


def run_in_turns(
    turns: Turns, plan: dict[str, tuple[int, int]], seed: int = 0, alive: Any = None, log: Any = None
) -> tuple[threading.Thread, dict[str, Any]]:
    """Drive ``turns`` in a thread (the caller's thread runs a job's blocking cell meanwhile).

    ``plan``: kind -> (steps per window, cycles). The returned dict fills in as it goes: per kind
    the ``cycles`` result, and ``error`` if something failed; the thread always ends with
    ``turns.stop()``, which releases every job.
    """
    out: dict[str, Any] = {}

    def go() -> None:
        try:
            turns.wait_for_jobs(alive)
            for i, (kind, (steps, n)) in enumerate(plan.items()):
                if log is not None:
                    log(f"launchers in turns ({kind}: {n} cycles of {steps}-step windows)")
                out[kind] = turns.cycles(kind, steps, n, seed=seed + i)
        except Exception as exc:  # reported by the caller; the jobs are released below
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            turns.stop()

    t = threading.Thread(target=go, name="bench-turns", daemon=True)
    t.start()
    return t, out


def blocks_summary(
    blocks: list[dict[str, list[float]]], job: str, reference: str, steps: int
) -> dict[str, Any]:
    """Over blocks, each a fresh launch of every job: the block's ratio of totals, then their geometric mean.

    Launches differ: two launches of the *same* torchrun job on this machine have run at ratios of
    0.96-1.06 to each other (where the process's memory landed, which CPU each rank got...), a
    spread that the cycles inside one launch cannot show. So the interval is a t-interval over
    blocks (independent launches), not over cycles; ``within_block`` keeps the cycles' view.
    """
    if not blocks:
        raise ValueError("no blocks")
    per_block = [turns_summary(b, job, reference, steps) for b in blocks]
    ratios = [b["ratio_of_totals"] for b in per_block]
    gm, ci95 = geometric_mean_ci(ratios)
    pooled = {j: [x for b in blocks for x in b[j]] for j in (job, reference)}
    pooled_summary = turns_summary(pooled, job, reference, steps)
    return {
        "blocks": len(blocks),
        "ratio": gm,
        "ci95": ci95,
        "block_ratios": ratios,
        "block_sd": statistics.stdev(ratios) if len(ratios) > 1 else None,
        "cycles": pooled_summary["cycles"],
        "steps_per_window": steps,
        "within_block": {k: pooled_summary[k] for k in ("ratio", "ci95", "ratio_of_totals", "pair_sd")},
        "window_s": pooled_summary["window_s"],
        "steps_per_s": pooled_summary["steps_per_s"],
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.turns JOB,JOB[,JOB] [--cycles N] [--blocks B]``: jobs in turns, ratios to the first.

    JOB: ``dtwork``, ``raw`` (raw ipyparallel) or ``torchrun`` / ``torchrunNAME`` (each its own launch).
    ``torchrun,torchrun2`` is the A/A control: two launches of the same job, which should be 1.0.
    """
    import argparse
    import json
    import sys

    from benchmarks import workload as W
    from benchmarks.runners import DtworkRunner, RawIpyparallelRunner, TorchrunRunner

    ap = argparse.ArgumentParser(prog="python -m benchmarks.turns", description=main.__doc__)
    ap.add_argument("jobs", help="comma-separated: dtwork, raw, torchrun, torchrun2, ...")
    ap.add_argument("--cycles", type=int, default=60, help="MLP cycles per block (convnet: half)")
    ap.add_argument("--blocks", type=int, default=1, help="fresh launches of every job")
    args = ap.parse_args(argv)
    jobs = args.jobs.split(",")
    bad = [j for j in jobs if j not in ("dtwork", "raw") and not j.startswith("torchrun")]
    if len(jobs) < 2 or len(set(jobs)) != len(jobs) or bad:
        ap.error("give two or more distinct jobs among dtwork, raw, torchrun, torchrunNAME")
    plan = {"mlp": (30, args.cycles), "convnet": (8, max(1, args.cycles // 2))}
    blocks: list[dict[str, Any]] = []
    for b in range(args.blocks):
        turns = Turns({j: 2 for j in jobs})
        procs: list[Any] = []
        pending: list[Any] = []
        runners: list[Any] = []
        try:
            for j in jobs:
                if j.startswith("torchrun"):
                    procs.append(TorchrunRunner().serve(turns.port, W.KINDS, job=j))
            if "raw" in jobs:
                raw = RawIpyparallelRunner()
                runners.append(raw)
                raw.start()
                raw.setup()
                pending.append(raw.view.execute(W.turns_cell(turns.port, "raw"), block=False))
            dt = None
            if "dtwork" in jobs:
                dt = DtworkRunner()
                runners.append(dt)
                dt.start()
                dt.setup()
            thread, out = run_in_turns(
                turns,
                plan,
                seed=b,
                alive=lambda ps=procs: all(p.poll() is None for p in ps),
                log=lambda m: print(m, file=sys.stderr, flush=True),
            )
            if dt is not None:
                dt.run(W.turns_cell(turns.port, "dtwork"))
            thread.join()
            for ar in pending:
                ar.get()
        finally:
            turns.stop()
            for proc in procs:
                proc.communicate(timeout=60)
            for r in runners:
                r.stop()
        if out.get("error"):
            print(out["error"], file=sys.stderr)
            return 1
        blocks.append(out)
        for k, (steps, _) in plan.items():
            for other in jobs[1:]:
                s = turns_summary(out[k]["seconds"], jobs[0], other, steps)
                print(
                    json.dumps(
                        {
                            "block": b,
                            "kind": k,
                            "ratio": f"{jobs[0]} / {other}",
                            "median": round(s["ratio"], 4),
                            "ci95": [round(x, 4) for x in s["ci95"] or []],
                            "ratio_of_totals": round(s["ratio_of_totals"], 4),
                        }
                    ),
                    flush=True,
                )
    if args.blocks > 1:
        for k, (steps, _) in plan.items():
            for other in jobs[1:]:
                s = blocks_summary([blk[k]["seconds"] for blk in blocks], jobs[0], other, steps)
                print(
                    json.dumps(
                        {
                            "kind": k,
                            "ratio": f"{jobs[0]} / {other}",
                            "blocks": s["blocks"],
                            "geometric_mean": round(s["ratio"], 4),
                            "ci95": [round(x, 4) for x in s["ci95"]],
                            "block_ratios": [round(x, 4) for x in s["block_ratios"]],
                        }
                    ),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
