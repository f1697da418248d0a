"""The end of a ``ctx.steps`` step: what it exchanged, and throughput and GPU records at intervals.

Per micro-batch the loop counts its examples and data-loading time here; per optimizer step this
reads the models' exchange (communication not hidden behind compute, whether gradients moved) and
sends a throughput record every ``PERF_SECONDS``, with a GPU sample at most every ``GPU_SECONDS``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from dtwork.runtime.measure.ddp_hooks import measure_state
from dtwork.shared.records import make_perf_record
from dtwork.shared.timing import GPU_SECONDS, PERF_SECONDS

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState


class StepPerf:
    """One loop's throughput window and the models it trained."""

    def __init__(self, state: RankState) -> None:
        self.state = state
        self.models: list[torch.nn.Module] = []  # the models the loop runs, fixed at its start
        self.trained: dict[int, torch.nn.Module] = {}  # those that exchanged gradients in it
        self.micro_len = 0  # examples in the last micro-batch
        self.samples = 0  # examples of the step being taken
        self.t = 0.0  # the window's start
        self.steps = 0  # the window's optimizer steps, examples, data and communication seconds
        self.window_samples = 0
        self.data = 0.0
        self.comm = 0.0
        self.exchanged = 0  # steps of the window that exchanged gradients
        self._last_gpu = 0.0

    def begin(self, models: list[torch.nn.Module]) -> None:
        """At a loop's start: its models, with clean counts (a failed cell may have left some)."""
        self.models = models
        for m in models:
            s = measure_state(m)
            if s is not None:
                s.reset()

    def start(self, now: float) -> None:
        """At an epoch's start: the window opens at the loop's first wait for data."""
        self.t = self.t or now

    def micro(self, n: int, data_time: float) -> None:
        self.micro_len = n
        self.samples += n
        self.data += data_time

    def exchange(self, final: bool = False) -> float:
        """At a step's end: the models' exposed communication seconds, counted (and their hooks reset);
        ``final``: the loop's last step, so a GPU's exchange times still owed are waited for."""
        comm = 0.0
        exchanged = False
        for m in self.models:
            s = measure_state(m)
            if s is not None:
                comm += s.exposed_comm(wait=final)
                if s.buckets:  # exchanged gradients: trained by this loop
                    self.trained[id(m)] = m
                    self.state.touch(m)
                    exchanged = True
                s.reset()
        self.window_samples += self.samples
        self.steps += 1
        self.comm += comm
        self.exchanged += exchanged
        self.samples = 0
        return comm

    def tick(self, step: int, done: bool) -> None:
        """Send the window's throughput once it spans ``PERF_SECONDS`` (or the loop is done)."""
        now = time.perf_counter()
        elapsed = now - self.t
        if elapsed < PERF_SECONDS and not done:
            return
        self.state.publisher.add(
            make_perf_record(
                step,
                self.state.rank,
                samples=self.window_samples,
                seconds=elapsed,
                steps=self.steps,
                comm=self.comm if self.exchanged else None,  # no exchange: no efficiency to show
                data=self.data,
            )
        )
        self.t, self.window_samples, self.steps, self.data, self.comm, self.exchanged = now, 0, 0, 0.0, 0.0, 0
        self._gpu_tick(step)

    def _gpu_tick(self, step: int) -> None:
        idx = self.state.gpu_index
        if idx is None or time.monotonic() - self._last_gpu < GPU_SECONDS:
            return
        self._last_gpu = time.monotonic()
        from dtwork.shared import telemetry

        for s in telemetry.sample([idx]):
            vals = {k: v for k, v in s.to_dict().items() if k != "index" and v is not None}
            self.state.publisher.record("gpu", step, vals)
