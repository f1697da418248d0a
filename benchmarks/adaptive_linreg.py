"""Issue 46's linear regression under the adaptive batch: does the batch leave its start?

16 features, 65,536 samples, label noise 1.0, weights from 0, SGD lr 0.01, global batch 32,
max_global_batch 4096, 12 epochs of progress at the starting batch (24,576 steps), 2 gloo ranks,
GNS at the defaults. Prints the wall time, the optimizer steps taken and every change of the batch
with the GNS lower end it rested on. Not part of ``python -m benchmarks``:
``python -m benchmarks.adaptive_linreg [PROGRESS_STEPS]``.
"""

from __future__ import annotations

import sys
import time

CELL = """
import torch, torch.nn as nn
g = torch.Generator().manual_seed(3)
N, D = 65536, 16
X = torch.randn(N, D, generator=g)
Y = X @ torch.randn(D, 1, generator=g) + 1.0 * torch.randn(N, 1, generator=g)
model = ctx.wrap(nn.Linear(D, 1, bias=False))
with torch.no_grad():
    model.module.weight.zero_()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = ctx.loader(torch.utils.data.TensorDataset(X, Y), adaptive=True)
changes, steps = [], 0
for step, (x, y) in ctx.steps(loader, adaptive=True, max_global_batch=4096, max_steps=PROGRESS):
    ctx.backward(0.5 * (model(x) - y).pow(2).mean()); ctx.step(opt)
    steps += 1
    if not changes or changes[-1][1] != ctx.global_batch_size:
        gi = ctx.state.gns_state.decision_interval if ctx.state.gns_state is not None else None
        changes.append((step, ctx.global_batch_size, None if gi is None else round(gi.lo, 1)))
"""


def main(progress: int = 24576) -> None:
    import dtwork

    cluster = dtwork.start(n=2, backend="gloo", timeout=60)
    try:
        cluster.session.live = False
        cluster.configure({"global_batch_size": 32, "seed": 3, "gns": {"enabled": True}})
        t0 = time.perf_counter()
        cluster.run(CELL.replace("PROGRESS", str(progress)), quiet=True)
        wall = time.perf_counter() - t0
        print(f"wall {wall:.1f} s, {cluster.pull('steps')[0]} optimizer steps")
        for step, batch, lo in cluster.pull("changes")[0]:
            print(f"step {step}: global batch {batch} (GNS lower end {lo})")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
