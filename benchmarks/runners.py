"""How each launcher runs the workload: the same training code, five ways.

Every runner answers the same questions, so the suite can interleave them: steps/s measured
inside the ranks after a warmup (``throughput(kind, ...)``; ``throughput_many(kinds, ...)`` for
the launchers that start processes, where one launch measures every workload), and the seconds
from submitting a changed training cell to its first finished step on all ranks (``iterate``).
The launchers also collect cold-start samples (seconds from the launch to a ready process group).

- ``DtworkRunner``: ``dtwork.start`` and cells through ``Cluster.run`` (the ``%%dtrain`` path,
  with its defaults: output shown, live dashboard on, run store written). State lives between
  cells, so a changed cell reuses the model and data already on the ranks.
- ``RawIpyparallelRunner``: ``ipyparallel.Cluster(n=2)`` and ``DirectView.execute(block=True)``
  (what ``%px`` does), with the DDP setup written by hand (``init_process_group`` on each engine).
- ``TorchrunRunner``: ``torchrun --standalone --nproc_per_node=2`` (run as ``python -m
  torch.distributed.run``, the same entry point) on a script holding the same source; every
  iteration is a relaunch.
- ``LaunchWorkerRunner``: HuggingFace Accelerate's ``notebook_launcher`` or Lightning Fabric's
  ``ddp_notebook`` strategy, driven inside a separate "notebook kernel" process
  (``benchmarks.launch_worker``) so that their fork happens in a process without zmq threads.
"""

from __future__ import annotations

import abc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import workload as W
from benchmarks.util import free_port, silenced

KINDS = W.KINDS


class RunnerError(RuntimeError):
    pass


class CellRunner(abc.ABC):
    """What the in-process runners share: cells run on both engines, values pulled back by name."""

    @abc.abstractmethod
    def run(self, source: str) -> Any: ...

    @abc.abstractmethod
    def pull(self, name: str) -> list[Any]: ...

    def setup(self, kinds: tuple[str, ...] = KINDS) -> None:
        self.run(W.setup_cell(kinds))

    def throughput(self, kind: str, warmup: int, steps: int, threads: str = "pinned") -> float:
        self.run(W.timed_cell(kind, warmup, steps, threads))
        return min(self.pull("_sps"))

    def iterate(self, kind: str) -> float:
        t0 = time.perf_counter()
        self.run(W.changed_cell(kind))
        return time.perf_counter() - t0


# -- dtwork ------------------------------------------------------------------------------------------


class DtworkRunner(CellRunner):
    name = "dtwork"

    def __init__(self, ranks: int = 2) -> None:
        self.ranks = ranks
        self.cluster: Any = None
        self.start_s: float | None = None

    def start(self) -> float:
        import dtwork

        t0 = time.perf_counter()
        self.cluster = dtwork.start(n=self.ranks, backend="gloo")
        self.start_s = time.perf_counter() - t0
        return self.start_s

    def run(self, source: str, *, quiet: bool = False, live: bool = True) -> Any:
        """Run a cell as ``%%dtrain`` does (output shown, dashboard live) unless told otherwise."""
        self.cluster.session.live = live
        with silenced():
            return self.cluster.run(source, quiet=quiet)

    def pull(self, name: str) -> list[Any]:
        return self.cluster.pull(name)

    def iterate_steps(self) -> float:
        """The changed cell in dtwork's idiom (ctx.steps, ctx.log): needs ``LATENCY_STEPS_SETUP`` first."""
        t0 = time.perf_counter()
        self.run(W.CHANGED_STEPS_CELL)
        return time.perf_counter() - t0

    def round_trip(self, quiet: bool = True) -> float:
        t0 = time.perf_counter()
        self.run("pass", quiet=quiet)
        return time.perf_counter() - t0

    def engine_pids(self) -> list[int]:
        return [int(r["pid"]) for r in self.cluster.rank_info]

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


# -- raw ipyparallel with hand-written DDP setup ---------------------------------------------------------

HAND_DDP_SETUP = """
import torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size={world_size})
dist.barrier()
"""


class RawIpyparallelRunner(CellRunner):
    """``ipyparallel.Cluster(n=2).start_and_connect_sync()``; cells via ``view.execute(block=True)``."""

    name = "raw_ipyparallel"

    def __init__(self, n: int = 2) -> None:
        self.n = n
        self.ipp_cluster: Any = None
        self.client: Any = None
        self.view: Any = None
        self.engines_s: float | None = None
        self.ddp_s: float | None = None

    def start(self, ddp: bool = True) -> float:
        """Start the engines (timed as ipyparallel's own start), then join them by hand (timed too)."""
        import ipyparallel as ipp

        t0 = time.perf_counter()
        self.ipp_cluster = ipp.Cluster(
            n=self.n, log_level=30, cluster_id=f"bench-raw-{os.getpid()}-{time.time_ns() % 10**8}"
        )
        self.client = self.ipp_cluster.start_and_connect_sync()
        self.view = self.client[:]
        self.engines_s = time.perf_counter() - t0
        if ddp:
            self.join_process_group()
            self.ddp_s = time.perf_counter() - t0
        return self.ddp_s if ddp else self.engines_s

    def join_process_group(self) -> None:
        """The hand-written DDP setup a ``%%px`` user writes: ranks, a port, init_process_group."""
        self.view.scatter("rank", list(range(self.n)), flatten=True, block=True)
        self.run(HAND_DDP_SETUP.format(port=free_port(), world_size=self.n))

    def run(self, source: str) -> Any:
        ar = self.view.execute(source, silent=False, block=True)
        ar.get()
        return ar

    def pull(self, name: str) -> list[Any]:
        return list(self.view.pull(name, block=True))

    def round_trip(self) -> float:
        t0 = time.perf_counter()
        self.view.execute("pass", block=True)
        return time.perf_counter() - t0

    def engine_pids(self) -> list[int]:
        return [int(p) for p in self.view.apply_sync(os.getpid)]

    def stop(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
            self.client = None
        if self.ipp_cluster is not None:
            try:
                self.ipp_cluster.stop_cluster_sync()
            except Exception:
                pass
            self.ipp_cluster = None


# -- torchrun --------------------------------------------------------------------------------------------


def _bench_line(text: str) -> dict[str, Any]:
    for line in text.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[len("BENCH ") :])
    raise RunnerError("no BENCH line in the output:\n" + text[-2000:])


