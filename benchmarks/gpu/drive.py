"""``python -m benchmarks.gpu.drive --out DIR [--dry-run] [--budget S]``: the GPU checks, one after another.

Each check is a function returning its numbers; it is recorded as ``{ok, numbers, skipped, error,
seconds}`` and ``DIR/gpu.json`` is rewritten after every check, so that a failure or a hang (each check
has a time budget) loses none of the others. On one NCCL rank: dtwork against a plain loop in one process,
in turns (the suite's MLP, steps/s; a GPT of nanoGPT's shape in bf16, tokens/s and MFU); the GPU rows of
the store and the live view; the kernel holding no CUDA context; FSDP2 with AMP. Then
``python -m dtwork doctor --gpu`` and the tests marked ``gpu``. ``--dry-run``: the same plumbing on one
CPU rank with tiny shapes, the GPU-only checks skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.gpu.workload import SIZES, SOURCE
from benchmarks.stats import turns_summary
from benchmarks.turns import Turns, run_in_turns
from benchmarks.util import ROOT, exit_on_sigterm, git_commit, now, silenced

if TYPE_CHECKING:
    from dtwork.cluster import Cluster

TARGET_RATIO = 0.99  # dtwork's steps/s over the plain loop's
# kind -> (steps per window, measured cycles); two more cycles warm up
PLAN = {"gpu": {"mlp": (200, 10), "gpt": (10, 8)}, "dry": {"mlp": (5, 2), "gpt": (2, 2)}}
WARMUP_CYCLES = 2
BUDGETS = {"start": 120, "turns": 150, "gpu_rows": 20, "kernel_no_cuda_context": 20, "mlp_profile": 60}
BUDGETS |= {"fsdp_amp": 90, "hooks": 60}
BUDGETS |= {"stop": 30, "doctor": 170, "pytest_gpu": 90}
DOCTOR_GPU_TEST = "tests/cluster/test_doctor.py::test_doctor_gpu_checks_pass_on_a_cuda_machine"

FSDP_CELL = """
import math, time, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
g = torch.Generator().manual_seed(3)
X = torch.randn(4096, WIDTH, generator=g); Y = X @ torch.randn(WIDTH, 1, generator=g) / WIDTH ** 0.5
net = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(4)], nn.Linear(WIDTH, 1))
model = ctx.wrap(net, strategy="fsdp")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
losses, t0 = [], None
for step, (x, y) in ctx.steps(ctx.loader(torch.utils.data.TensorDataset(X, Y)), max_steps=STEPS):
    x, y = x.to(ctx.device), y.to(ctx.device)
    if step == 5:
        t0 = time.perf_counter()
    loss = F.mse_loss(model(x).float(), y); ctx.backward(loss); ctx.step(opt); losses.append(loss.item())
_doc = (all(map(math.isfinite, losses)), sum(losses[-5:]) / sum(losses[:5]), (STEPS - 5) / (time.perf_counter() - t0), type(model).__name__)
"""

PROFILE_CELL = """
import cProfile, io, pstats, time, torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as _DDP
_dev, _N, _B, _REPS = ctx.device, NSTEPS, BATCH, REPS
_g = torch.Generator().manual_seed(1)
_batches = [(torch.randn(_B, 1, 28, 28, generator=_g).to(_dev), torch.randint(0, 10, (_B,), generator=_g).to(_dev)) for _ in range(8)]
def _sync():
    if _dev.type == "cuda":
        torch.cuda.synchronize(_dev)
def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(_dev)
def _opt(m):
    return torch.optim.AdamW(m.parameters(), lr=1e-4, fused=_dev.type == "cuda")
def _plain(wrap):
    m = _mlp()
    if wrap:
        m = _DDP(m, device_ids=[_dev.index] if _dev.type == "cuda" else None)
    o = _opt(m)
    def go(n):
        for i in range(n):
            x, y = _batches[i % 8]
            loss = F.cross_entropy(m(x), y); o.zero_grad(set_to_none=True); loss.backward(); o.step()
    return go
