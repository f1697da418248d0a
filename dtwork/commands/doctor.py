"""``python -m dtwork doctor [--gpu]``: check an installation end to end and print a table.

On 2 CPU ranks (gloo): the engines start, the process group all-reduces, DDP equals one process
(1e-5), the gradient noise scale finds a known B_simple, resume is bitwise. With ``--gpu`` on a
CUDA machine, on one rank per GPU (NCCL): NVML names and UUIDs per rank, the group at that world
size, DDP equivalence on the GPU, fp16 and bf16 AMP steps with GNS on, resume on the GPU, and a
bf16 training throughput in TFLOP/s against the device's peak. Without CUDA each GPU check is
skipped with the reason. The checks run as cells on real ranks, exactly as a notebook would.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtwork.cluster import Cluster

DDP_TOLERANCE = 1e-5  # max |parameter difference| between DDP and one process
GNS_TOLERANCE = 0.10  # relative error allowed when the 95% interval misses the truth

# Dense bf16 tensor-core peaks (TFLOP/s) from the vendors' data sheets; the first match in
# the device name wins, so more specific names come first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 6000 Ada", 364.0),
    ("RTX A6000", 155.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
)


@dataclass
class Check:
    """One line of the table."""

    name: str
    status: str  # "ok", "FAIL" or "skip"
    detail: str
    seconds: float = 0.0


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name (None: not in the table)."""
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key.lower() in device_name.lower()), None)


# -- the cells the ranks run ------------------------------------------------------------------------

ALL_REDUCE = """
import torch, torch.distributed as dist
_t = torch.tensor([float(ctx.rank + 1)], device=ctx.device); dist.all_reduce(_t); _doc = _t.item()
"""

DDP = """
import copy, torch, torch.nn as nn, torch.nn.functional as F
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
X = torch.randn(64, 16, generator=g).to(ctx.device); Y = torch.randn(64, 1, generator=g).to(ctx.device)
net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
ref = copy.deepcopy(net).to(ctx.device)
model = ctx.wrap(net)
opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
for _ in range(20):
    opt.zero_grad(); F.mse_loss(model(X[ctx.rank::ctx.world_size]), Y[ctx.rank::ctx.world_size]).backward(); opt.step()
    ref_opt.zero_grad(); F.mse_loss(ref(X), Y).backward(); ref_opt.step()
_doc = max((a - b).abs().max().item() for a, b in zip(model.module.parameters(), ref.parameters()))
"""

GNS = """
import torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(7)
X = torch.randn(4096, 8, generator=g); w = torch.randn(8, 1, generator=g)
Y = X @ w + 0.5 * torch.randn(4096, 1, generator=g)
torch.manual_seed(0)
net = nn.Linear(8, 1)
with torch.no_grad():
    net.weight.copy_((w + 0.3).T); net.bias.fill_(0.2)
    r = net(X) - Y  # per-example gradient of (f(x) - y)^2: 2 r [x, 1]
    per = torch.cat([2 * r * X, 2 * r], dim=1).double()
    G = per.mean(0)
    truth = float(((per - G) ** 2).sum(1).mean() / G.pow(2).sum())  # B_simple = tr(Sigma) / |G|^2
model = ctx.wrap(net, gns=True)
opt = torch.optim.SGD(model.parameters(), lr=0.0)  # parameters held fixed: one true B_simple
for step, (x, y) in ctx.steps(ctx.loader(torch.utils.data.TensorDataset(X, Y)), max_steps=STEPS):
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt)
est = ctx.gns_state
iv = getattr(est, "interval", None)
_doc = (ctx.gns, truth, (iv.lo, iv.hi) if iv is not None else None)
"""

RESUME = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
g = torch.Generator().manual_seed(2)
X = torch.randn(256, 8, generator=g); Y = X @ torch.randn(8, 1, generator=g)
model = ctx.wrap(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
opt = ctx.optimizer(model.parameters())
drop = nn.Dropout(0.2)  # the RNG states must resume too
for step, (x, y) in ctx.steps(ctx.loader(torch.utils.data.TensorDataset(X, Y)), max_steps=MAX, resume=RESUME):
    x, y = x.to(ctx.device), y.to(ctx.device)
    ctx.backward(F.mse_loss(model(drop(x)), y)); ctx.step(opt)
_doc = [p.detach().cpu().clone() for p in model.module.parameters()]
"""

AMP = """
import math, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
g = torch.Generator().manual_seed(3)
X = torch.randn(2048, 32, generator=g); Y = X @ torch.randn(32, 1, generator=g)
model = ctx.wrap(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)), gns=True)
opt = ctx.optimizer(model.parameters())
losses = []
for step, (x, y) in ctx.steps(ctx.loader(torch.utils.data.TensorDataset(X, Y)), max_steps=60):
    x, y = x.to(ctx.device), y.to(ctx.device)
    loss = F.mse_loss(model(x).float(), y); ctx.backward(loss); ctx.step(opt); losses.append(loss.item())