class TorchrunRunner:
    """``torchrun --standalone --nproc_per_node=2 bench_script.py SPEC``: a fresh launch every time."""

    name = "torchrun"

    def __init__(self, timeout: float = 300.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dtwork-bench-torchrun-"))
        self.script = self.dir / "bench_ddp.py"
        self.script.write_text(W.torchrun_script())
        self.timeout = timeout
        self.cold_starts: list[float] = []
        self.default_threads: int | None = None
        self.teardown_failures = 0

    def command(self, spec: dict[str, Any]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(self.script),
            json.dumps(spec),
        ]

    def launch(self, spec: dict[str, Any]) -> tuple[dict[str, Any], float]:
        env = {**os.environ, "BENCH_T0": repr(time.time())}
        env.pop("OMP_NUM_THREADS", None)  # torchrun's own default (1 per worker) applies
        t0 = time.perf_counter()
        proc = subprocess.run(
            self.command(spec), env=env, capture_output=True, text=True, timeout=self.timeout, cwd=self.dir
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0 and "BENCH " not in proc.stdout:
            raise RunnerError(f"torchrun exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        if proc.returncode != 0:  # measured, then failed while tearing down: keep the numbers, say so
            self.teardown_failures += 1
        out = _bench_line(proc.stdout)
        self.cold_starts.append(out["ready_s"])
        self.default_threads = out.get("default_threads")
        return out, wall

    def serve(self, port: int, kinds: tuple[str, ...], job: str = "torchrun") -> subprocess.Popen[str]:
        """Launch workers that train in turns (``benchmarks.turns``) until the coordinator says stop."""
        env = {**os.environ, "BENCH_T0": repr(time.time())}
        env.pop("OMP_NUM_THREADS", None)
        spec = {"mode": "serve", "port": port, "kinds": list(kinds), "job": job}
        return subprocess.Popen(
            self.command(spec),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.dir,
        )

    def throughput_many(
        self, kinds: tuple[str, ...], warmup: dict[str, int], steps: dict[str, int]
    ) -> dict[str, float]:
        out, _ = self.launch({"mode": "throughput", "kinds": list(kinds), "warmup": warmup, "steps": steps})
        return {k: float(v) for k, v in out["results"].items()}

    def iterate(self, kind: str) -> tuple[float, float]:
        """(wall seconds of the whole relaunch, seconds from launch to the first finished step)."""
        out, wall = self.launch({"mode": "latency", "kinds": [kind]})
        return wall, float(out["first_step_s"])

    def stop(self) -> None:
        for p in self.dir.iterdir():
            p.unlink()
        self.dir.rmdir()


# -- Accelerate / Fabric, driven in a separate "notebook kernel" process -----------------------------


def probe_optional(name: str) -> str | None:
    """None when this interpreter has the launcher's package, else why it is skipped.

    Only looked up here (``find_spec``): the import itself happens in the launch worker, whose
    failure to start is recorded as the reason instead.
    """
    import importlib.util

    module, pip = {"accelerate": ("accelerate", "accelerate"), "fabric": ("lightning", "lightning")}[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"skipped: not installed (pip install {pip})"


class LaunchWorkerRunner:
    """Talk JSON lines to ``python -m benchmarks.launch_worker NAME`` (a notebook kernel stand-in)."""

    def __init__(self, name: str, timeout: float = 300.0) -> None:
        self.name = name
        self.timeout = timeout
        self.cold_starts: list[float] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.launch_worker", name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if os.environ.get("BENCH_DEBUG") is None else None,
            text=True,
            cwd=str(Path(__file__).resolve().parent.parent),
            start_new_session=False,
        )
        self.import_s: float | None = None

    def wait_ready(self) -> None:
        """Read the worker's hello: the library imported (or why it could not be)."""
        hello = self._read()
        self.import_s = hello.get("import_s")
        if not hello.get("ok"):
            raise RunnerError(hello.get("error", "launch worker failed to start"))

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RunnerError(f"{self.name} worker exited (code {self.proc.poll()})")
            if line.startswith("BENCH "):
                return json.loads(line[len("BENCH ") :])

    def request(self, spec: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        out = self._read()
        if not out.get("ok"):
            raise RunnerError(f"{self.name}: {out.get('error')}")
        if "ready_s" in out:
            self.cold_starts.append(out["ready_s"])
        return out

    def throughput_many(
        self, kinds: tuple[str, ...], warmup: dict[str, int], steps: dict[str, int]
    ) -> dict[str, float]:
        out = self.request({"mode": "throughput", "kinds": list(kinds), "warmup": warmup, "steps": steps})
        return {k: float(v) for k, v in out["results"].items()}

    def iterate(self, kind: str) -> tuple[float, float]:
        out = self.request({"mode": "latency", "kinds": [kind]})
        return float(out["wall_s"]), float(out["first_step_s"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait()
