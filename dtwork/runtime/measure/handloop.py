"""Loops written by hand (no ``ctx.steps``): throughput and the noise scale from the optimizer's step.

``ctx.wrap`` counts each training forward pass of the wrapped model (``hooks.count_forward``)
and installs, once per process, a post-hook on every optimizer's ``step``. Outside
``ctx.steps``, a step that follows an exchange of a wrapped model is a training step:

- the rank publishes "perf" records (samples/s from the counted examples, seconds per step,
  exposed communication) every ``PERF_SECONDS``, like the steps loop;
- with ``gns`` on, the step's squared norms measured by the comm hook are kept, and every
  ``every`` steps one small all-reduce sums them over the ranks (with the examples and the
  seconds per step) and feeds ``ctx.gns_state``; ``every`` follows the ranks' mean step time
  from that same all-reduce, so every rank agrees on when the next one comes.

A step the fp16 loss scaler skips never calls ``optimizer.step``, so it is not counted. The
small batch is a rank's examples of the step (accumulated under ``no_sync`` or not): a hand
loop's micro-batches are not seen one by one, so world size 1 gives no estimate.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from dtwork.runtime.core import run_axis
from dtwork.runtime.measure.ddp_hooks import measure_state
from dtwork.shared.records import make_perf_record
from dtwork.shared.timing import PERF_SECONDS, steps_per_sync

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState


class HandLoop:
    """The live view of the hand-written loops of one rank since the last ``ctx.wrap``."""

    def __init__(self, state: RankState) -> None:
        self.state = state
        self.reset()

    def reset(self) -> None:
        """Start over (a new ``ctx.wrap``): a new estimate, a new step count."""
        self.step = 0
        self.comm = 0.0  # exposed communication seconds of the last step
        self.every = 1  # steps per all-reduce of the norms; the same on every rank
        self._meta: list[float] = []  # per step: examples, measured (1 or 0)
        self._norms: list[torch.Tensor] = []  # per step: local |G_small|^2, share of |G_big|^2
        self._said_why = False
        self._perf: dict[str, float] = {}
        self.pause()

    def pause(self) -> None:
        """Between cells: the time until the next step is not training time."""
        self._perf = {"t": 0.0, "steps": 0, "samples": 0, "comm": 0.0}
        self._last_sync = 0.0
        self._in_segment = False  # each cell's first training step opens a segment of the run

    def on_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        """After an optimizer step: count it, publish throughput, keep (and sum) the norms."""
        state = self.state
        if state.loop is not None:  # ctx.steps keeps its own books
            return
        states = [s for m in state.models if (s := measure_state(m)) is not None and s.buckets]
        if not states:  # no wrapped model exchanged since the last step: not a training step
            return
        samples = max(s.samples for s in states)
        comm = sum(s.exposed_comm() for s in states)
        self.comm = comm  # the adaptive batch's throughput fit reads it after the step
        gns = [s for s in states if s.gns]
        norms = [s.norms() for s in gns]
        measured = [n for n in norms if n is not None]
        scale = float(state.scaler.get_scale()) if state.scaler is not None else 1.0  # before its update
        for s in states:
            s.reset()
            s.measuring = True  # a steps loop that sampled every Nth step may have left it off
        if not self._in_segment:  # the run's step axis: a new run after a new ctx.wrap, else go on
            self._in_segment = True
            self.step = run_axis.begin(state, None, "ctx.step")
            state.log_step = self.step - 1  # ctx.log without step= logs on the run's step axis too
        self.step += 1
        run_axis.end(state, self.step)
        # the watchdog names the rank that stops first
        state.publisher.progress(step=self.step, phase="train")
        self._perf_tick(samples, comm)
        if not gns or not self._estimating():
            return
        if measured and len(measured) == len(norms):  # kept on the device: read with the sum
            small, big = (torch.stack([n[i] for n in measured]).sum() / scale**2 for i in (0, 1))
            self._norms += [small, big]
            self._meta += [float(samples), 1.0]
        else:
            self._norms += [torch.zeros((), dtype=torch.float64, device=state.device)] * 2
            self._meta += [float(samples), 0.0]
        if len(self._meta) >= 2 * self.every:
            self._sync()

    def _estimating(self) -> bool:
        state = self.state
        if state.gns_state is not None:
            return True
        from dtwork.analysis.gns import GNSEstimator

        if state.world_size < 2:  # a hand loop's micro-batches are not seen: one batch size only
            if state.rank == 0 and not self._said_why:
                print("dtwork: no gradient noise scale estimate for a hand-written loop at world size 1")
            self._said_why = True
            return False
        state.gns_state = GNSEstimator(state.config.gns.ema_decay)
        return True

    def _sync(self) -> None:
        """Sum the kept steps over the ranks (one all-reduce) and feed the estimate."""
        state, est = self.state, self.state.gns_state
        assert est is not None  # _estimating made it
        meta, self._meta = self._meta, []
        norms, self._norms = self._norms, []
        n = len(meta) // 2
        now = time.perf_counter()
        per_step = (now - self._last_sync) / n if self._last_sync else 0.0
        self._last_sync = now
        head = torch.tensor([per_step, *meta], dtype=torch.float64, device=state.device)
        vec = torch.cat([head, torch.stack(norms).to(head.device)])
        dist.all_reduce(vec)
        values = vec.tolist()  # [seconds per step, (examples, measured) per step, (small, big) per step]
        ws = state.world_size
        if values[0] > 0:
            self.every = steps_per_sync(values[0] / ws)
        for i in range(n):
            samples, measured = values[1 + 2 * i], values[2 + 2 * i]
            small, big = values[1 + 2 * n + 2 * i], values[2 + 2 * n + 2 * i]
            if measured == ws and samples > 0:
                est.update(small / ws, big, samples / ws, samples)
        state.gns = est.b_simple
        record = est.record_values()
        if state.rank == 0 and record:
            b_big = values[2 * n - 1]
            record.update(b_small=b_big / ws, b_big=b_big)
            state.publisher.record("gns", self.step - 1, record)

    def _perf_tick(self, samples: int, comm: float) -> None:
        p = self._perf
        now = time.perf_counter()
        if not p["t"]:  # the first step only starts the clock
            p["t"] = now
            return
        p["steps"] += 1
        p["samples"] += samples
        p["comm"] += comm
        elapsed = now - p["t"]
        if elapsed < PERF_SECONDS:
            return
        self.state.publisher.add(
            make_perf_record(
                self.step - 1,
                self.state.rank,
                samples=p["samples"],
                seconds=elapsed,
                steps=int(p["steps"]),
                comm=p["comm"],
            )
        )
        self._perf = {"t": now, "steps": 0, "samples": 0, "comm": 0.0}


_current: HandLoop | None = None
_handle: RemovableHandle | None = None


def _on_step(optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    if _current is not None:
        _current.on_step(optimizer, args, kwargs)


def last_comm() -> float:
    """The exposed communication seconds of the last hand-loop step (0 before any)."""
    return _current.comm if _current is not None else 0.0


def _flush_after_cell() -> None:
    if _current is not None:  # the last records of a hand loop leave with its cell
        _current.state.publisher.flush()
        _current.pause()


def attach(state: RankState) -> HandLoop:
    """Start the hand-loop view of ``ctx`` over (a new ``ctx.wrap``); install the hooks once."""
    global _current, _handle
    if _current is None or _current.state is not state:
        _current = HandLoop(state)
    else:
        _current.reset()
    if _handle is None:
        _handle = register_optimizer_step_post_hook(_on_step)
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except ImportError:
            shell = None
        if shell is not None:
            shell.events.register("post_execute", _flush_after_cell)
    return _current
