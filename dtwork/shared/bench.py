"""The bench call's payloads: what the kernel's commands ask the ranks to time, and what a rank answers.

The analysis commands (``dtwork.commands``) build a ``BenchRequest``; ``dtwork.runtime.bench`` times
it on every rank and answers a ``BenchResult`` (or a ``BenchFailure``). Both sides import this
module, so it imports only the standard library: the kernel never loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict, final

__all__ = ["BenchFailure", "BenchRequest", "BenchResult", "LoaderFacts", "LoaderRequest", "LoaderSetting"]

LoaderSetting = dict[str, int | bool]  # DataLoader arguments to change, as typed: {"num_workers": 2}


class LoaderFacts(TypedDict):
    """What the loader advice needs to know about a rank's loader (``analysis.loading.candidates``)."""

    torch: bool  # a torch DataLoader (only those can be rebuilt with other settings)
    iterable: bool  # an IterableDataset: more workers would repeat its items
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    cores: int  # this rank's share of the host's cores
    cuda: bool


@dataclass(frozen=True)
class LoaderRequest:
    """The user's loader expression, evaluated on every rank, rebuilt with ``settings`` where given."""

    expr: str
    settings: LoaderSetting | None = None


@dataclass(frozen=True)
class BenchRequest:
    """Train ``eval(model_expr)`` under DDP on ranks 0..world-1: ``warmup`` untimed, ``steps`` timed.

    ``shape`` is one sample's input shape (None: the model's first layer's, or the loader's);
    ``bucket_mb`` DDP's bucket size (None: the config's ``tensor_fusion_threshold``); ``loader``
    the batches' source (None: synthetic batches of ``(per_slot, *shape)``).
    """

    model_expr: str
    world: int
    per_slot: int
    steps: int
    warmup: int
    shape: tuple[int, ...] | None = None
    bucket_mb: float | None = None
    loader: LoaderRequest | None = None


@final  # a closed shape, so `"error" in answer` tells a failure apart
class BenchResult(TypedDict):
    """One rank's timing of a ``BenchRequest``; ``world_samples_per_s`` and ``elapsed`` are world-wide.

    Throughput T = samples / elapsed seconds; a world's elapsed time is its slowest rank's, so
    T(world) = world x per-slot batch x steps / elapsed.
    """

    world: int
    rank: int
    per_slot: int
    shape: list[int] | None  # the input shape timed (found from the model or the loader)
    samples_per_s: float  # this rank's
    world_samples_per_s: float
    step_time: float  # mean seconds per step
    comm_time: float  # mean seconds per step of communication not hidden behind compute
    elapsed: float
    loader: LoaderFacts | None


@final
class BenchFailure(TypedDict):
    """A rank's answer when the model (or loader) expression failed: "Name: message", one line."""

    error: str
    rank: int
