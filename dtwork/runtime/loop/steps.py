"""``ctx.steps``: the training loop's bookkeeping, so the cell keeps plain PyTorch.

Per micro-batch it moves the batch to the device, toggles DDP's gradient sync for
``aggregation_frequency`` (only the last micro-batch of a step exchanges gradients, as
``no_sync`` does), enters autocast for mixed precision, and times data loading. Per step
it publishes throughput and checkpoints when due. The ranks agree on what each step leaves
behind (stop flag, GNS norms, logged scalars) through the sync of ``runtime/loop/sync.py``, so that
every rank takes the same decision at the same step (a consistent stop).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from dtwork.errors import DtworkError
from dtwork.runtime.checkpoint import trial as checkpoint
from dtwork.runtime.core import control, effective_args, run_axis
from dtwork.runtime.loop import guards
from dtwork.runtime.loop.adaptive import adaptive_for
from dtwork.runtime.loop.cadence import Cadence, LoopPosition
from dtwork.runtime.loop.data import adaptive_twin, batch_len, to_device
from dtwork.runtime.loop.options import AdaptiveOptions, LoopOptions
from dtwork.runtime.loop.precision import Autocast, setup_scaler
from dtwork.runtime.loop.span import Span
from dtwork.runtime.loop.sync import StepHead, StepSync, SyncedStep
from dtwork.runtime.measure.gns_meter import GNSMeter, Norm
from dtwork.runtime.measure.step_perf import StepPerf
from dtwork.runtime.parallel.strategy import strategy_of

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

Batch = object  # what the loader yields, moved to the device: the cell's to unpack


class StepLoop:
    """Iterate ``(step, batch)`` over micro-batches; ``step`` counts optimizer steps.

    It keeps where the loop is and composes one part per job: ``span`` (loader, first step, when it
    ends), ``autocast`` (precision), ``gns`` (the noise scale meter), ``perf`` (what a step exchanged,
    throughput and GPU records), ``cadence`` (validation, replica checks, checkpoints, the resume),
    ``sync`` (the ranks' one all-reduce); ``span.adaptive`` takes the adaptive batch's decisions.
    """

    def __init__(
        self,
        state: RankState,
        loader: Iterable[object],
        options: LoopOptions | None = None,
        adaptive: AdaptiveOptions | None = None,
    ) -> None:
        opts = options or LoopOptions()
        ada = adaptive or AdaptiveOptions()
        cfg = state.config
        self.state = state
        self.k = cfg.optimizations.aggregation_frequency
        cfg_steps, cfg_epochs = cfg.stop(state.global_batch_size)  # max_steps, else searcher.max_length
        if ada.adaptive:  # one switch: a plain ctx.loader(...) runs as its adaptive twin
            loader = adaptive_twin(state, loader)
        self.span = Span(
            loader,
            opts.max_steps if opts.max_steps is not None else cfg_steps,
            opts.max_epochs if opts.max_epochs is not None else cfg_epochs,
            None,
            opts.new_run,
        )
        self.perf = StepPerf(state)
        self.cadence = Cadence(state, opts, self.perf.trained, self.position)
        effective_args.note(
            state,
            "ctx.steps",
            max_steps=self.span.max_steps,
            max_epochs=self.span.max_epochs,
            resume=opts.resume or None,
            checkpoint_every=self.cadence.every,
            validate=opts.validate,
            check_replicas_every=opts.check_replicas_every,
            new_run=opts.new_run,
            accumulation=self.k,
            precision=cfg.mixed_precision,
        )
        self.cadence.check()
        self.step = 0
        self.micro = 0  # micro-batches seen in this epoch
        self.is_last_micro = True
        self.stepped = False
        self.memory_noted = False  # what a rank holds, recorded at the first optimizer step
        self.pending_optimizers: list[checkpoint.Waiting] = []  # a resume's, for optimizers made in this cell
        self.sync = StepSync(state.device, state.world_size, cfg.optimizations.average_training_metrics)
        self.add_log = self.sync.add_log  # ctx.log's short way, every step
        self.gns = GNSMeter(state, self)
        self.autocast = Autocast(state)
        # adaptive batch: the loader's decisions (runtime/loop/adaptive.py); max_steps then counts progress
        self.span.adaptive = adaptive_for(
            loader, ada.adaptive, ada.max_global_batch, ada.min_per_slot_batch, ada.decide_every, ada.lr_rule
        )

    @property
    def sync_every(self) -> int:
        return self.sync.sync_every

    @property
    def epoch(self) -> int:
        """The current pass over the data."""
        return self.span.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.span.epoch = value

    def before_backward(self) -> None:
        self.gns.before_backward()

    def after_backward(self, scale: float) -> None:
        self.gns.after_backward(scale)

    # -- the iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, Batch]]:
        state = self.state
        if state.loop is not None:
            raise DtworkError("ctx.steps is already running: nested training loops are not supported")
        opening = self.span.begin(state, resuming=self.cadence.resume is True)
        self.step = opening.first
        if self.step == 0:  # a run's first loop: no loss scale carried over from another run's model
            state.scaler = None
        setup_scaler(state)
        self.gns.setup()  # arms the GNS hooks for the first step: after the step is known
        try:
            resume_state, self.pending_optimizers = self.cadence.load_resume()
        except BaseException:
            run_axis.announce(state, opening)  # the kernel knows the run it began, also when this fails
            raise
        run_axis.announce(state, opening, resume_state["step"] if resume_state is not None else None)
        state.forget_dropped()  # held below for the whole loop: replaced models must be gone first
        models = state.models
        self.perf.begin(models)  # a failed cell may have left counts on one rank: start clean
        state.loop = self
        control.clear()
        control.enter_loop()
        self._progress("train")
        # Sent at once, not at the next flush interval: a rank that stalls at the loop's first
        # steps is then still named by the kernel's watchdog (it knows the loop started).
        state.publisher.flush()
        clean = False
        guard = None
        # a plain opt.step() of a model that exchanges nothing fails at its first step too
        exchanged = guards.exchanged_before_step(lambda: models)
        try:
            if self.k > 1:  # a plain opt.step() before the last micro-batch fails at once
                guard = guards.step_only_at_last_micro(lambda: (self.micro % self.k + 1, self.k))
            yield from self._epochs(resume_state)
            self.cadence.at_end(self.step)
            pending = self.pending_optimizers
            if pending and state.rank == 0 and self.step > self.span.first:
                print(checkpoint.untaken(pending))
            clean = True
        finally:
            exchanged.remove()
            if guard is not None:
                guard.remove()
            if not clean:
                control.left_loop_at(self.step)  # names the step if the cell fails
            try:
                self._drain()
            except Exception:
                if clean:
                    raise
                # left by an error: the sync in flight may have failed with the group
            self._publish_unsynced()
            self.gns.publish(force=True)
            control.exit_loop()
            run_axis.end(state, self.step)
            state.after_loop_step = max(0, self.step - 1)  # ctx.log after the loop: at its last step
            state.loop = None
            self._progress("done")
            state.publisher.flush()

    def _epochs(self, resume_state: LoopPosition | None) -> Iterator[tuple[int, Batch]]:
        span, adaptive = self.span, self.span.adaptive
        skip = 0
        if resume_state is not None:
            self.step, span.epoch, skip = resume_state["step"], resume_state["epoch"], resume_state["micro"]
            span.first = int(resume_state.get("first", 0))  # the resumed loop's own start
            self.gns.arm()
        if adaptive is not None:
            self.k = adaptive.begin(self.k, resume_state.get("adaptive") if resume_state else None)
            skip = 0  # the loader resumes at its own place
        if span.done(self.step):
            return
        loader = span.loader
        while True:
            set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
            if callable(set_epoch):
                set_epoch(span.epoch)
            it = iter(loader)
            self.micro = 0
            if adaptive is not None:  # the loader counts its passes, also over a resume
                span.epoch = adaptive.loader.epoch
            for _ in range(skip):
                next(it)
                self.micro += 1
            if resume_state is not None:
                checkpoint.restore_rng(resume_state["rng"])
                resume_state = None
            skip = 0
            t_wait = time.perf_counter()
            self.perf.start(t_wait)
            for batch in it:
                data_time = time.perf_counter() - t_wait
                yield from self._one(batch, data_time)
                if span.done(self.step):
                    return
                t_wait = time.perf_counter()
            span.epoch += 1
            if span.last_epoch():
                if self.sync.unsent:  # every rank ends its last epoch at the same step
                    self.sync.launch()
                return

    def _one(self, batch: object, data_time: float) -> Iterator[tuple[int, Batch]]:
        self.is_last_micro = (self.micro + 1) % self.k == 0
        perf = self.perf
        for m in perf.models:
            strategy_of(m).set_gradient_sync(m, self.is_last_micro)
        batch = to_device(batch, self.state.device)
        perf.micro(batch_len(batch), data_time)
        self.stepped = False
        with self.autocast():
            yield self.step, batch
        self.micro += 1
        if self.is_last_micro:
            self._end_step()

    # -- end of step ---------------------------------------------------------------------------

    def _end_step(self) -> None:
        cadence, span = self.cadence, self.span
        adaptive = span.adaptive
        if cadence.validate is not None:
            values = cadence.validation(self.step)
            if values is not None:
                self.add_log(values)  # logged at this step, like ctx.log
        norms = self.gns.step_norms(self.stepped)
        self.step += 1
        done = span.done(self.step)
        comm = self.perf.exchange(final=done)
        self.perf.tick(self.step, done)
        if adaptive is not None:
            adaptive.measure(comm)  # the progress that span.done() reads
        self._drain()  # launched a step ago or more; may stop the loop at this step
        self._record_step(norms)
        if self.sync.due() or span.done(self.step):
            self.sync.launch()
            if self.sync.waits_now:  # slow steps: agree at this step, so a stop leaves at its end
                self._drain()
        if adaptive is not None and adaptive.decide():
            if self.sync.unsent:  # the steps at the old batch: their GNS norms read with its sizes
                self.sync.launch()
            self._drain()
            self.k, self.micro = adaptive.split.accumulation, 0  # the next step's micro-batches
        self.gns.arm()
        cadence.after_step(self.step, span.stopped)
        self._progress("train")

    def _record_step(self, norms: tuple[Norm, Norm] | None) -> None:
        """Keep what this step leaves for the next sync: stop flag, GNS norms, logged means."""
        head = StepHead(stop=1.0 if control.requested() else 0.0)
        if norms:
            head.gns_small, head.gns_big_share, head.gns_measured = norms[0], norms[1], 1.0
        self.sync.record(self.step - 1, head)

    def _drain(self) -> None:
        for synced in self.sync.drain():
            self._step_synced(synced)

    def _step_synced(self, s: SyncedStep) -> None:
        """Act on one step's reduced values (the same on every rank)."""
        ws = self.state.world_size
        if s.head.stop > 0 and not self.span.stopped:
            # Every rank reads the same reduced flag at the same step: all leave together.
            self.span.stopped = True
            self.state.publisher.record(
                "event", self.step, {}, event="stopped", message=f"stopped at step {self.step}"
            )
        if s.local and self.state.rank == 0:
            avg = self.state.config.optimizations.average_training_metrics
            logged = {n: s.logs[i] if avg else float(s.local[n]) for i, n in enumerate(s.local)}
            self.state.publisher.record("log", s.step, logged)
        if s.head.gns_measured == ws and self.state.gns_state is not None:  # every rank measured it
            self.gns.update(
                float(s.head.gns_small) / ws, float(s.head.gns_big_share), s.step, self.perf.micro_len
            )

    def _publish_unsynced(self) -> None:
        """A loop left early on this rank (an error, a ``break``): its unsent steps cannot be
        reduced any more (the other ranks may not call the all-reduce); rank 0 records its own
        logged values for them, so that no row is lost."""
        entries = self.sync.take_unsent()
        if self.state.rank == 0:
            for step, local in entries:
                if local:
                    self.state.publisher.record("log", step, {n: float(v) for n, v in local.items()})

    # -- checkpoints, progress -------------------------------------------------------------------

    def position(self) -> LoopPosition:
        pos: LoopPosition = {
            "step": self.step,
            "epoch": self.span.epoch,
            "micro": self.micro,
            "first": self.span.first,
        }
        if self.span.adaptive is not None:
            pos["adaptive"] = self.span.adaptive.state_dict()
        return pos

    def _progress(self, phase: str) -> None:
        total = self.span.total(self.step)
        self.state.publisher.progress(step=self.step, total=total, phase=phase, epoch=self.span.epoch)
