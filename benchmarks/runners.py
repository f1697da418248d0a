"""The launchers, each running the workload: dtwork, raw ipyparallel, torchrun, Accelerate, Fabric.

Each answers the same questions (steps/s inside the ranks after a warmup; seconds from a changed training
cell to its first finished step), so that the suite can take them in turn; torchrun and the rest relaunch.

``python -m benchmarks.runners accelerate|fabric`` is the notebook process that Accelerate and Fabric fork
their workers from: it imports the launcher, then answers a ``BENCH`` line per JSON spec on stdin
(``throughput``: a launch measuring steps/s; ``latency``: a launch, one step), each with ``ready_s``.

``python -m benchmarks.runners cold dtwork|raw OUT.json``: a cold start (``ColdStarts``), the import and start
of a 2-rank cluster in a process that did nothing else, from nothing imported to a ready process group.
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
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from benchmarks import workload as W
from benchmarks.engine_source import ENGINE_SOURCE
from benchmarks.stats import bootstrap_ci, median, ratio, summarize
from benchmarks.util import ROOT, exit_on_sigterm, free_port, log, silenced

if TYPE_CHECKING:
    from dtwork import Cluster

T_PROCESS = time.perf_counter()
KINDS = W.KINDS
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


class CellRunner:
    """The runners whose ranks keep their state between cells (dtwork, raw ipyparallel)."""

    run: Any
    pull: Any

    def setup(self) -> None:
        self.run(W.SETUP_CELL)

    def seconds(self, source: str, **how: Any) -> float:
        t0 = time.perf_counter()
        self.run(source, **how)
        return time.perf_counter() - t0

    def sps(self, cell: str) -> float:
        """The slower rank's steps/s, as the cell leaves it in ``_sps``."""
        self.run(cell)
        return float(min(self.pull("_sps")))

    def throughput(self, kind: str, warmup: int, steps: int) -> float:
        return self.sps(W.TIMED_CELL.format(kind=kind, warmup=warmup, steps=steps))

    def iterate(self, kind: str) -> float:
        return self.seconds(W.CHANGED_CELL.format(kind=kind))


class DtworkRunner(CellRunner):
    """``dtwork.start`` and cells through ``Cluster.run``, the ``%%dtrain`` path."""

    def __init__(self, ranks: int = 2) -> None:
        self.ranks, self.cluster = ranks, cast("Cluster | None", None)

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
        return self.sps(W.TIMED_STEPS_CELL.format(kind=kind, total=warmup + steps, warmup=warmup))

    def round_trip(self) -> float:
        return self.seconds("pass", quiet=True)

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
        self.n, self.engines_s = n, 0.0
        self.ipp_cluster: Any = None
        self.client: Any = None
        self.view: Any = None

    def start(self, ddp: bool = True) -> float:
        """ipyparallel's own start, then (``ddp``) the hand-written DDP setup; seconds to the end."""
        import ipyparallel as ipp

        t0 = time.perf_counter()
        cluster_id = f"bench-raw-{os.getpid()}-{time.time_ns() % 10**8}"
        # engine_timeout: ipyparallel's 60 s default is not enough on a machine busy with other starts
        self.ipp_cluster = ipp.Cluster(n=self.n, log_level=30, cluster_id=cluster_id, engine_timeout=300)
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


class Relauncher:
    """The launchers that launch again for every change: a BENCH answer per request."""

    cold_starts: list[float]
    stop: Any
    request: Any  # spec -> (the BENCH answer, seconds)

    def throughput_many(self, warmup: dict[str, int], steps: dict[str, int]) -> dict[str, float]:
        out, _ = self.request({"mode": "throughput", "kinds": list(KINDS), "warmup": warmup, "steps": steps})
        return {k: float(v) for k, v in out["results"].items()}

    def iterate(self, kind: str) -> tuple[float, float]:
        """Seconds of the whole relaunch, and from the launch to the first finished step."""
        out, wall = self.request({"mode": "latency", "kinds": [kind]})
        return float(out.get("wall_s", wall)), float(out["first_step_s"])