def _dtwork(log):
    m = ctx.wrap(_mlp()); o = _opt(m)
    def go(n):
        for _, (x, y) in ctx.steps(_batches * (n // 8 + 1), max_steps=n):
            loss = F.cross_entropy(m(x), y); ctx.backward(loss); ctx.step(o)
            if log:
                ctx.log(loss=loss)
    return go
_jobs = {"bare": _plain(False), "ddp": _plain(True), "dtwork_nolog": _dtwork(False), "dtwork": _dtwork(True)}
_secs = {k: [] for k in _jobs}
for _r in range(_REPS + 1):  # the first round warms up
    for _k, _go in _jobs.items():
        _sync(); _t = time.perf_counter(); _go(_N); _sync()
        if _r:
            _secs[_k].append(time.perf_counter() - _t)
_prof = cProfile.Profile()
_prof.enable(); _jobs["dtwork"](_N); _sync(); _prof.disable()
_txt = io.StringIO(); pstats.Stats(_prof, stream=_txt).sort_stats("tottime").print_stats(30)
_calls = {}
from torch.profiler import profile, ProfilerActivity
for _k in ("bare", "ddp", "dtwork"):
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if _dev.type == "cuda" else [])) as _p:
        _jobs[_k](min(_N, 200)); _sync()
    _calls[_k] = {e.key: e.count for e in _p.key_averages() if any(w in e.key for w in ("Synchronize", "Memcpy", "item", "_local_scalar", "copy_", "nccl"))}
_prof_doc = {"steps": _N, "seconds": _secs, "cprofile": _txt.getvalue()[-12000:], "calls_200_steps": _calls}
"""


class Skip(Exception):
    """A check that cannot run here; its message is the reason."""


class Drive:
    """The checks' shared state: the mode, the cluster, the results written as they come."""

    def __init__(self, out: Path, dry: bool, budget: float, ranks: int = 1) -> None:
        self.out, self.dry, self.ranks = out, dry, ranks
        self.deadline = time.monotonic() + budget
        self.tmp = Path(tempfile.mkdtemp(prefix="dtwork-gpu-"))
        self.cluster: Cluster | None = None
        self.lost = "its start failed"  # why there is no cluster
        self.gpu_name: str | None = None
        self.no_gpu = "dry run: CPU ranks (gloo), tiny shapes" if dry else _no_gpu()
        self.mode = "gpu" if self.no_gpu is None else "dry"  # without a GPU, the tiny shapes
        self.checks: dict[str, dict[str, Any]] = {}
        self.meta = dict(date=now(), commit=git_commit(), dry_run=dry, budget_s=budget, argv=sys.argv)

    def run(self, name: str, fn: Callable[[Drive], dict[str, Any]]) -> None:
        """Run one check in a thread within its budget (and what is left of the whole); record it."""
        own = BUDGETS.get(name, 60) * (3 if self.dry else 1)  # a dry run's CPU may be shared and busy
        budget = max(0.1, min(own, self.deadline - time.monotonic()))
        box: dict[str, Any] = {}

        def go() -> None:
            try:
                box["numbers"] = fn(self)
            except Skip as why:
                box["skipped"] = str(why)
            except Exception as exc:
                box["error"] = f"{type(exc).__name__}: {exc}"
                box["trace"] = traceback.format_exc()[-3000:]

        t0 = time.monotonic()
        _say(f"{name}: start (budget {budget:.0f} s)")
        (t := threading.Thread(target=go, daemon=True)).start()
        t.join(budget)
        if t.is_alive():
            box["error"] = f"ran past its budget of {budget:.0f} s"
            if self.cluster is not None:  # its ranks may be stuck: the checks after skip theirs
                c, self.cluster, self.lost = self.cluster, None, f"{name} ran past its budget"
                threading.Thread(target=c.stop, daemon=True).start()
        numbers = box.get("numbers") or {}
        ok = "numbers" in box and bool(numbers.pop("ok", True))
        rec = {"ok": ok, "numbers": numbers, "skipped": box.get("skipped"), "error": box.get("error")}
        self.checks[name] = rec | {"seconds": round(time.monotonic() - t0, 2)}
        if box.get("trace"):
            print(box["trace"], file=sys.__stdout__, flush=True)
        _say(f"{name}: {'skip' if rec['skipped'] else 'ok' if ok else 'FAIL'} {json.dumps(rec, default=str)}")
        self.write()

    def write(self) -> None:
        ran = [n for n, c in self.checks.items() if not c["skipped"]]
        summary = {
            "failed": [n for n in ran if not self.checks[n]["ok"]],
            "passed": [n for n in ran if self.checks[n]["ok"]],
        }
        summary["skipped"] = [n for n, c in self.checks.items() if c["skipped"]]
        doc = {"meta": self.meta | {"gpu": self.gpu_name}, "summary": summary, "checks": self.checks}
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")

    def need_gpu(self) -> None:
        if self.no_gpu:
            raise Skip(self.no_gpu)

    def need_cluster(self) -> Cluster:
        if self.cluster is None:
            raise Skip(f"no cluster: {self.lost}")
        return self.cluster


