"""The GPU workloads: one source text run by dtwork's rank (in a ``%%dtrain`` cell) and by a plain process.

``SOURCE`` defines the models (the suite's MLP; a GPT of nanoGPT's shape), their batches on the device,
one training step's code shared by both jobs, and ``serve``: train in turns (``benchmarks.turns``), each
window ``RUN kind steps`` answered ``DONE seconds`` (timed in the process, the GPU synchronised). Under
dtwork the model is ``ctx.wrap``'d and steps through ``ctx.steps``/``ctx.backward``/``ctx.step``/``ctx.log``;
the plain job runs the same model and step in a bare loop. ``SIZES`` are the shapes on a GPU and for the
CPU dry run.
"""

from __future__ import annotations

from typing import Any

# kind -> model shape and batch; "gpt" is nanoGPT's GPT-2 small (124M parameters, 1024 tokens).
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "gpu": {
        "mlp": {"batch": 256},
        "gpt": {"vocab": 50304, "block": 1024, "layers": 12, "heads": 12, "width": 768, "batch": 16},
    },
    "dry": {
        "mlp": {"batch": 16},
        "gpt": {"vocab": 128, "block": 32, "layers": 1, "heads": 2, "width": 32, "batch": 2},
    },
}

SOURCE = '''
import socket, time
import torch, torch.nn as nn, torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(width), nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.ln2, self.fc, self.out = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(C, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, width, **_):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as in nanoGPT

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def build(kind, size, device):
    """(model, batches, bf16 autocast on?) of ``kind`` on ``device``, the same in both jobs."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        b = size["batch"]
        batches = [(torch.randn(b, 1, 28, 28, generator=g), torch.randint(0, 10, (b,), generator=g)) for _ in range(8)]
        amp = False
    else:
        model = GPT(**size)
        shape = (size["batch"], size["block"])
        batches = [(torch.randint(0, size["vocab"], shape, generator=g), torch.randint(0, size["vocab"], shape, generator=g)) for _ in range(4)]
        amp = True
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    return model.to(device), batches, amp


def gpt_flops_per_token(model, size):
    """nanoGPT's estimate: 6 N (N without the position embeddings) + 12 L H Q T, Q = width / heads."""
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n + 12 * size["layers"] * size["heads"] * (size["width"] // size["heads"]) * size["block"], n


def loss_of(model, x, y, amp, device_type):
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=amp):
        out = model(x)
    return F.cross_entropy(out.float().view(-1, out.shape[-1]), y.view(-1))


def serve(port, job, plan, sizes, device, dtwork_ctx=None):
    """Train in turns: ``plan`` kind -> (steps per window, windows in all), kinds one after another.

    With ``dtwork_ctx`` the model is ctx.wrap'd and each kind one ctx.steps loop across its windows;
    without it, the bare loop. Returns {kind: facts} (parameters, FLOPs per token).
    """
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cpu":
        torch.set_num_threads(1)  # the dry run: two jobs on a small machine, one thread each
    facts, states = {}, {}
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.settimeout(None)
        f = sock.makefile("rw")
        f.write(f"HELLO {job} {dtwork_ctx.rank if dtwork_ctx is not None else 0}\\n")
        f.flush()
        for line in f:
            cmd = line.split()
            if len(cmd) != 3 or cmd[0] != "RUN":
                break
            kind, n = cmd[1], int(cmd[2])
            if kind not in states:
                model, batches, amp = build(kind, sizes[kind], dev)
                if kind == "gpt":
                    facts[kind] = dict(zip(("flops_per_token", "params"), gpt_flops_per_token(model, sizes[kind])))
                if dtwork_ctx is not None:
                    model = dtwork_ctx.wrap(model)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
                steps = plan[kind][0] * plan[kind][1]
                it = iter(dtwork_ctx.steps(batches, max_steps=steps)) if dtwork_ctx is not None else None
                states = {kind: [model, opt, batches, amp, it, 0, steps]}  # the kind before is done
            model, opt, batches, amp, it, done, steps = states[kind]
            sync()
            t0 = time.perf_counter()
            for i in range(n):
                if it is None:
                    x, y = batches[(done + i) % len(batches)]
                    loss = loss_of(model, x, y, amp, dev.type)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                else:
                    _, (x, y) = next(it)
                    loss = loss_of(model, x, y, amp, dev.type)
                    dtwork_ctx.backward(loss)
                    dtwork_ctx.step(opt)
                    dtwork_ctx.log(loss=loss)
            sync()
            seconds = time.perf_counter() - t0
            states[kind][5] = done = done + n
            if it is not None and done >= steps:
                assert next(it, None) is None  # the loop ends, its records flushed
            f.write(f"DONE {seconds!r}\\n")
            f.flush()
    return facts
'''
