"""Cold start: one fresh "notebook kernel" process per sample, from nothing imported to a ready group.

``python -m benchmarks.coldstart dtwork|raw OUT.json`` times the import and the start of a 2-rank
cluster in a process that has done nothing else: ``dtwork.start(n=2)``; raw ipyparallel's own start,
then the hand-written DDP setup.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.stats import bootstrap_ci, median, ratio, summarize
from benchmarks.util import ROOT, exit_on_sigterm, log

T_PROCESS = time.perf_counter()


def sample(which: str) -> dict[str, Any]:
    from benchmarks.runners import DtworkRunner, RawIpyparallelRunner

    t0 = time.perf_counter()
    if which == "dtwork":
        import dtwork.cluster  # noqa: F401
    else:
        import ipyparallel  # noqa: F401
    out: dict[str, Any] = {"import_s": time.perf_counter() - t0}
    r = DtworkRunner() if which == "dtwork" else RawIpyparallelRunner()
    try:
        if isinstance(r, DtworkRunner):
            out["start_s"] = r.start()
        else:
            out["engines_s"] = r.start(ddp=False)
            t1 = time.perf_counter()
            r.join_process_group()
            out["start_s"] = r.engines_s + time.perf_counter() - t1  # engines + the hand-written DDP setup
    finally:
        r.stop()
    return out


class ColdStarts:
    """The fresh processes, dtwork and raw alternating: one at a time in a full run; all at once,
    alongside the rest, in a smoke run (which only checks that everything runs)."""

    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.tmp = Path(tempfile.mkdtemp(prefix="dtwork-bench-cold-"))
        self.jobs: list[tuple[str, Path, subprocess.Popen[str]]] = []
        self.samples: dict[str, list[dict[str, Any]]] = {"dtwork": [], "raw": []}
        self.errors: list[str] = []

    def start(self, sequential: bool) -> None:
        for rep in range(self.reps):
            for which in ("dtwork", "raw") if rep % 2 == 0 else ("raw", "dtwork"):
                log(f"cold start {which} ({rep + 1}/{self.reps})")
                path = self.tmp / f"{which}-{rep}.json"
                cmd = [sys.executable, "-m", "benchmarks.coldstart", which, str(path)]
                proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
                self.jobs.append((which, path, proc))
                if sequential:
                    self._collect()

    def _collect(self) -> None:
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

    def results(self) -> dict[str, Any]:
        self._collect()
        return summary(self.samples, self.errors)

    def abort(self) -> None:
        for _, _, proc in self.jobs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def summary(samples: dict[str, list[dict[str, Any]]], errors: list[str]) -> dict[str, Any]:
    def col(which: str, key: str) -> list[float]:
        return [s[key] for s in samples[which] if s.get(key) is not None]

    d, raw, raw_ddp = col("dtwork", "start_s"), col("raw", "engines_s"), col("raw", "start_s")
    cold = {
        "dtwork_s": summarize(d),
        "raw_ipyparallel_s": summarize(raw),
        "raw_ipyparallel_ddp_s": summarize(raw_ddp),
        "ratio_vs_raw_ipyparallel": ratio(median(d), median(raw)),
        "ratio_vs_raw_ipyparallel_ci95": bootstrap_ci(d, raw),
        "import_s": {
            "dtwork": median(col("dtwork", "import_s")),
            "ipyparallel": median(col("raw", "import_s")),
        },
        "errors": errors,
    }
    return cold


if __name__ == "__main__":
    exit_on_sigterm()
    argv = sys.argv[1:]
    out = sample(argv[0])
    out["process_s"] = time.perf_counter() - T_PROCESS
    Path(argv[1]).write_text(json.dumps(out))