def _say(msg: str) -> None:
    # sys.__stdout__: a check's thread may hold sys.stdout silenced (a cell's output) past its budget
    print(f"[gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.__stdout__, flush=True)


def _no_gpu() -> str | None:
    """Why the GPU checks cannot run (None: they can); asks NVML, not CUDA (this process is the kernel)."""
    from dtwork.shared import devices, telemetry

    if not devices.visible([g.to_dict() for g in telemetry.cuda_devices()]):
        return "no GPU: NVML sees none this process may use"
    return None


# -- the checks -------------------------------------------------------------------------------------


def environment(d: Drive) -> dict[str, Any]:
    from importlib import metadata

    from dtwork.commands.doctor import peak_tflops
    from dtwork.shared import telemetry

    gpus = [g.to_dict() for g in telemetry.gpu_inventory()]
    d.gpu_name = str(gpus[0].get("name")) if gpus else None
    out: dict[str, Any] = {"python": sys.version.split()[0], "gpus": gpus, "no_gpu": d.no_gpu}
    for pkg in ("dtwork", "torch", "ipyparallel", "pyzmq", "ipykernel", "nvidia-ml-py", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    import dtwork

    out["dtwork_from"] = str(Path(dtwork.__file__).parent)
    out["peak_bf16_tflops"] = peak_tflops(d.gpu_name) if d.gpu_name else None
    return out


def start(d: Drive) -> dict[str, Any]:
    import dtwork

    t0 = time.perf_counter()
    backend = "gloo" if d.no_gpu else "nccl"
    d.cluster = c = dtwork.start(d.ranks, backend=backend, timeout=120, store=str(d.tmp / "runs.sqlite"))
    c.session.live = False
    return {
        "backend": c.backend,
        "world_size": c.world_size,
        "start_s": time.perf_counter() - t0,
        "ranks": c.rank_info,
    }


def turns(d: Drive) -> dict[str, Any]:
    """dtwork's rank and a plain process train in turns: the MLP's steps/s, the GPT's tokens/s and MFU."""
    c = d.need_cluster()
    sizes, plan = SIZES[d.mode], PLAN[d.mode]
    windows = {k: (steps, WARMUP_CYCLES + cycles) for k, (steps, cycles) in plan.items()}
    device = "cpu" if d.no_gpu else "cuda:0"
    coordinator = _Turns({"dtwork": c.world_size, "plain": 1}, timeout=120)
    args = [str(coordinator.port), device, json.dumps(windows), json.dumps(sizes)]
    cmd = [sys.executable, "-m", "benchmarks.gpu.plain", *args]
    plain = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    thread, out = run_in_turns(coordinator, dict(plan), seed=0, alive=lambda: plain.poll() is None)
    serve = f"serve({coordinator.port}, 'dtwork', {windows!r}, {sizes!r}, str(ctx.device), ctx)"
    cell = f"{SOURCE}\n_facts = {serve}\n_t_end = time.time()\n"
    # The live view draws, as in a notebook; a dry run spares the CPU (and the shown cell's end, slow there)
    c.session.live = not d.dry
    t0 = time.perf_counter()
    try:
        with silenced():
            c.run(cell, quiet=d.dry)
    finally:
        t_cell, wall_cell = time.perf_counter(), time.time()
        coordinator.stop()
        thread.join()
        stdout, stderr = plain.communicate(timeout=60)
    if "error" in out:
        raise RuntimeError(f"{out['error']}; the plain process said: {stderr[-1500:]}")
    line = next((ln for ln in stdout.splitlines() if ln.startswith("FACTS ")), None)
    if line is None:
        raise RuntimeError(f"the plain process exited {plain.returncode}: {stderr[-2000:]}")
    facts = c.pull("_facts")[0]
    d.meta["run_id"] = c.session.run_id
    res: dict[str, Any] = {"device": device, "plan": plan, "sizes": sizes, "ranks": c.world_size}
    res["ready_s"] = coordinator.ready - t0  # both jobs built and connected
    for kind in plan:
        marks = [m for m in coordinator.marks if m[1] == kind]
        res[f"{kind}_windows_s"] = [marks[0][2] - t0, marks[-1][3] - t0]
    res["cell_s"], res["plain_exit_s"] = t_cell - t0, time.perf_counter() - t0
    res["cell_end_to_kernel_s"] = wall_cell - max(c.pull("_t_end"))  # the ranks' last line to run()'s return
    res["trained_s"] = sum(sum(sum(v) for v in out[k]["seconds"].values()) for k in plan)
    for kind, (steps, _) in plan.items():
        s = turns_summary(out[kind]["seconds"], "dtwork", "plain", steps)
        res[kind] = {
            k: s[k] for k in ("ratio", "ci95", "ratio_of_totals", "steps_per_s", "window_s", "cycles")
        }
    mlp = res["mlp"]
    mlp["target"], mlp["meets_target"] = f">= {TARGET_RATIO}", (mlp["ratio"] or 0) >= TARGET_RATIO
    gpt, size = res["gpt"], sizes["gpt"]
    gpt |= facts["gpt"]
    tokens = {j: sps * size["batch"] * size["block"] for j, sps in gpt["steps_per_s"].items()}
    gpt["tokens_per_s"] = tokens
    peak = d.checks.get("environment", {}).get("numbers", {}).get("peak_bf16_tflops")
    if peak:
        gpt["mfu"] = {j: facts["gpt"]["flops_per_token"] * t / (peak * 1e12) for j, t in tokens.items()}
        gpt["peak_bf16_tflops"] = peak
    return res


class _Turns(Turns):
    """The coordinator, noting when every rank of both jobs has connected."""

    ready = math.nan
    marks: list[tuple[str, str, float, float]] = []

    def wait_for_jobs(self, alive: Callable[[], bool]) -> None:
        super().wait_for_jobs(alive)
        self.ready = time.perf_counter()

    def window(self, job: str, kind: str, steps: int) -> float:
        t0 = time.perf_counter()
        out = super().window(job, kind, steps)
        self.marks = [*self.marks, (job, kind, t0, time.perf_counter())]
        return out


def gpu_rows(d: Drive) -> dict[str, Any]:
    """The GPU's utilisation, memory and power as the store and the live view got them during the turns."""
    d.need_gpu()
    c, run_id = d.need_cluster(), d.meta.get("run_id")
    if run_id is None:
        raise Skip("no run: the turns did not run")
    store: dict[str, Any] = {}
    runs = [r for r in (run_id - 1, run_id) if r >= 1]  # the MLP's run, then the GPT's
    for name in ("utilization", "memory_used_mb", "memory_total_mb", "power_w", "temperature_c"):
        vals = [r["value"] for i in runs for r in c.session.store.metrics(i, name, rank="all")]
        store[name] = {"rows": len(vals), "max": max(vals) if vals else None}
    live: dict[str, Any] = {"shown": False}
    dash = c.session.dashboard
    fig = dash.figures.get("gpu") if dash is not None else None
    if fig is not None:
        live = {"shown": True, "points": sum(0 if t.y is None else len(t.y) for t in fig.data)}
    good = all(
        store[n]["rows"] and (store[n]["max"] or 0) > 0 for n in ("utilization", "memory_used_mb", "power_w")
    )
    return {"ok": good and live.get("points", 0) > 0, "store": store, "live_view": live}


def kernel_no_cuda_context(d: Drive) -> dict[str, Any]:
    """The GPU's compute processes are the ranks only: this process (the kernel) holds no CUDA context."""
    d.need_gpu()
    c = d.need_cluster()
    import pynvml as nv

    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    pids = sorted({p.pid for h in handles for p in nv.nvmlDeviceGetComputeRunningProcesses(h)})
    ranks = sorted(int(r["pid"]) for r in c.rank_info)
    torch = sys.modules.get("torch")
    here = bool(torch is not None and torch.cuda.is_initialized())
    smi = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    good = not here and os.getpid() not in pids and set(pids) <= set(ranks) and bool(pids)
    note = None if pids else "NVML lists no process (pids hidden?): only this process's own torch was checked"
    return {
        "ok": good or (not pids and not here),
        "gpu_pids": pids,
        "rank_pids": ranks,
        "kernel_pid": os.getpid(),
        "kernel_cuda_initialized": here,
        "nvidia_smi": smi,
        "note": note,
    }


def gpu_lease(d: Drive) -> dict[str, Any]:
    """With the cluster holding every GPU, a second start asking for one is refused at once, naming it
    (issue 48's leases), and its entry names the GPUs it holds."""
    d.need_gpu()
    c = d.need_cluster()
    from dtwork import Cluster
    from dtwork.errors import DtworkError
    from dtwork.launch import registry

    entry = registry.read(registry.entry_path(c.cluster_id)) or {}
    t0 = time.perf_counter()
    try:
        Cluster(1, timeout=60).start()
        said, refused = "started", False
    except DtworkError as exc:
        said, refused = str(exc), True
    took = time.perf_counter() - t0
    held = (entry.get("gpus") or {}).get("uuids") or []
    pinned = sorted(str(r.get("gpu_uuid")) for r in c.rank_info)
    ok = refused and c.cluster_id in said and took < 1.0 and sorted(held) == pinned
    return {"ok": ok, "refused_in_s": took, "said": said, "lease": held, "pinned": pinned}


def mlp_profile(d: Drive) -> dict[str, Any]:
    """Where an MLP step's time goes on the rank: the bare loop, torch's DDP, ctx.steps without and with
    ctx.log, in turns in one process; a cProfile of ctx.steps; the CUDA syncs and copies per variant."""
    c = d.need_cluster()
    c.session.live = False
    n, reps = (600, 3) if d.mode == "gpu" else (10, 1)
    batch = SIZES[d.mode]["mlp"]["batch"]
    cell = PROFILE_CELL.replace("NSTEPS", str(n)).replace("BATCH", str(batch)).replace("REPS", str(reps))
    with silenced():
        c.run(cell, quiet=True)
    doc = c.pull("_prof_doc")[0]
    best = {k: min(v) for k, v in doc["seconds"].items()}
    doc["steps_per_s"] = {k: n / v for k, v in best.items()}
    doc["us_per_step_over_bare"] = {k: 1e6 * (v - best["bare"]) / n for k, v in best.items()}
    print(doc["cprofile"], file=sys.__stdout__, flush=True)
    return doc


def fsdp_amp(d: Drive) -> dict[str, Any]:
    """FSDP2 (ctx.wrap strategy="fsdp") training steps in fp32, bf16 and fp16 AMP."""
    c = d.need_cluster()
    c.session.live = False
    precisions = ("none", "bf16") if d.no_gpu else ("none", "bf16", "fp16")
    steps, width = (15, 16) if d.mode == "dry" else (60, 1024)
    out: dict[str, Any] = {}
    for p in precisions:
        c.configure({"global_batch_size": 64, "mixed_precision": p})
        with silenced():
            c.run(FSDP_CELL.replace("STEPS", str(steps)).replace("WIDTH", str(width)), quiet=True)
        finite, ratio, sps, wrapped = c.pull("_doc")[0]
        out[p] = {"finite": finite, "loss_ratio": ratio, "steps_per_s": sps, "model": wrapped}
    c.configure(None)
    out["ok"] = all(v["finite"] and v["loss_ratio"] < 1 for v in out.values())
    return out


def stop(d: Drive) -> dict[str, Any]:
    c = d.need_cluster()
    d.cluster = None
    c.stop()
    return {}


def doctor(d: Drive) -> dict[str, Any]:
    """``python -m dtwork doctor --gpu``: its rows (resume on the GPU, fp16/bf16 AMP, TFLOP/s among them)."""
    if d.dry:
        raise Skip("dry run: tests/cluster/test_doctor.py runs the doctor")
    # from a folder outside the checkout: the installed wheel runs, not the checkout's source
    proc = _sub([sys.executable, "-m", "dtwork", "doctor", "--gpu"], BUDGETS["doctor"] - 10, cwd=d.tmp)
    rows = {}
    for m in re.finditer(r"^dtwork doctor: (.+?): (ok|FAIL|skip) \((.*)\)$", proc.stdout, re.M):
        rows[m[1]] = {"status": m[2], "detail": m[3]}
    tflops = re.search(r"([\d.]+) TFLOP/s", rows.get("bf16 throughput", {}).get("detail", ""))
    good = proc.returncode == 0 and bool(rows) and all(r["status"] == "ok" for r in rows.values())
    return {
        "ok": good,
        "exit": proc.returncode,
        "rows": rows,
        "bf16_tflops": float(tflops[1]) if tflops else None,
    }


def hooks(d: Drive) -> dict[str, Any]:
    """``python -m benchmarks.gpu.hooks``: what each DDP communication hook costs the MLP's step (torch alone)."""
    if d.dry:
        raise Skip("dry run: its variants are timed on the GPU only")
    proc = _sub(
        [sys.executable, "-m", "benchmarks.gpu.hooks", "--steps", "400", "--reps", "3"], BUDGETS["hooks"] - 5
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("HOOKS ")), None)
    if line is None:
        raise RuntimeError(f"benchmarks.gpu.hooks exited {proc.returncode} without its numbers")
    doc: dict[str, Any] = json.loads(line[len("HOOKS ") :])
    return doc


def pytest_gpu(d: Drive) -> dict[str, Any]:
    """The tests marked ``gpu`` (the doctor's GPU test left out: the doctor check just ran the same)."""
    if d.dry:
        raise Skip("dry run: the test suite runs these itself (skipped there without a GPU)")
    files = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text()
    )
    # one process (the suite's addopts spread tests over xdist workers; these share one GPU)
    cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider"]
    cmd += ["-m", "gpu", *files]
    proc = _sub([*cmd, "--deselect", DOCTOR_GPU_TEST], BUDGETS["pytest_gpu"] - 10)
    counts = {
        k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|deselected)", proc.stdout)
    }
    return {
        "ok": proc.returncode == 0 and counts.get("passed", 0) > 0,
        "exit": proc.returncode,
        "files": files,
        **counts,
    }


