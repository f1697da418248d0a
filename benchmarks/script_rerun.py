"""Re-running an unchanged torchrun script on warm ranks (``%dtrain run``) against relaunching it.

``python -m benchmarks.script_rerun [--reps N] [--epochs E]``: the PyTorch DDP tutorial's script
(tests/fixtures/ddp_tutorial.py) run from scratch each time, in turns: ``Cluster.run_script`` on a
running 2-rank gloo cluster, and ``torchrun --standalone --nproc_per_node=2``, same file, same
arguments, the order drawn at random in every repetition. A repetition's latency is the wall time
from the request to the script's end, as the researcher waits for it. Writes
``benchmarks/results/script_rerun.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.stats import bootstrap_ci, median, ratio, summarize
from benchmarks.util import ROOT, exit_on_sigterm, git_commit, log, machine, now, silenced, versions

SCRIPT = ROOT / "tests" / "fixtures" / "ddp_tutorial.py"


def _args(folder: Path, epochs: int) -> list[str]:
    return [str(epochs), "1000", "--snapshot", str(folder / "snapshot.pt"), "--out", str(folder / "final.pt")]


def torchrun_once(folder: Path, epochs: int) -> float:
    """Seconds of one torchrun launch of the script, from the command to its exit."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*cmd, str(SCRIPT), *_args(folder, epochs)], cwd=folder, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall


def warm_once(cluster: Any, folder: Path, epochs: int) -> float:
    """Seconds of one ``Cluster.run_script`` of the script on the warm ranks."""
    t0 = time.perf_counter()
    with silenced():
        cluster.run_script(SCRIPT, _args(folder, epochs))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.script_rerun", description=__doc__)
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each, in turns")
    ap.add_argument("--epochs", type=int, default=2, help="the script's epochs (8 steps each)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "script_rerun.json")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    import dtwork

    tmp = Path(tempfile.mkdtemp(prefix="dtwork-bench-script-"))
    os.environ.setdefault("DTWORK_STORE", str(tmp / "runs.sqlite"))
    cluster = dtwork.start(n=2, backend="gloo")
    cluster.session.live = False
    seconds: dict[str, list[float]] = {"dtwork": [], "torchrun": []}
    run = {
        "dtwork": lambda f: warm_once(cluster, f, args.epochs),
        "torchrun": lambda f: torchrun_once(f, args.epochs),
    }
    try:
        first = warm_once(cluster, tmp, args.epochs)  # the first run imports what the script imports
        rng = random.Random(0)
        for rep in range(args.reps):
            for name in rng.sample(list(run), len(run)):
                folder = Path(tempfile.mkdtemp(dir=tmp))  # no snapshot: every run trains from scratch
                seconds[name].append(run[name](folder))
            log(
                f"script re-run, repetition {rep + 1}/{args.reps}: "
                + str({k: v[-1] for k, v in seconds.items()})
            )
    finally:
        cluster.stop()
    result = {
        "command": shlex.join(["python", "-m", "benchmarks.script_rerun", *(argv or sys.argv[1:])]),
        "when": now(),
        "commit": git_commit(),
        "machine": machine(),
        "versions": versions(),
        "script": str(SCRIPT.relative_to(ROOT)),
        "first_warm_run_s": first,
        "seconds": {k: summarize(v) for k, v in seconds.items()},
        "speedup": ratio(median(seconds["torchrun"]), median(seconds["dtwork"])),
        "speedup_ci95": bootstrap_ci(seconds["torchrun"], seconds["dtwork"]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"re-run on warm ranks {median(seconds['dtwork']):.3f} s, torchrun relaunch "
        f"{median(seconds['torchrun']):.2f} s: {result['speedup']:.1f}x faster (95% CI {result['speedup_ci95']})"
    )
    return result


if __name__ == "__main__":
    main()