def _bench_line(text: str) -> dict[str, Any]:
    line = next((ln for ln in text.splitlines() if ln.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError("no BENCH line in the output:\n" + text[-2000:])
    out: dict[str, Any] = json.loads(line[len("BENCH ") :])
    if not out.get("ok", True):
        raise RuntimeError(str(out.get("error")))
    return out


class TorchrunRunner(Relauncher):
    """``torchrun --standalone --nproc_per_node=2`` on a script holding the workload: a launch each time."""

    def __init__(self, timeout: float = 300.0) -> None:
        self.timeout, self.cold_starts = timeout, []
        self.dir = Path(tempfile.mkdtemp(prefix="dtwork-bench-torchrun-"))
        self.script = self.dir / "bench_ddp.py"
        self.script.write_text(W.torchrun_script())

    def _args(self, spec: dict[str, Any]) -> dict[str, Any]:
        env = {**os.environ, "BENCH_T0": repr(time.time())}
        env.pop("OMP_NUM_THREADS", None)  # torchrun's own default, one thread per worker, applies
        return dict(args=[*TORCHRUN, str(self.script), json.dumps(spec)], env=env, cwd=self.dir, text=True)

    def request(self, spec: dict[str, Any]) -> tuple[dict[str, Any], float]:
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

    def stop(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def missing(name: str) -> str | None:
    """Why an optional launcher is skipped (its package is not installed), or None."""
    module = {"accelerate": "accelerate", "fabric": "lightning"}[name]
    with contextlib.suppress(ImportError, ValueError):
        if importlib.util.find_spec(module) is not None:
            return None
    return f"skipped: not installed (pip install {module})"


class LaunchWorkerRunner(Relauncher):
    """JSON lines to ``python -m benchmarks.runners NAME``, a notebook kernel that forks the workers."""

    def __init__(self, name: str) -> None:
        self.name, self.cold_starts = name, []
        args = [sys.executable, "-m", "benchmarks.runners", name]
        pipe, quiet = subprocess.PIPE, subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdin=pipe, stdout=pipe, stderr=quiet, text=True, cwd=ROOT)
        self.import_s = float(self._read()["import_s"])  # the library imported, or RuntimeError

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("BENCH "):
                return _bench_line(line)
        raise RuntimeError(f"{self.name} worker exited (code {self.proc.poll()})")

    def request(self, spec: dict[str, Any]) -> tuple[dict[str, Any], float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        out = self._read()
        self.cold_starts.append(out["ready_s"])
        return out, 0.0

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.proc.kill()


def keep_one() -> None:
    """Start a kept cluster (with a run that trained) and end this process as a killed kernel would."""
    import dtwork

    c = dtwork.start(n=2, backend="gloo", keep="10m")
    with silenced():
        c.run("x = ctx.rank")
    os._exit(0)  # no stop, no atexit: the cluster stays, kept


def sample_attach() -> dict[str, Any]:
    """A kept cluster left by a process that ended, then a fresh one's ``attach``: timed as a cold
    start is (imports apart), in a dtwork home of its own."""
    home = Path(tempfile.mkdtemp(prefix="dtwork-bench-attach-"))
    os.environ["DTWORK_HOME"], os.environ["DTWORK_STORE"] = str(home), str(home / "runs.sqlite")
    try:
        subprocess.run(
            [sys.executable, "-m", "benchmarks.runners", "keep"], cwd=ROOT, check=True, timeout=300
        )
        t0 = time.perf_counter()
        __import__("dtwork.cluster")
        out: dict[str, Any] = {"import_s": time.perf_counter() - t0}
        import dtwork

        t1 = time.perf_counter()
        cluster = dtwork.attach()
        out["attach_s"] = time.perf_counter() - t1
        try:
            assert cluster.pull("x") == [0, 1], "the ranks' names did not survive"
        finally:
            cluster.stop()
        return out
    finally:
        shutil.rmtree(home, ignore_errors=True)


def sample(which: str) -> dict[str, Any]:
    if which == "attach":
        return sample_attach()
    t0 = time.perf_counter()
    __import__("dtwork.cluster" if which == "dtwork" else "ipyparallel")
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
        self.reps, self.tmp = reps, Path(tempfile.mkdtemp(prefix="dtwork-bench-cold-"))
        self.jobs: list[tuple[str, Path, subprocess.Popen[str]]] = []
        self.samples: dict[str, list[dict[str, Any]]] = {"dtwork": [], "raw": [], "attach": []}
        self.errors: list[str] = []

    def start(self, sequential: bool) -> None:
        for rep in range(self.reps):
            for which in ("dtwork", "raw", "attach") if rep % 2 == 0 else ("attach", "raw", "dtwork"):
                log(f"cold start {which} ({rep + 1}/{self.reps})")
                path = self.tmp / f"{which}-{rep}.json"
                cmd = [sys.executable, "-m", "benchmarks.runners", "cold", which, str(path)]
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

        def col(which: str, key: str) -> list[float]:
            return [s[key] for s in self.samples[which] if s.get(key) is not None]

        d, raw, raw_ddp = col("dtwork", "start_s"), col("raw", "engines_s"), col("raw", "start_s")
        out = dict(dtwork_s=summarize(d), raw_ipyparallel_s=summarize(raw), errors=self.errors)
        out["raw_ipyparallel_ddp_s"] = summarize(raw_ddp)
        out |= dict(ratio_vs_raw_ipyparallel=ratio(median(d), median(raw)))
        out["ratio_vs_raw_ipyparallel_ci95"] = bootstrap_ci(d, raw)
        imports = {"dtwork": median(col("dtwork", "import_s")), "ipyparallel": median(col("raw", "import_s"))}
        att = col("attach", "attach_s")  # a kept cluster taken up by a fresh process, beside the starts
        out |= dict(attach_s=summarize(att), attach_vs_start=ratio(median(att), median(d)))
        out["attach_vs_start_ci95"] = bootstrap_ci(att, d)
        return out | {"import_s": imports}

    def abort(self) -> None:
        for _, _, proc in self.jobs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _say(obj: dict[str, Any]) -> None:
    print("BENCH " + json.dumps(obj), flush=True)


def _measure(spec: dict[str, Any], prepare: Any, backward: Any, barrier: Any, t_call: float) -> dict:
    """Run the spec on this rank through the library's prepare/backward; what rank 0 reports."""
    ns: dict[str, Any] = {}
    exec(W.SOURCE, ns)
    torch, F = ns["torch"], ns["F"]
    torch.set_num_threads(1)  # one intra-op thread per rank, as torchrun gives its workers
    barrier()
    out: dict[str, Any] = {"ready_s": time.time() - t_call, "results": {}}
    for kind in spec["kinds"]:
        model = ns["make_model"](kind)
        model, opt = prepare(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
        batches = ns["make_batches"](kind, torch.distributed.get_rank())

        def train(n: int, model: Any = model, opt: Any = opt, batches: Any = batches) -> None:
            for i in range(n):
                x, y = batches[i % len(batches)]
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                backward(loss)
                opt.step()

        if spec["mode"] == "latency":
            train(1)
            barrier()
            out["first_step_s"] = time.time() - t_call
        else:
            train(spec["warmup"][kind])
            barrier()
            t0 = time.perf_counter()
            train(spec["steps"][kind])
            barrier()
            out["results"][kind] = spec["steps"][kind] / (time.perf_counter() - t0)
    return out


def _accelerate_fn(spec: dict[str, Any], t_call: float, out_path: str) -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    out = _measure(spec, acc.prepare, acc.backward, acc.wait_for_everyone, t_call)
    if acc.process_index == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)


def run_accelerate(spec: dict[str, Any]) -> dict[str, Any]:
    from accelerate import notebook_launcher

    with tempfile.TemporaryDirectory(prefix="bench-accelerate-") as folder:
        path, t_call, t0 = os.path.join(folder, "out.json"), time.time(), time.perf_counter()
        notebook_launcher(_accelerate_fn, (spec, t_call, path), num_processes=2, use_port=str(free_port()))
        wall = time.perf_counter() - t0
        with open(path) as f:
            return {**json.load(f), "wall_s": wall}


def _fabric_fn(fabric: Any, spec: dict[str, Any], t_call: float) -> dict[str, Any]:
    return _measure(spec, fabric.setup, fabric.backward, fabric.barrier, t_call)


def run_fabric(spec: dict[str, Any]) -> dict[str, Any]:
    from lightning.fabric import Fabric

    os.environ.pop("MASTER_PORT", None)  # a fresh free port for every launch
    t_call, t0 = time.time(), time.perf_counter()
    out = Fabric(accelerator="cpu", devices=2, strategy="ddp_notebook").launch(_fabric_fn, spec, t_call)
    return {**out, "wall_s": time.perf_counter() - t0}


RUNNERS = {"accelerate": ("accelerate", run_accelerate), "fabric": ("lightning", run_fabric)}


def main(argv: list[str]) -> int:
    (package, run), t0 = RUNNERS[argv[0]], time.perf_counter()
    try:
        __import__(package)  # torch with it
        _say({"ok": True, "import_s": time.perf_counter() - t0})
    except Exception as exc:
        _say({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    for line in filter(str.strip, sys.stdin):
        try:
            _say({"ok": True, **run(json.loads(line))})
        except Exception as exc:
            _say({"ok": False, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"})
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    if sys.argv[1] == "keep":
        keep_one()
    if sys.argv[1] != "cold":
        sys.exit(main(sys.argv[1:]))
    out = sample(sys.argv[2])
    Path(sys.argv[3]).write_text(json.dumps(out | {"process_s": time.perf_counter() - T_PROCESS}))
