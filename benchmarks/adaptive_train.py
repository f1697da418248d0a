"""The adaptive-batch benchmark's training script: every arm runs this file unchanged.

A small causal transformer learns tokens from a seeded order-2 Markov chain, whose entropy rate (the
best possible validation loss) is computed exactly. ``python adaptive_train.py SPEC.json`` trains the
runs the spec lists, one after the other, each from scratch until its validation loss reaches the
target (or its sample cap): fixed global batches in a plain DDP loop under torchrun, or (``adaptive``)
dtwork's adaptive batch (``ctx.loader(..., adaptive=True)`` + ``ctx.steps(..., adaptive=True)``) when
run on warm dtwork ranks (``Cluster.run_script``). Runs marked ``probe`` also estimate B_simple at every
evaluation from gradients of groups of sequences, to check that the critical batch grows; they
go on past the target, to the sample cap.

Time to target counts training only: the clock stops while the validation set is evaluated, which
happens at the same sample counts in every arm. Rank 0 writes the results to the spec's ``out``.
"""

from __future__ import annotations

import json
import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CHAIN = dict(vocab=16, order=1, alpha=0.3, seed=1234)  # the workload; never changed to suit a result
MODEL = dict(d=32, heads=2, layers=1, seq=16)
PROBE_GROUP = 32  # sequences per gradient in the B_simple probe


