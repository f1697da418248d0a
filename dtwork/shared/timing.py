"""How often a rank measures, agrees and reports: the runtime's timing constants, in one place.

The kernel reads ``PERF_SECONDS`` too (``dtwork.store.perf_thinner`` thins the perf records past many
ranks), so this module imports no torch at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "FLUSH_SECONDS",
    "GPU_SECONDS",
    "MAX_SYNC_EVERY",
    "PERF_SECONDS",
    "SYNC_SECONDS",
    "WAIT_SYNC_SECONDS",
    "steps_per_sync",
    "synchronize",
]

PERF_SECONDS = 0.1  # a rank publishes one perf record (and one GNS estimate) about this often
GPU_SECONDS = 1.0  # a rank samples its GPU's telemetry about this often
SYNC_SECONDS = 0.1  # the ranks agree about this often (stop, metrics, GNS), or every step when slower
WAIT_SYNC_SECONDS = 0.5  # steps at least this slow read their agreement at once (a stop leaves at that step)
MAX_SYNC_EVERY = 64  # the most steps one agreement waits for
FLUSH_SECONDS = 0.2  # a rank sends its batched records to the kernel at most this often


def steps_per_sync(mean_step_seconds: float) -> int:
    """Steps between two agreements for steps of ``mean_step_seconds`` (the ranks' mean, so the
    same on every rank): ``SYNC_SECONDS / mean`` clipped to ``[1, MAX_SYNC_EVERY]``."""
    return max(1, min(MAX_SYNC_EVERY, int(SYNC_SECONDS / mean_step_seconds)))


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work, so that a clock read next times it (a no-op on the CPU)."""
    if device.type == "cuda":
        import torch  # here, not at the top: the kernel imports this module

        torch.cuda.synchronize(device)