_doc = (all(math.isfinite(v) for v in losses), sum(losses[-5:]) / sum(losses[:5]), ctx.gns)
"""

THROUGHPUT = """
import time, torch, torch.nn as nn, torch.nn.functional as F
width, depth, batch = 8192, 4, 8192
model = ctx.wrap(nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(depth)]), gns=False)
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(batch, width, device=ctx.device)
def _step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
for _ in range(5):
    _step()
torch.cuda.synchronize(); t0 = time.perf_counter(); n = 20
for _ in range(n):
    _step()
torch.cuda.synchronize()
seconds = (time.perf_counter() - t0) / n
_doc = 6 * depth * width * width * batch / seconds / 1e12  # forward 2, backward 4 FLOPs per weight and row
"""


# -- running the checks -----------------------------------------------------------------------------


class Doctor:
    """Runs the checks on a cluster of its own, with the run store and checkpoints in a temporary folder."""

    def __init__(self, say: Callable[[Check], None] = lambda c: None) -> None:
        self.checks: list[Check] = []
        self.say = say
        self.tmp = Path(tempfile.mkdtemp(prefix="dtwork-doctor-"))

    def check(self, name: str, fn: Callable[[], tuple[bool, str]]) -> bool:
        """Run one check; a raised error is a failure with its one line."""
        t0 = time.monotonic()
        try:
            good, detail = fn()
        except Exception as exc:
            good, detail = False, one_line(exc)
        self.checks.append(Check(name, "ok" if good else "FAIL", detail, time.monotonic() - t0))
        self.say(self.checks[-1])
        return good

    def skip(self, name: str, why: str) -> None:
        self.checks.append(Check(name, "skip", why))
        self.say(self.checks[-1])

    def start(self, label: str, backend: str, n: int | None = None) -> Cluster | None:
        """Start a cluster for the checks (None when it fails: the failure is the check's line)."""
        from dtwork.cluster import start

        box: dict[str, Cluster] = {}

        def go() -> tuple[bool, str]:
            t0 = time.monotonic()
            c = box["c"] = start(n, backend=backend, timeout=120, store=str(self.tmp / "runs.sqlite"))
            c.session.live = False
            return True, f"{c.world_size} ranks, {c.backend}, in {time.monotonic() - t0:.1f} s"

        return box.get("c") if self.check(label, go) else None

    def cpu(self, n: int, gns_steps: int) -> None:
        """The checks on ``n`` CPU ranks with gloo."""
        c = self.start("engines start", n=n, backend="gloo")
        if c is None:
            return
        try:
            self.common(c, "", gns_steps)
        finally:
            c.stop()

    def common(self, c: Cluster, suffix: str, gns_steps: int | None) -> None:
        """Process group, DDP equivalence, GNS (when ``gns_steps``) and resume on cluster ``c``."""
        self.check(f"process group{suffix}", lambda: _all_reduce(c))
        self.check(f"DDP equivalence{suffix}", lambda: _ddp(c))
        if gns_steps:
            self.check(f"GNS known problem{suffix}", lambda: _gns(c, gns_steps))
        self.check(f"resume bitwise{suffix}", lambda: _resume(c, self.tmp / f"ck{suffix.strip()}"))

    def gpu(self) -> None:
        """The GPU checks on one rank per visible GPU with NCCL (skipped without CUDA)."""
        names = ["NCCL engines start", "NVML per rank", "process group (GPU)", "DDP equivalence (GPU)"]
        names += ["resume bitwise (GPU)", "fp16 AMP + GNS", "bf16 AMP + GNS", "bf16 throughput"]
        why = _no_cuda()
        if why:
            for name in names:
                self.skip(name, why)
            return
        c = self.start("NCCL engines start", backend="nccl")
        if c is None:
            return
        try:
            self.check("NVML per rank", lambda: _nvml(c))
            self.common(c, " (GPU)", None)
            for precision in ("fp16", "bf16"):
                self.check(f"{precision} AMP + GNS", lambda p=precision: _amp(c, p))  # type: ignore[misc]
            self.check("bf16 throughput", lambda: _throughput(c))
        finally:
            c.stop()


def one_line(exc: BaseException) -> str:
    """An error as one line: its first line, and the exception a rank raised when it names one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    cause = next((line for line in reversed(lines[1:]) if re.match(r"^[\w.]+(Error|Exception):", line)), None)
    return f"{first} ({cause})" if cause else first


def _value(c: Cluster, source: str) -> list[Any]:  # Any: what the ranks' check code computed
    c.run(source, quiet=True)
    return list(c.pull("_doc"))


def _all_reduce(c: Cluster) -> tuple[bool, str]:
    n = c.world_size
    got = _value(c, ALL_REDUCE)
    return got == [n * (n + 1) / 2] * n, f"{c.backend}, all-reduce over {n} ranks: {got[0]:g}"


def _ddp(c: Cluster) -> tuple[bool, str]:
    c.configure({"global_batch_size": 64})
    worst = max(_value(c, DDP))
    return (
        worst <= DDP_TOLERANCE,
        f"max |DDP - one process| {worst:.1e} after 20 steps (limit {DDP_TOLERANCE:g})",
    )


def _gns(c: Cluster, steps: int) -> tuple[bool, str]:
    c.configure({"global_batch_size": 64, "seed": 7, "gns": {"enabled": True}})
    estimate, truth, interval = _value(c, GNS.replace("STEPS", str(steps)))[0]
    if estimate is None:
        return False, f"no estimate after {steps} steps (truth {truth:.2f})"
    err = estimate / truth - 1
    covered = interval is not None and interval[0] <= truth <= interval[1]
    shown = f", 95% [{interval[0]:.1f}, {interval[1]:.1f}]" if interval is not None else ""
    return covered or abs(
        err
    ) <= GNS_TOLERANCE, f"B_simple {estimate:.2f} vs truth {truth:.2f} ({err:+.1%}){shown}"


def _resume(c: Cluster, folder: Path) -> tuple[bool, str]:
    base = {"global_batch_size": 8, "lr": 0.05}
    c.configure({**base, "checkpoint": {"every": 3, "directory": str(folder) + "-straight"}})
    straight = _value(c, RESUME.replace("MAX", "10").replace("RESUME", "False"))[0]
    c.configure({**base, "checkpoint": {"every": 3, "directory": str(folder)}})
    _value(c, RESUME.replace("MAX", "7").replace("RESUME", "False"))  # the last checkpoint at step 7
    resumed = _value(c, RESUME.replace("MAX", "10").replace("RESUME", "True"))[0]
    same = all(bool((a == b).all()) for a, b in zip(straight, resumed, strict=True))
    return same, "10 steps straight == 7 steps, checkpoint, resume to 10" if same else "parameters differ"


def _nvml(c: Cluster) -> tuple[bool, str]:
    seen = [(r.get("rank"), r.get("gpu_name"), r.get("gpu_uuid")) for r in c.rank_info]
    uuids = [u for _, _, u in seen]
    good = all(uuids) and len(set(uuids)) == len(uuids)
    return good, "; ".join(f"rank {r}: {name} {str(u)[:12]}" for r, name, u in seen)


def _amp(c: Cluster, precision: str) -> tuple[bool, str]:
    c.configure({"global_batch_size": 64, "lr": 0.02, "mixed_precision": precision, "gns": {"enabled": True}})
    finite, ratio, estimate = _value(c, AMP)[0]
    shown = f"{estimate:.1f}" if estimate is not None else "none yet"
    return finite and ratio < 0.5, f"60 steps, loss x{ratio:.2f}, finite {finite}, B_simple {shown}"


def _throughput(c: Cluster) -> tuple[bool, str]:
    tflops = _value(c, THROUGHPUT)
    name = str(c.rank_info[0].get("gpu_name") or "")
    peak = peak_tflops(name)
    mean = sum(tflops) / len(tflops)
    share = (
        f", {mean / peak:.0%} of {name}'s {peak:.0f} peak" if peak else f" ({name}: peak not in the table)"
    )
    return mean > 0, f"{mean:.0f} TFLOP/s per rank (min {min(tflops):.0f}){share}"


def _no_cuda() -> str | None:
    """Why the GPU checks cannot run here (None: they can); asks NVML and torch's build, not CUDA."""
    import torch

    from dtwork.shared import devices, telemetry

    if not torch.backends.cuda.is_built():
        return f"skipped: torch {torch.__version__} has no CUDA"
    if not devices.visible([g.to_dict() for g in telemetry.cuda_devices()]):
        return "skipped: NVML sees no GPU this process may use"
    return None


def table(checks: list[Check]) -> str:
    """The checks as a plain-text table."""
    width = max([len(c.name) for c in checks] + [5])
    lines = [f"{'check':<{width}}  {'result':<6}  {'time':>6}  detail"]
    for c in checks:
        lines.append(f"{c.name:<{width}}  {c.status:<6}  {c.seconds:>5.1f}s  {c.detail}")
    return "\n".join(lines)


def run(gpu: bool = False, n: int = 2, gns_steps: int = 3000, verbose: bool = True) -> list[Check]:
    """Run the checks (the GPU ones too with ``gpu``); return them in order."""

    def say(c: Check) -> None:
        if verbose:
            print(f"dtwork doctor: {c.name}: {c.status} ({c.detail})", flush=True)

    doc = Doctor(say)
    try:
        doc.cpu(n, gns_steps)
        if gpu:
            doc.gpu()
    finally:
        shutil.rmtree(doc.tmp, ignore_errors=True)
    return doc.checks


def main(gpu: bool = False, n: int = 2) -> int:
    """Print the table; exit status 1 when a check failed."""
    checks = run(gpu=gpu, n=n)
    print(table(checks))
    failed = [c.name for c in checks if c.status == "FAIL"]
    skipped = sum(c.status == "skip" for c in checks)
    if failed:
        print(f"dtwork doctor: {len(failed)} failed: {', '.join(failed)}")
    else:
        print("dtwork doctor: all checks ok" + (f" ({skipped} skipped)" if skipped else ""))
    return 1 if failed else 0