def chain_tables(vocab: int, order: int, alpha: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(transition rows by context, stationary distribution of contexts, entropy rate in nats)."""
    states = vocab**order
    gamma = torch.distributions.Gamma(torch.full((states, vocab), alpha), torch.ones(states, vocab))
    torch.manual_seed(seed)
    p = gamma.sample().double()
    p = p / p.sum(1, keepdim=True)
    step = torch.zeros(states, states, dtype=torch.float64)  # context (a, b) -> (b, v) with p[(a, b), v]
    for s in range(states):
        for v in range(vocab):
            step[s, (s * vocab) % states + v] += p[s, v]
    pi = torch.full((states,), 1.0 / states, dtype=torch.float64)
    for _ in range(10000):
        nxt = pi @ step
        if (nxt - pi).abs().max() < 1e-15:
            break
        pi = nxt
    rate = float(-(pi[:, None] * p * torch.log(p.clamp_min(1e-300))).sum())
    return p, pi, rate


def sample_sequences(p: torch.Tensor, pi: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    """``n`` sequences of ``length`` tokens, started from the stationary distribution of contexts."""
    states, vocab = p.shape
    order = round(math.log(states, vocab))
    g = torch.Generator().manual_seed(seed)
    ctx = torch.multinomial(pi.float(), n, replacement=True, generator=g)
    out = torch.empty(n, length, dtype=torch.long)
    for i in range(order):  # the context's own tokens, oldest first
        out[:, i] = (ctx // vocab ** (order - 1 - i)) % vocab
    for t in range(order, length):
        nxt = torch.multinomial(p[ctx].float(), 1, generator=g).squeeze(1)
        out[:, t] = nxt
        ctx = (ctx * vocab) % states + nxt
    return out


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.ln1, self.ln2 = heads, nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.blocks(self.tok(x) + self.pos[: x.shape[1]])))


def lm_loss(model: nn.Module, seqs: torch.Tensor, order: int) -> torch.Tensor:
    """Next-token loss on the targets that have a whole context before them (best: the entropy rate)."""
    logits = model(seqs[:, :-1])[:, order - 1 :]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seqs[:, order:].reshape(-1))


def chain_loss(p: torch.Tensor, seqs: torch.Tensor, order: int) -> float:
    """The true chain's loss on ``seqs``: the floor that this validation set allows."""
    vocab = p.shape[1]
    ctx = torch.zeros(seqs.shape[0], dtype=torch.long)
    for i in range(order):
        ctx = ctx * vocab + seqs[:, i]
    total = 0.0
    for t in range(order, seqs.shape[1]):
        total += float(-torch.log(p[ctx, seqs[:, t]]).sum())
        ctx = (ctx * vocab) % (vocab**order) + seqs[:, t]
    return total / (seqs.shape[0] * (seqs.shape[1] - order))


def val_loss(model: nn.Module, val: torch.Tensor, order: int) -> float:
    """The validation loss, each rank taking half of the set (the same number on every rank)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        part = val[rank::world]
        s = torch.tensor([float(lm_loss(model, part, order)) * part.shape[0], float(part.shape[0])])
    dist.all_reduce(s)
    return float(s[0] / s[1])


def b_simple_probe(model: nn.Module, probe: torch.Tensor, order: int, group: int) -> dict[str, float]:
    """B_simple = tr(Sigma) / |G|^2 per sequence, from the gradients of groups of ``group`` sequences.

    A group's gradient has covariance Sigma / group, so tr(Sigma) = group x their sample variance, and
    |G|^2 = |mean|^2 - tr(Sigma) / n is unbiased over the n sequences (McCandlish et al. 2018, app. A).
    """
    params = [q for q in model.parameters() if q.requires_grad]
    grads = []
    for chunk in probe.split(group):
        g = torch.autograd.grad(lm_loss(model, chunk, order), params)
        grads.append(torch.cat([x.reshape(-1) for x in g]).double())
    gs = torch.stack(grads)
    mean, m, n = gs.mean(0), gs.shape[0], probe.shape[0]
    trace = group * float(((gs - mean) ** 2).sum()) / (m - 1)
    g2 = float(mean @ mean) - trace / n
    return {"trace_sigma": trace, "g2": g2, "b_simple": trace / g2 if g2 > 0 else math.inf}


def shard(seqs: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """This rank's part of a global batch (index ``idx``)."""
    return seqs[idx[dist.get_rank() :: dist.get_world_size()]]


def train_fixed(run: dict, data: dict, spec: dict) -> dict:
    """Plain DDP at one global batch: a fresh shuffle every epoch, each rank its half of every batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(run["seed"])
    model = DDP(TinyLM(CHAIN["vocab"], **MODEL))
    opt = torch.optim.Adam(model.parameters(), lr=run["lr"])
    batch, train = run["batch"], data["train"]
    book = Book(spec, data, model.module, probe=run.get("probe", False))
    epoch = 0
    while not book.done:
        perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(run["seed"] * 1000 + epoch))
        for i in range(0, len(train) - batch + 1, batch):  # the ragged end of an epoch is dropped
            loss = lm_loss(model, shard(train, perm[i : i + batch]), CHAIN["order"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if book.stepped(batch, model.module, batch=batch, lr=run["lr"]):
                break
        epoch += 1
    return book.result()


def train_adaptive(run: dict, data: dict, spec: dict) -> dict:
    """dtwork's adaptive batch from the run's starting batch: the same model, data, optimizer and stop."""
    import dtwork

    ctx = dtwork.ctx()
    torch.manual_seed(run["seed"])
    model = ctx.wrap(TinyLM(CHAIN["vocab"], **MODEL), gns=True)
    opt = torch.optim.Adam(model.parameters(), lr=run["lr"])
    world = dist.get_world_size()
    dataset = torch.utils.data.TensorDataset(data["train"])
    loader = ctx.loader(dataset, batch_size=run["batch"] // world, adaptive=True, seed=run["seed"])
    book = Book(spec, data, _inner(model))
    micro, last = 0, None
    how = {k: spec[k] for k in ("max_global_batch", "decide_every", "lr_rule")}
    # max_steps counts progress (samples / the starting batch): the same sample cap as the fixed arm
    for _step, (x,) in ctx.steps(loader, adaptive=True, max_steps=spec["cap_samples"] // run["batch"], **how):
        loss = lm_loss(model, x, CHAIN["order"])
        ctx.backward(loss)
        micro += x.shape[0] * world
        if ctx.step(opt):
            decision = ctx.state.adaptive.decision  # rank 0's: the goodput prediction and its reason
            if decision is not None and decision is not last:
                why = [book.samples + micro, decision.efficiency, decision.predicted_gain, decision.reason]
                book.decisions.append(why)
                last = decision
            lr = opt.param_groups[0]["lr"]
            if book.stepped(micro, _inner(model), batch=ctx.global_batch_size, lr=lr):
                break
            micro = 0
    return book.result()


def _inner(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


class Book:
    """The clock, the counts, the evaluations (at fixed sample counts) and the stop of one run."""

    def __init__(self, spec: dict, data: dict, model: nn.Module, probe: bool = False) -> None:
        self.spec, self.data, self.done, self.reached, self.probe = spec, data, False, False, probe
        self.steps = self.samples = 0
        self.seconds, self.next_eval = 0.0, 0
        self.curve: list[list[float]] = []
        self.batches: list[list[float]] = []  # (samples, global batch, lr) at every change
        self.probes: list[dict[str, float]] = []
        self.decisions: list[list] = []  # the adaptive arm's: (samples, efficiency, predicted gain, why)
        self._evaluate(model)
        dist.barrier()
        self.t0 = time.perf_counter()

    def stepped(self, samples: int, model: nn.Module, batch: int, lr: float) -> bool:
        """Count an optimizer step of ``samples``; evaluate when a multiple of eval_every was crossed."""
        self.steps, self.samples = self.steps + 1, self.samples + samples
        if not self.batches or self.batches[-1][1:] != [batch, lr]:
            self.batches.append([self.samples, batch, lr])
        if self.samples >= self.next_eval:
            self.seconds += time.perf_counter() - self.t0
            self._evaluate(model)
            self.t0 = time.perf_counter()
        return self.done

    def _evaluate(self, model: nn.Module) -> None:
        loss = val_loss(model, self.data["val"], CHAIN["order"])
        self.curve.append([self.samples, self.steps, self.seconds, loss])
        if self.probe and dist.get_rank() == 0:
            probe = b_simple_probe(model, self.data["probe"], CHAIN["order"], PROBE_GROUP)
            self.probes.append({"samples": self.samples, **probe})
        self.next_eval += self.spec["eval_every"]
        if loss <= self.spec["target"] and not self.reached:
            self.reached, self.at = (
                True,
                {"seconds": self.seconds, "steps": self.steps, "samples": self.samples},
            )
        self.done = (self.reached and not self.probe) or self.samples >= self.spec["cap_samples"]
        dist.barrier()

    def result(self) -> dict:
        out = {"reached": self.reached, "curve": self.curve, "batches": self.batches, "probes": self.probes}
        out["decisions"] = self.decisions
        out |= {"total_seconds": self.seconds, "total_steps": self.steps, "total_samples": self.samples}
        return out | (self.at if self.reached else {"seconds": None, "steps": None, "samples": None})


def make_data(spec: dict) -> dict:
    p, pi, rate = chain_tables(**CHAIN)
    n = MODEL["seq"] + 1
    data = {"train": sample_sequences(p, pi, spec["train_sequences"], n, seed=1)}
    data["val"] = sample_sequences(p, pi, spec["val_sequences"], n, seed=2)
    data["probe"] = sample_sequences(p, pi, spec["probe_sequences"], n, seed=3)
    data["floor"] = {"entropy_rate": rate, "val_chain_loss": chain_loss(p, data["val"], CHAIN["order"])}
    return data


def main(path: str) -> None:
    spec = json.loads(open(path).read())
    torch.set_num_threads(1)  # one intra-op thread per rank in every arm
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    data = make_data(spec)
    results = []
    for run in spec["runs"]:
        train = train_adaptive if run.get("adaptive") else train_fixed
        results.append({**run, **train(run, data, spec)})
        if dist.get_rank() == 0:
            r = results[-1]
            print(f"run {run}: reached={r['reached']} s={r['seconds']} samples={r['samples']}", flush=True)
    if dist.get_rank() == 0:
        with open(spec["out"], "w") as f:
            json.dump({"floor": data["floor"], "runs": results}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
