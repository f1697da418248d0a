"""The measuring hook of FSDP models: communication time and the gradient noise scale's norms.

DDP models get both from ``hooks.measure_hook`` on their gradient buckets. An FSDP model has no
buckets: each sharded block all-gathers its parameters (forward and backward) and
reduce-scatters its gradients (backward), through comm objects that ``fully_shard`` lets us
replace. These wrap torch's own calls and record into the model's ``MeasureState``:

- every all-gather and reduce-scatter's duration counts as communication (``comm_seconds``);
- on a measured GNS step, the reduce-scatter's input is this rank's whole local gradient of
  the block (fp32: the policy reduces in fp32 with no pre-division), so ``|input|^2`` is the
  local norm, taken before the exchange; its output is this rank's shard of the averaged
  gradient, and the shards' ``|output|^2`` add up over ranks to the averaged gradient's norm,
  as the DDP hook's shares do. Padding is zeros and adds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from dtwork.runtime.measure.ddp_hooks import MeasureState, sq_norm


class _Alloc:
    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> Any:
        return torch.empty(*size, dtype=dtype, device=device)


class MeasuredAllGather(_Alloc, AllGather):
    """torch's default all-gather, timed."""

    def __init__(self, state: MeasureState) -> None:
        self.state = state

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> Any:
        t0 = time.perf_counter()
        work = dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
        self.state.add_comm(t0, time.perf_counter())
        return work


class MeasuredReduceScatter(_Alloc, ReduceScatter):
    """torch's default reduce-scatter, timed; with the GNS on a measured step, the norms."""

    def __init__(self, state: MeasureState) -> None:
        self.state = state

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        s = self.state
        gns = s.gns and s.measuring
        if gns:
            s.local_sq.append(sq_norm(input_tensor))
        t0 = time.perf_counter()
        work = dist.reduce_scatter_single(
            output=output_tensor, input=input_tensor, group=group, op=op, async_op=async_op
        )
        if gns:
            if work is not None and async_op:
                work.wait()
            s.reduced_sq.append(sq_norm(output_tensor))
        s.add_comm(t0, time.perf_counter())
        s.buckets += 1
        return work


def attach(model: torch.nn.Module, state: MeasureState) -> None:
    """Route every sharded module of ``model`` (its blocks and the root) through the measuring comms."""
    gather, scatter = MeasuredAllGather(state), MeasuredReduceScatter(state)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_custom_all_gather(gather)
            m.set_custom_reduce_scatter(scatter)
