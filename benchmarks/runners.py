"""The launchers, each running the workload: dtwork, raw ipyparallel, torchrun, Accelerate, Fabric.

Each answers the same questions, so that the suite can take them in turn: steps/s measured inside
the ranks after a warmup, and the seconds from submitting a changed training cell to its first
finished step on all ranks. torchrun, Accelerate and Fabric relaunch for every change.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import workload as W
from benchmarks.util import ROOT, free_port, silenced
from benchmarks.windows import ENGINE_SOURCE

if TYPE_CHECKING:
    from dtwork import Cluster

KINDS = W.KINDS


class CellRunner:
    """The runners whose ranks keep their state between cells (dtwork, raw ipyparallel)."""

    def run(self, source: str) -> Any:
        raise NotImplementedError

    def pull(self, name: str) -> list[Any]:
        raise NotImplementedError

    def setup(self) -> None:
        self.run(W.SETUP_CELL)

    def seconds(self, source: str) -> float:
        t0 = time.perf_counter()
        self.run(source)
        return time.perf_counter() - t0

    def throughput(self, kind: str, warmup: int, steps: int) -> float:
        self.run(W.TIMED_CELL.format(kind=kind, warmup=warmup, steps=steps))
        return float(min(self.pull("_sps")))

    def iterate(self, kind: str) -> float:
        return self.seconds(W.CHANGED_CELL.format(kind=kind))


class DtworkRunner(CellRunner):
    """``dtwork.start`` and cells through ``Cluster.run``, the ``%%dtrain`` path."""

    def __init__(self, ranks: int = 2) -> None:
        self.ranks = ranks
        self.cluster: Cluster | None = None

    def start(self) -> float:
        import dtwork

        t0 = time.perf_counter()
        self.cluster = dtwork.start(n=self.ranks, backend="gloo")
        return time.perf_counter() - t0

    def setup(self) -> None:
        self.run(W.SETUP_CELL + W.DTWORK_SOURCE + ENGINE_SOURCE)

    def run(self, source: str, *, quiet: bool = False, live: bool = True) -> Any:
        """Run a cell as ``%%dtrain`` does (output shown, live view on) unless told otherwise."""
        assert self.cluster is not None
        self.cluster.session.live = live
        with silenced():
            return self.cluster.run(source, quiet=quiet)

    def pull(self, name: str) -> list[Any]:
        assert self.cluster is not None
        return list(self.cluster.pull(name))

    def throughput_steps(self, kind: str, warmup: int, steps: int) -> float:
        """Steps/s in dtwork's idiom (ctx.wrap + ctx.steps + ctx.log)."""
        self.run(W.TIMED_STEPS_CELL.format(kind=kind, total=warmup + steps, warmup=warmup))
        return float(min(self.pull("_sps")))

    def round_trip(self) -> float:
        t0 = time.perf_counter()
        self.run("pass", quiet=True)
        return time.perf_counter() - t0

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


HAND_DDP_SETUP = """
import torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size={world_size})
dist.barrier()
"""


class RawIpyparallelRunner(CellRunner):
    """``ipyparallel.Cluster(n=2).start_and_connect_sync()``, cells through ``view.execute`` as ``%px``."""

    def __init__(self, n: int = 2) -> None:
        self.n = n
        self.ipp_cluster: Any = None
        self.client: Any = None
        self.view: Any = None
        self.engines_s = 0.0

    def start(self, ddp: bool = True) -> float:
        """ipyparallel's own start, then (``ddp``) the hand-written DDP setup; seconds to the end."""
        import ipyparallel as ipp

        t0 = time.perf_counter()
        cluster_id = f"bench-raw-{os.getpid()}-{time.time_ns() % 10**8}"
        self.ipp_cluster = ipp.Cluster(n=self.n, log_level=30, cluster_id=cluster_id)
        self.client = self.ipp_cluster.start_and_connect_sync()
        self.view = self.client[:]
        self.engines_s = time.perf_counter() - t0
        if ddp:
            self.join_process_group()
        return time.perf_counter() - t0

    def join_process_group(self) -> None:
        """What a ``%%px`` user writes: ranks, a port, init_process_group."""
        self.view.scatter("rank", list(range(self.n)), flatten=True, block=True)
        self.run(HAND_DDP_SETUP.format(port=free_port(), world_size=self.n))

    def run(self, source: str) -> Any:
        return self.view.execute(source, silent=False, block=True).get()

    def pull(self, name: str) -> list[Any]:
        return list(self.view.pull(name, block=True))

    def round_trip(self) -> float:
        t0 = time.perf_counter()
        self.view.execute("pass", block=True)
        return time.perf_counter() - t0

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        with contextlib.suppress(Exception):
            self.ipp_cluster.stop_cluster_sync()
        self.client = self.ipp_cluster = None