def _sub(cmd: list[str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run a command (from the checkout unless told), its output into the log."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        print(exc.stdout or "", exc.stderr or "", file=sys.__stdout__, flush=True)
        raise RuntimeError(f"{' '.join(cmd[1:4])} ran past {timeout:.0f} s") from None
    print(proc.stdout[-20000:], proc.stderr[-5000:], sep="\n", file=sys.__stdout__, flush=True)
    return proc


CHECKS = [
    environment,
    start,
    turns,
    gpu_rows,
    kernel_no_cuda_context,
    gpu_lease,
    mlp_profile,
    fsdp_amp,
    stop,
    hooks,
    doctor,
]
CHECKS += [pytest_gpu]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.drive", description=__doc__)
    ap.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "benchmarks" / "results" / "gpu"))
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="one CPU rank, tiny shapes, GPU-only checks skipped"
    )
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all the checks together")
    ap.add_argument(
        "--ranks", type=int, default=1, help="dtwork's ranks, one a GPU (the plain job keeps one)"
    )
    ap.add_argument(
        "--only",
        default=None,
        help="comma-separated checks to run, in the order given (a rerun in a short lease; start before the checks on its cluster)",
    )
    args = ap.parse_args(argv)
    names = [c.__name__ for c in CHECKS]
    only = names if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    if set(only) - set(names):
        ap.error(
            f"--only takes checks among {', '.join(names)}; got {', '.join(sorted(set(only) - set(names)))}"
        )
    exit_on_sigterm()  # a killed run still stops the engines it started
    os.environ.setdefault(
        "DTWORK_STORE", str(Path(tempfile.mkdtemp(prefix="dtwork-gpu-store-")) / "runs.sqlite")
    )
    if args.ranks < 1:
        ap.error("--ranks takes the number of GPUs to use, at least 1")
    d = Drive(args.out, args.dry_run, args.budget, args.ranks)
    try:
        by_name = {c.__name__: c for c in CHECKS}
        for name in only:
            d.run(name, by_name[name])
    finally:
        if d.cluster is not None:
            d.cluster.stop()
    failed = [n for n, c in d.checks.items() if not c["ok"] and not c["skipped"]]
    _say(
        f"wrote {args.out / 'gpu.json'}: " + (f"FAILED {failed}" if failed else "every check that ran passed")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
