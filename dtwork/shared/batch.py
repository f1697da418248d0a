"""The global batch split over slots (Determined's rule), in one place for every side.

per-slot batch = floor(global_batch_size / slots); the remainder is dropped (with a visible
warning where a run starts), so the effective global batch is per-slot x slots.
"""

from __future__ import annotations

from dtwork.errors import ConfigError


def split(global_batch_size: int, slots: int) -> tuple[int, int]:
    """``(per_slot, dropped)`` for a global batch over ``slots``; refuse fewer examples than slots."""
    if slots < 1:
        raise ConfigError(f"slots: expected an integer >= 1, got {slots!r}")
    if global_batch_size < slots:
        raise ConfigError(
            f"global_batch_size {global_batch_size} is smaller than the {slots} slots: "
            f"each slot needs at least one example; use a global batch of at least {slots}"
        )
    per_slot = global_batch_size // slots
    return per_slot, global_batch_size - per_slot * slots


def per_slot(global_batch_size: int | None, slots: int) -> int | None:
    """Examples per slot per step, or None without a global batch."""
    return None if global_batch_size is None else split(global_batch_size, slots)[0]


def effective(global_batch_size: int | None, slots: int) -> int | None:
    """The global batch actually trained: per-slot x slots (the remainder dropped)."""
    p = per_slot(global_batch_size, slots)
    return None if p is None else p * slots