def _bench_line(text: str) -> dict[str, Any]:
    line = next((ln for ln in text.splitlines() if ln.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError("no BENCH line in the output:\n" + text[-2000:])
    out: dict[str, Any] = json.loads(line[len("BENCH ") :])
    return out


class TorchrunRunner:
    """``torchrun --standalone --nproc_per_node=2`` on a script holding the workload: a launch each time."""

    def __init__(self, timeout: float = 300.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dtwork-bench-torchrun-"))
        self.script = self.dir / "bench_ddp.py"
        self.script.write_text(W.torchrun_script())
        self.timeout = timeout
        self.cold_starts: list[float] = []

    def _args(self, spec: dict[str, Any]) -> dict[str, Any]:
        env = {**os.environ, "BENCH_T0": repr(time.time())}
        env.pop("OMP_NUM_THREADS", None)  # torchrun's own default, one thread per worker, applies
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        return {"args": [*cmd, str(self.script), json.dumps(spec)], "env": env, "cwd": self.dir, "text": True}

    def launch(self, spec: dict[str, Any]) -> tuple[dict[str, Any], float]:
        t0 = time.perf_counter()
        proc = subprocess.run(**self._args(spec), capture_output=True, timeout=self.timeout)
        wall = time.perf_counter() - t0
        if proc.returncode != 0 and "BENCH " not in proc.stdout:  # a failed teardown keeps the numbers
            raise RuntimeError(f"torchrun exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        out = _bench_line(proc.stdout)
        self.cold_starts.append(out["ready_s"])
        return out, wall

    def serve(self, port: int, kinds: tuple[str, ...]) -> subprocess.Popen[str]:
        """Workers that train in turns (``benchmarks.turns``) until the coordinator says stop."""
        spec = {"mode": "serve", "port": port, "kinds": list(kinds), "job": "torchrun"}
        return subprocess.Popen(**self._args(spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def throughput_many(self, warmup: dict[str, int], steps: dict[str, int]) -> dict[str, float]:
        out, _ = self.launch({"mode": "throughput", "kinds": list(KINDS), "warmup": warmup, "steps": steps})
        return {k: float(v) for k, v in out["results"].items()}

    def iterate(self, kind: str) -> tuple[float, float]:
        """Seconds of the whole relaunch, and from the launch to the first finished step."""
        out, wall = self.launch({"mode": "latency", "kinds": [kind]})
        return wall, float(out["first_step_s"])

    def stop(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def missing(name: str) -> str | None:
    """Why an optional launcher is skipped (its package is not installed), or None."""
    module = {"accelerate": "accelerate", "fabric": "lightning"}[name]
    with contextlib.suppress(ImportError, ValueError):
        if importlib.util.find_spec(module) is not None:
            return None
    return f"skipped: not installed (pip install {module})"


class LaunchWorkerRunner:
    """JSON lines to ``python -m benchmarks.launch_worker NAME``, a notebook kernel that forks the workers."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cold_starts: list[float] = []
        args = [sys.executable, "-m", "benchmarks.launch_worker", name]
        pipe, quiet = subprocess.PIPE, subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdin=pipe, stdout=pipe, stderr=quiet, text=True, cwd=ROOT)
        self.import_s = float(self._read()["import_s"])  # the library imported, or RuntimeError

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("BENCH "):
                out: dict[str, Any] = json.loads(line[len("BENCH ") :])
                if not out.get("ok"):
                    raise RuntimeError(f"{self.name}: {out.get('error')}")
                return out
        raise RuntimeError(f"{self.name} worker exited (code {self.proc.poll()})")

    def request(self, spec: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        out = self._read()
        self.cold_starts.append(out["ready_s"])
        return out

    def throughput_many(self, warmup: dict[str, int], steps: dict[str, int]) -> dict[str, float]:
        out = self.request({"mode": "throughput", "kinds": list(KINDS), "warmup": warmup, "steps": steps})
        return {k: float(v) for k, v in out["results"].items()}

    def iterate(self, kind: str) -> tuple[float, float]:
        out = self.request({"mode": "latency", "kinds": [kind]})
        return float(out["wall_s"]), float(out["first_step_s"])

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.proc.kill()
