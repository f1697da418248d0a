"""The gradient noise scale of ``ctx.steps``: which steps are measured, the norms of each, the estimate.

The wrapped models' hooks (``ddp_hooks``, ``fsdp_hooks``) measure the small and big batch norms
of an exchange; with accumulation on one rank the micro-batches are the small batches, measured
here around ``ctx.backward``. The loop sums the ranks' norms in its step sync and hands the
reduced values back to ``update``, which feeds the estimator (McCandlish et al. 2018).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

import torch

from dtwork.runtime.measure.ddp_hooks import measure_state
from dtwork.shared.timing import PERF_SECONDS

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

Norm = float | torch.Tensor  # a squared norm: read, or a 0-d tensor on the device until the sync


class Position(Protocol):
    """Where the loop is: what the meter reads of it."""

    k: int  # micro-batches per optimizer step
    micro: int  # micro-batches seen in this epoch
    is_last_micro: bool
    step: int


class GNSMeter:
    """Measure the noise scale on every ``gns.every``-th step of a loop at ``pos``."""

    def __init__(self, state: RankState, pos: Position) -> None:
        self.state = state
        self.pos = pos
        self.grad_scale = 1.0  # the loss scale of this step's gradients (fp16), set by ctx.backward
        self._micro: list[torch.Tensor] = []
        self._big: torch.Tensor | None = None
        self._snapshot: torch.Tensor | None = None
        self._record: tuple[int, dict[str, float]] | None = None  # the estimate not yet sent
        self._published = 0.0

    def models(self, active: bool = True) -> list[torch.nn.Module]:
        """The wrapped models measuring the noise scale; ``active``: those run forward in this step
        (a model of an earlier loop, still alive, is not trained by this one)."""
        return [
            m
            for m in self.state.models
            if (s := measure_state(m)) is not None and s.gns and (s.forwards or not active)
        ]

    def setup(self) -> None:
        """At a loop's start, once its first step is known: the estimator, and the first step armed."""
        if not self.models(active=False):
            return
        from dtwork.analysis.gns import GNSEstimator, no_estimate_reason

        reason = no_estimate_reason(self.state.world_size, self.pos.k)
        if reason is not None:
            if self.state.rank == 0:
                print(f"dtwork: {reason}")
            return
        gns = self.state.config.gns
        # one sample every `every` steps: decay^every per sample keeps the average's span in steps;
        # a loop over the same wrapped model goes on with its estimate (ctx.wrap starts a new one)
        if self.state.gns_state is None:
            self.state.gns_state = GNSEstimator(gns.ema_decay**gns.every)
        self.arm()

    def measuring(self) -> bool:
        """Whether the noise scale is measured at the step being taken (every Nth step)."""
        return self.state.gns_state is not None and self.pos.step % self.state.config.gns.every == 0

    def arm(self) -> None:
        """Tell the models' hooks whether the coming step is measured (the others skip the norms)."""
        if self.state.gns_state is None:
            return
        measuring = self.measuring()
        for m in self.models(active=False):
            state = measure_state(m)
            if state is not None:
                state.measuring = measuring

    def _grad_vector(self) -> torch.Tensor:
        grads = [
            p.grad.detach().float().flatten()
            for m in self.models()
            for p in m.parameters()
            if p.grad is not None
        ]
        return torch.cat(grads) if grads else torch.zeros(1, device=self.state.device)

    def micro_gns(self) -> bool:
        """Accumulation, on a measured step: the micro-batches are the small batches."""
        return self.pos.k > 1 and self.measuring()

    def before_backward(self) -> None:
        pos = self.pos
        if pos.k > 1 and self.measuring() and not (pos.is_last_micro and self.state.world_size > 1):
            self._snapshot = self._grad_vector() if pos.micro % pos.k else None

    def after_backward(self, scale: float) -> None:
        self.grad_scale = scale
        pos = self.pos
        if pos.k <= 1 or not self.measuring():
            return
        if pos.is_last_micro and self.state.world_size > 1:
            return  # the exchange replaced the local gradient: the hook measured the step's
        g = self._grad_vector()
        micro = g if self._snapshot is None else g - self._snapshot
        factor = pos.k if self.state.config.optimizations.average_aggregated_gradients else 1.0
        self._micro.append(micro.pow(2).sum() * factor**2 / scale**2)  # read with the sync
        if pos.is_last_micro:  # the accumulated gradient, before ctx.step zeroes it
            self._big = g.pow(2).sum() * (factor / pos.k) ** 2 / scale**2

    def step_norms(self, stepped: bool) -> tuple[Norm, Norm] | None:
        """At a step's end: its norms, unless the fp16 scaler skipped it (inf/NaN gradients)."""
        scaler = self.state.scaler
        if not stepped and scaler is not None:
            return None
        return self._local_norms(self.grad_scale if scaler is not None else 1.0)

    def _local_norms(self, scale: float) -> tuple[Norm, Norm] | None:
        """(local |G_small|^2, this rank's share of |G_big|^2) of this step, unscaled; None when not
        measured. The shares add up to |G_big|^2 in the sync all-reduce (at world size 1
        with accumulation the share is all of it). On an accelerator they stay 0-d tensors on
        the device, read with the sync (reading one here would wait for the device every step)."""
        norms = self._measured_norms(scale)
        if norms is None or self.state.device.type != "cpu":
            return norms
        return float(norms[0]), float(norms[1])

    def _measured_norms(self, scale: float) -> tuple[Norm, Norm] | None:
        if self.state.gns_state is None:
            return None
        states = [measure_state(m) for m in self.models()]
        norms = [s.norms() for s in states if s is not None]
        measured = [n for n in norms if n is not None]
        hooked = None
        if measured and len(measured) == len(norms):
            hooked = sum(n[0] for n in measured) / scale**2, sum(n[1] for n in measured) / scale**2
        if not self.micro_gns():
            return hooked
        micro, self._micro = self._micro, []
        big: Norm | None = self._big
        self._big = None
        k = self.pos.k
        if self.state.world_size > 1:  # k - 1 micro-batches per rank, the exchanged gradient's share
            averaged = self.state.config.optimizations.average_aggregated_gradients
            big = None if hooked is None else hooked[1] / (1.0 if averaged else k**2)
        elif len(micro) < 2:
            return None
        if not micro or big is None:
            return None
        return torch.stack(micro).sum() / len(micro), big

    def update(self, small: float, big: float, step: int, micro_len: int) -> None:
        """Feed the estimator one step's reduced norms (every rank); rank 0 sends the estimate."""
        from dtwork.analysis.gns import batch_sizes_for

        state, est = self.state, self.state.gns_state
        assert est is not None  # the caller checked
        b_small, b_big = batch_sizes_for(micro_len, state.world_size, self.pos.k)
        est.update(small, big, b_small, b_big)
        state.gns = est.b_simple
        values = est.record_values()
        if state.rank == 0 and values:
            self._record = (step, {**values, "b_small": float(b_small), "b_big": float(b_big)})
            self.publish()

    def publish(self, force: bool = False) -> None:
        """Send the latest estimate at most every PERF_SECONDS (and the last one of a loop):
        it is a moving average, and a record per step costs the kernel more than it tells."""
        if self._record is None:
            return
        now = time.perf_counter()
        if force or now - self._published >= PERF_SECONDS:
            step, values = self._record
            self.state.publisher.record("gns", step, values)
            self._record = None
            self._published = now
