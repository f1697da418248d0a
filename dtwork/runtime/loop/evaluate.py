"""``ctx.evaluate``: distributed evaluation and batch inference without duplicates.

DistributedSampler pads the dataset so every rank gets as many examples; the padded copies
would count twice. Here each rank takes indices ``rank, rank + W, rank + 2W, ...`` with no
padding, computes sums (metrics) or outputs (inference), and the results are gathered once.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Subset

from dtwork.runtime.loop.data import batch_len, to_device

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

Source = DataLoader[object] | Dataset[object]  # a loader (its dataset and collate are used) or a dataset


def _shard(state: RankState, loader_or_dataset: Source, batch_size: int | None) -> DataLoader[object]:
    if isinstance(loader_or_dataset, DataLoader):
        dataset = loader_or_dataset.dataset
        batch_size = batch_size or loader_or_dataset.batch_size
        collate = loader_or_dataset.collate_fn
    else:
        dataset, collate = loader_or_dataset, None
    indices = list(range(state.rank, len(cast(Sized, dataset)), state.world_size))
    kwargs: dict[str, Any] = {"collate_fn": collate} if collate is not None else {}
    return DataLoader(
        Subset(dataset, indices), batch_size=batch_size or state.batch_size(), shuffle=False, **kwargs
    )


def _forward(model: torch.nn.Module, batch: object) -> torch.Tensor:
    inner = getattr(model, "module", model)  # skip DDP's forward sync
    x = batch[0] if isinstance(batch, (list, tuple)) else batch
    out: torch.Tensor = inner(x)
    return out


def evaluate(
    state: RankState,
    model: torch.nn.Module,
    loader_or_dataset: Source,
    metric_fn: Callable[..., object] | None = None,
    *,
    batch_size: int | None = None,
    forward: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor | float | dict[str, float]:
    """Evaluate ``model`` over the whole dataset, each rank its shard.

    With ``metric_fn(outputs, batch)`` returning per-example values (a tensor of shape [B],
    or a dict of them), return their means over the dataset (a float, or a dict) — exactly
    the one-process value. Without it, return the outputs of every example in dataset order
    (batch inference), on every rank.
    """
    loader = _shard(state, loader_or_dataset, batch_size)
    fwd = forward or _forward
    was_training = model.training
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    outputs: list[torch.Tensor] = []
    count = 0
    with torch.no_grad():
        for batch in loader:
            batch = to_device(batch, state.device)
            out = fwd(model, batch)
            count += batch_len(batch)
            if metric_fn is None:
                outputs.append(out.detach().cpu())
                continue
            values = metric_fn(out, batch)
            for name, v in values.items() if isinstance(values, dict) else [("value", values)]:
                total = torch.as_tensor(v, dtype=torch.float64, device=state.device).sum()
                sums[name] = sums.get(name, torch.zeros((), dtype=torch.float64, device=state.device)) + total
    model.train(was_training)
    if metric_fn is None:
        return _gather_outputs(state, outputs)
    return _reduce_means(state, sums, count, isinstance(values, dict) if count else False)


def _reduce_means(
    state: RankState, sums: dict[str, torch.Tensor], count: int, as_dict: bool
) -> float | dict[str, float]:
    names = sorted(sums) or ["value"]
    vec = torch.stack([sums.get(n, torch.zeros((), dtype=torch.float64, device=state.device)) for n in names])
    vec = torch.cat([vec, torch.tensor([float(count)], dtype=torch.float64, device=state.device)])
    dist.all_reduce(vec)
    total = vec[-1].item()
    means = {n: (vec[i].item() / total if total else float("nan")) for i, n in enumerate(names)}
    return means if as_dict or len(names) > 1 else means[names[0]]


def _gather_outputs(state: RankState, outputs: list[torch.Tensor]) -> torch.Tensor:
    mine = torch.cat(outputs) if outputs else torch.empty(0)
    shards: list[Any] = [None] * state.world_size
    dist.all_gather_object(shards, mine)
    total = sum(len(s) for s in shards)
    if total == 0:
        return mine
    out = torch.empty((total, *shards[0].shape[1:]) if len(shards[0]) else (total,), dtype=shards[0].dtype)
    for rank, shard in enumerate(shards):
        out[rank :: state.world_size] = shard
    return out
