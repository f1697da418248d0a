"""The ``fsdp`` phase: one small transformer trained under DDP and under FSDP on the same 2 ranks,
in turns; steps/s and what a rank holds (``ctx.memory()``) side by side."""

from __future__ import annotations

from typing import Any

from benchmarks.runners import DtworkRunner
from benchmarks.stats import bootstrap_ci, median, ratio, summarize
from benchmarks.turns import rotate

STRATEGIES = ("ddp", "fsdp")

CELL = """
import time, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
class Net(nn.Module):  # a 4-layer transformer encoder over 32 tokens, d_model 128
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(512, 128)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(128, 4, 512, batch_first=True) for _ in range(4))
        self.head = nn.Linear(128, 512)
    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)
model = ctx.wrap(Net(), strategy=STRATEGY)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ctx.register("optimizers", opt)
g = torch.Generator().manual_seed(ctx.rank)
batches = [torch.randint(0, 512, (8, 33), generator=g) for _ in range(8)]
held = {}
def train(n):
    for step, b in ctx.steps([batches[i % 8] for i in range(n)], max_steps=n):
        out = model(b[:, :-1])
        ctx.backward(F.cross_entropy(out.reshape(-1, 512), b[:, 1:].reshape(-1)))
        if step == n - 1:  # gradients and optimizer state both held
            held.update(ctx.memory())
        ctx.step(opt)
train(WARMUP)
t0 = time.perf_counter()
train(STEPS)
steps_per_s = STEPS / (time.perf_counter() - t0)
"""


def measure(dt: DtworkRunner, warmup: int, steps: int, reps: int) -> dict[str, Any]:
    """Steps/s of each strategy (rank 0's, ``reps`` turns in rotated order) and rank 0's memory."""
    rates: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    held: dict[str, dict[str, float]] = {}
    for rep in range(reps):
        for s in rotate(list(STRATEGIES), rep):
            cell = (
                CELL.replace("STRATEGY", repr(s)).replace("WARMUP", str(warmup)).replace("STEPS", str(steps))
            )
            dt.run(cell, quiet=True, live=False)
            rates[s].append(float(dt.pull("steps_per_s")[0]))
            held[s] = dt.pull("held")[0]
    out: dict[str, Any] = {"steps": steps, "reps": reps}
    for s in STRATEGIES:
        h = held[s]
        out[s] = {"steps_per_s": summarize(rates[s]), "memory": h}
    d, f = held["ddp"], held["fsdp"]
    out["fsdp_vs_ddp_steps"] = ratio(median(rates["fsdp"]), median(rates["ddp"]))
    out["fsdp_vs_ddp_steps_ci95"] = bootstrap_ci(rates["fsdp"], rates["ddp"])
    out["fsdp_vs_ddp_param_optimizer_memory"] = ratio(
        f["param_bytes"] + f["optimizer_bytes"], d["param_bytes"] + d["optimizer_bytes"]
    )
    return out
