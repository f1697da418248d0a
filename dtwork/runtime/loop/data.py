"""Data for the ranks: sharded loaders with the per-slot batch, and synthetic datasets."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dtwork.errors import DtworkError
from dtwork.runtime.core import effective_args
from dtwork.runtime.loop.adaptive import AdaptiveLoader, make_adaptive_loader

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

Shape = int | Sequence[int]  # one example's shape: (3, 32, 32), or 10 for (10,)


class SyntheticDataset(Dataset[tuple[torch.Tensor, ...]]):
    """Random tensors of fixed shapes, generated once (so loading costs nothing).

    ``SyntheticDataset((3, 32, 32), classes=10)`` yields ``(x, y)`` with ``x`` of that shape
    and an integer label; several shapes yield several float tensors. Same ``seed``, same data.
    """

    def __init__(
        self,
        *shapes: Shape,
        size: int = 1024,
        classes: int | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if not shapes:
            raise DtworkError(
                "ctx.synthetic needs at least one sample shape, e.g. ctx.synthetic((3, 32, 32), classes=10)"
            )
        if size < 1:
            raise DtworkError(f"ctx.synthetic: size must be >= 1, got {size}")
        gen = torch.Generator().manual_seed(seed)
        self.tensors = [torch.randn((size, *_shape(s)), generator=gen, dtype=dtype) for s in shapes]
        if classes is not None:
            self.tensors.append(torch.randint(0, classes, (size,), generator=gen))
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[idx] for t in self.tensors)


def _shape(s: Shape) -> tuple[int, ...]:
    return (int(s),) if isinstance(s, int) else tuple(int(v) for v in s)


def make_loader(
    state: RankState,
    dataset: Dataset[object],
    *,
    batch_size: int | None = None,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int | None = None,
    **kwargs: Any,
) -> DataLoader[object]:
    """A DataLoader over this rank's shard (DistributedSampler), with the per-slot batch size."""
    bs = batch_size or state.per_slot_batch_size or _default_batch(state)
    sampler: DistributedSampler[object] = DistributedSampler(
        dataset,
        num_replicas=state.world_size,
        rank=state.rank,
        shuffle=shuffle,
        seed=state.config.seed if seed is None else seed,
        drop_last=drop_last,
    )
    effective_args.note(
        state,
        "ctx.loader",
        batch_size=bs,
        shuffle=None if shuffle else False,
        drop_last=drop_last or None,
        seed=seed,
        **kwargs,
    )
    made = _Made(dataset, bs, shuffle, seed, dict(kwargs))
    kwargs.setdefault("pin_memory", state.device.type == "cuda")
    loader = DataLoader(dataset, batch_size=bs, sampler=sampler, **kwargs)
    _made[loader] = made
    return loader


DEFAULT_PER_SLOT = 32  # examples per rank when neither the cell, the start nor the config set a batch


def _default_batch(state: RankState) -> int:
    """The default per-slot batch, said once in one line on rank 0 so the user knows how to change it."""
    if state.rank == 0:
        print(
            f"dtwork: no global batch set; ctx.loader uses {DEFAULT_PER_SLOT} per rank "
            f"(global {DEFAULT_PER_SLOT * state.world_size}); choose with %dtrain start --global-batch-size G "
            "or ctx.loader(ds, batch_size=B)"
        )
    return DEFAULT_PER_SLOT


@dataclass
class _Made:
    """What ``ctx.loader`` made a plain loader from, and the adaptive twin made from it."""

    dataset: Dataset[object]
    batch_size: int
    shuffle: bool
    seed: int | None
    kwargs: dict[str, Any]  # the DataLoader's other arguments, as the user gave them
    twin: AdaptiveLoader | None = field(default=None, repr=False)


_made: weakref.WeakKeyDictionary[DataLoader[object], _Made] = weakref.WeakKeyDictionary()


def adaptive_twin(state: RankState, loader: Iterable[object]) -> Iterable[object]:
    """What ``ctx.steps(loader, adaptive=True)`` iterates: for a plain ``ctx.loader(...)``, an
    adaptive loader over the same dataset with the same arguments, made at its first such loop and
    the same one in every later loop (its place and batch go on); any other loader as it is.

    Hand loops keep ``ctx.loader(dataset, adaptive=True)``: the twin is not the rank's adaptive
    batch that a hand loop's ``ctx.step`` decides."""
    made = _made.get(loader) if isinstance(loader, DataLoader) else None
    if made is None:
        return loader
    if made.twin is None:
        kept = state.adaptive
        made.twin = make_adaptive_loader(
            state,
            made.dataset,
            batch_size=made.batch_size,
            shuffle=made.shuffle,
            seed=made.seed,
            **made.kwargs,
        )
        state.adaptive = kept
    return made.twin


def first_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The first module, in registration order, that holds parameters of its own: the input layer."""
    for m in model.modules():
        if next(m.parameters(recurse=False), None) is not None:
            return m
    return None


def input_shape(model: torch.nn.Module) -> tuple[int, ...] | None:
    """The shape of one example ``model`` takes, when its first layer is a Linear; None otherwise.

    A convolution's channels are known but not its spatial size, so it gives None (see ``shape_hint``).
    """
    first = first_layer(model)
    return (first.in_features,) if isinstance(first, torch.nn.Linear) else None


_CONV_SHAPES = {torch.nn.Conv1d: "{c},L", torch.nn.Conv2d: "{c},H,W", torch.nn.Conv3d: "{c},D,H,W"}


def shape_hint(model: torch.nn.Module, refused: tuple[int, ...] | None = None, said: str = "") -> str:
    """One line for a model whose input shape is unknown (or ``refused``), naming ``--shape``."""
    first = first_layer(model)
    layer = f"its first layer is {type(first).__name__}" if first is not None else "it has no parameters"
    example = "3,32,32"
    for kind, form in _CONV_SHAPES.items():
        if isinstance(first, kind):
            example = form.format(c=first.in_channels)
    name = type(model).__name__
    if refused is None:
        return f"could not infer the input shape of {name} ({layer}): pass --shape {example}"
    shape = ",".join(map(str, refused))
    return f"{name} refused inputs of shape {shape} ({said}; {layer}): pass --shape {example}"


def to_device(batch: object, device: torch.device) -> object:
    """Move every tensor in a (nested) batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        moved = [to_device(b, device) for b in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def batch_len(batch: object) -> int:
    """Number of examples in a batch (the first tensor's first dimension)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return batch_len(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_len(next(iter(batch.values())))
    return 1
