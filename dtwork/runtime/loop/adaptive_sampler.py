"""The adaptive loader's sampler: one global order per epoch, its place kept in samples.

The per-slot batch can change between any two micro-batches without repeating or skipping one:
each micro-batch takes the next ``per_slot x world_size`` samples of the order and rank r keeps
its r-th slice (see ``runtime/loop/adaptive.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TypedDict

import torch

from dtwork.errors import DtworkError


class SamplerState(TypedDict):
    """A sampler's place in a checkpoint."""

    size: int
    per_slot: int
    seed: int
    shuffle: bool
    epoch: int
    position: int
    served: int


class AdaptiveSampler:
    """Index lists of this rank's next micro-batch from one global order, its place kept in samples."""

    def __init__(
        self, size: int, world_size: int, rank: int, per_slot: int, seed: int, shuffle: bool = True
    ) -> None:
        self.size, self.world_size, self.rank = size, world_size, rank
        self.per_slot, self.seed, self.shuffle = per_slot, seed, shuffle
        self.epoch = 0
        self.position = 0  # samples of this epoch's global order handed out (all ranks together)
        self.served = 0  # samples handed out since the start, all ranks together: the progress

    @property
    def usable(self) -> int:
        """The samples of an epoch: the order less its remainder over the ranks."""
        return self.size - self.size % self.world_size

    def order(self) -> list[int]:
        """This epoch's global order, the same on every rank (seed + epoch, as DistributedSampler)."""
        if not self.shuffle:
            return list(range(self.size))
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=gen).tolist()

    def begin(self) -> None:
        """Called as an epoch's iteration starts: a finished epoch gives way to the next."""
        if self.position and self.usable - self.position < self.world_size:
            self.epoch += 1
            self.position = 0

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order()
        while True:
            take = min(self.per_slot, (self.usable - self.position) // self.world_size)
            if take <= 0:
                break
            start = self.position + self.rank * take
            self.position += take * self.world_size
            self.served += take * self.world_size
            yield order[start : start + take]
        self.epoch += 1
        self.position = 0

    def __len__(self) -> int:
        return math.ceil((self.usable - self.position) / (self.per_slot * self.world_size))

    def state_dict(self) -> SamplerState:
        return {
            "size": self.size,
            "per_slot": self.per_slot,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self.epoch,
            "position": self.position,
            "served": self.served,
        }

    def load_state_dict(self, sd: SamplerState) -> None:
        if sd["size"] != self.size:
            raise DtworkError(
                f"the checkpoint's adaptive loader ran over {sd['size']} samples, this one has {self.size}: "
                "resume with the same dataset"
            )
        self.per_slot, self.seed, self.shuffle = sd["per_slot"], sd["seed"], sd["shuffle"]
        self.epoch, self.position, self.served = sd["epoch"], sd["position"], sd["served"]
