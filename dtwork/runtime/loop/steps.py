"""``ctx.steps``: the training loop's bookkeeping, so the cell keeps plain PyTorch.

Per micro-batch it moves the batch to the device, toggles DDP's gradient sync for
``aggregation_frequency`` (only the last micro-batch of a step exchanges gradients, as
``no_sync`` does), enters autocast for mixed precision, and times data loading. Per step
it publishes throughput and checkpoints when due. The ranks agree on what each step leaves
behind (stop flag, GNS norms, logged scalars) through the sync of ``runtime/loop/sync.py``, so that
every rank takes the same decision at the same step (a consistent stop).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from dtwork.errors import DtworkError
from dtwork.runtime.checkpoint import trial as checkpoint
from dtwork.runtime.core import control, effective_args, run_axis
from dtwork.runtime.loop import guards
from dtwork.runtime.loop.adaptive import adaptive_for
from dtwork.runtime.loop.data import batch_len, to_device
from dtwork.runtime.loop.sync import StepHead, StepSync, SyncedStep
from dtwork.runtime.measure.ddp_hooks import measure_state
from dtwork.runtime.parallel.strategy import run_strategy, strategy_of
from dtwork.shared.records import make_perf_record
from dtwork.shared.timing import GPU_SECONDS, PERF_SECONDS

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

Norm = float | torch.Tensor  # a squared norm: read, or a 0-d tensor on the device until the sync


class StepLoop:
    """Iterate ``(step, batch)`` over micro-batches; ``step`` counts optimizer steps."""

    def __init__(
        self,
        state: RankState,
        loader: Iterable[Any],
        *,
        max_steps: int | None = None,
        max_epochs: int | None = None,
        resume: Any = False,
        checkpoint_every: int | None = None,
        validate: Callable[[], Mapping[str, Any] | None] | None = None,
        validate_every: int | None = None,
        check_replicas_every: int | None = None,
        adaptive: bool = False,
        max_global_batch: int | None = None,
        min_per_slot_batch: int | None = None,
        decide_every: int | None = None,
        lr_rule: str | None = None,
        new_run: bool | None = None,
    ) -> None:
        cfg = state.config
        self.state = state
        self.loader = loader
        self.k = cfg.optimizations.aggregation_frequency
        cfg_steps, cfg_epochs = cfg.stop(state.global_batch_size)  # max_steps, else searcher.max_length
        self.max_steps = max_steps if max_steps is not None else cfg_steps
        self.max_epochs = max_epochs if max_epochs is not None else cfg_epochs
        if self.max_steps is None and self.max_epochs is None:
            self.max_epochs = 1
        self.resume = resume or state.auto_resume
        period = cfg.checkpoint.every or cfg.steps_in(cfg.min_checkpoint_period, state.global_batch_size)
        self.every = checkpoint_every if checkpoint_every is not None else period
        if self.every:  # before training: a folder another store's run owns is refused now
            checkpoint.check_owner(state)
        self.validate = validate
        effective_args.note(
            state,
            "ctx.steps",
            max_steps=self.max_steps,
            max_epochs=self.max_epochs,
            resume=resume or None,
            checkpoint_every=self.every,
            validate=validate,
            check_replicas_every=check_replicas_every,
            new_run=new_run,
            accumulation=self.k,
            precision=cfg.mixed_precision,
        )
        self.check_every = check_replicas_every  # steps between replica checks; else at the end only
        self.validate_every = validate_every or cfg.steps_in(
            cfg.min_validation_period, state.global_batch_size
        )
        if validate is not None and not self.validate_every:
            raise DtworkError(
                "ctx.steps(validate=fn) needs a period: min_validation_period in the config, or validate_every=N"
            )
        self._saved_step: int | None = None  # the step of the last checkpoint taken or resumed from
        self.new_run = new_run  # None: a new run after a new ctx.wrap, else go on (run_axis.begin)
        self.step = 0
        self.first = 0  # the run's step this loop began at: max_steps counts from it
        self.epoch = 0
        self.micro = 0  # micro-batches seen in this epoch
        self.is_last_micro = True
        self.stepped = False
        self.memory_noted = False  # what a rank holds, recorded at the first optimizer step
        self.pending_optimizers: list[dict[str, Any]] = []  # a resume's, for optimizers made in this cell
        self.stopped_early = False
        self.sync = StepSync(state.device, state.world_size, cfg.optimizations.average_training_metrics)
        self.add_log = self.sync.add_log  # ctx.log's short way, every step
        self._samples = 0
        self._gns_micro: list[torch.Tensor] = []
        self._gns_big: torch.Tensor | None = None
        self._gns_record: tuple[int, dict[str, float]] | None = None  # the estimate not yet sent
        self._gns_published = 0.0
        self._grad_snapshot: torch.Tensor | None = None
        self.grad_scale = 1.0  # the loss scale of this step's gradients (fp16), set by ctx.backward
        self._micro_len = 0
        self._perf = {"t": 0.0, "samples": 0, "steps": 0, "data": 0.0, "comm": 0.0, "exchanged": 0}
        self._last_gpu = 0.0
        self._models: list[torch.nn.Module] = []
        self._trained: dict[int, torch.nn.Module] = {}  # the wrapped models this loop trained
        # adaptive batch: the loader's decisions (runtime/loop/adaptive.py); max_steps then counts progress
        self.adaptive = adaptive_for(
            loader, adaptive, max_global_batch, min_per_slot_batch, decide_every, lr_rule
        )

    @property
    def sync_every(self) -> int:
        return self.sync.sync_every

    # -- the iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        state = self.state
        if state.loop is not None:
            raise DtworkError("ctx.steps is already running: nested training loops are not supported")
        self.first = self.step = run_axis.begin(
            state, self.new_run, "ctx.steps", resuming=self.resume is True, max_steps=self.max_steps
        )
        if self.first == 0:  # a run's first loop: no loss scale carried over from another run's model
            state.scaler = None
        self._setup_precision()
        self._setup_gns()  # arms the GNS hooks for the first step: after the step is known
        resume_state = self._load_resume() if self.resume else None
        gc.collect()  # held below for the whole loop: models that earlier cells replaced must be gone first
        self._models = state.models
        for m in self._models:  # a failed cell may have left counts on one rank: start clean
            s = measure_state(m)
            if s is not None:
                s.reset()
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
        exchanged = guards.exchanged_before_step(lambda: self._models)
        try:
            if self.k > 1:  # a plain opt.step() before the last micro-batch fails at once
                guard = guards.step_only_at_last_micro(lambda: (self.micro % self.k + 1, self.k))
            yield from self._epochs(resume_state)
            guards.check_replicas(list(self._trained.values()), self.step, state.device)
            if self.every and self.step and self._saved_step != self.step:
                self.save_checkpoint()  # the loop's end, also between two `every`
            if self.pending_optimizers and state.rank == 0 and self.step > self.first:
                print(
                    f"dtwork: the resumed checkpoint held {len(self.pending_optimizers)} optimizer state(s) "
                    "that no optimizer of this run took: step each optimizer with ctx.step(opt) (or make it "
                    "with ctx.optimizer) so its state is restored"
                )
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
            self._publish_gns(force=True)
            control.exit_loop()
            run_axis.end(state, self.step)
            state.loop = None
            self._progress("done")
            state.publisher.flush()

    def _epochs(self, resume_state: dict[str, Any] | None) -> Iterator[tuple[int, Any]]:
        skip = 0
        if resume_state is not None:
            self.step, self.epoch, skip = resume_state["step"], resume_state["epoch"], resume_state["micro"]
            self.first = int(resume_state.get("first", 0))  # the resumed loop's own start
            self._arm_gns()
        if self.adaptive is not None:
            self.k = self.adaptive.begin(self.k, resume_state)
            skip = 0  # the loader resumes at its own place
        if self._done():
            return
        while True:
            set_epoch = getattr(getattr(self.loader, "sampler", None), "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)
            it = iter(self.loader)
            self.micro = 0
            if self.adaptive is not None:  # the loader counts its passes, also over a resume
                self.epoch = self.adaptive.loader.epoch
            for _ in range(skip):
                next(it)
                self.micro += 1
            if resume_state is not None:
                checkpoint.restore_rng(resume_state["rng"])
                resume_state = None
            skip = 0
            t_wait = time.perf_counter()
            self._perf["t"] = self._perf["t"] or t_wait
            for batch in it:
                data_time = time.perf_counter() - t_wait
                yield from self._one(batch, data_time)
                if self._done():
                    return
                t_wait = time.perf_counter()
            self.epoch += 1
            if self.max_epochs is not None and self.epoch >= self.max_epochs:
                if self.sync.unsent:  # every rank ends its last epoch at the same step
                    self.sync.launch()
                return

    def _one(self, batch: Any, data_time: float) -> Iterator[tuple[int, Any]]:
        self.is_last_micro = (self.micro + 1) % self.k == 0
        for m in self._models:
            strategy_of(m).set_gradient_sync(m, self.is_last_micro)
        batch = to_device(batch, self.state.device)
        n = batch_len(batch)
        self._micro_len = n
        self._samples += n
        self._perf["data"] += data_time
        self.stepped = False
        with self._autocast():
            yield self.step, batch
        self.micro += 1
        if self.is_last_micro:
            self._end_step()

    def _done(self) -> bool:
        done = self.max_steps is not None and self._progress_steps() >= self.max_steps
        return self.stopped_early or done

    def _progress_steps(self) -> float:
        """This loop's optimizer steps, or with an adaptive batch the loader's progress in steps at the
        starting batch."""
        return self.step - self.first if self.adaptive is None else self.adaptive.progress

    # -- precision ---------------------------------------------------------------------------

    def _setup_precision(self) -> None:
        mp = self.state.config.mixed_precision
        kind = run_strategy(self.state.run_modules()).scaler_kind  # the run's models, not a stale one's
        if mp == "fp16" and type(self.state.scaler) is not kind:
            self.state.scaler = kind(self.state.device.type)
        elif mp != "fp16":
            self.state.scaler = None  # bf16 and fp32 need no loss scaling

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        mp = self.state.config.mixed_precision
        if mp == "none":
            return contextlib.nullcontext()
        dtype = torch.float16 if mp == "fp16" else torch.bfloat16
        return torch.autocast(self.state.device.type, dtype=dtype)

    # -- gradient noise scale -------------------------------------------------------------------

    def _gns_models(self, active: bool = True) -> list[torch.nn.Module]:
        """The wrapped models measuring the noise scale; ``active``: those run forward in this step
        (a model of an earlier loop, still alive, is not trained by this one)."""
        return [
            m
            for m in self.state.models
            if (s := measure_state(m)) is not None and s.gns and (s.forwards or not active)
        ]

    def _setup_gns(self) -> None:
        if not self._gns_models(active=False):
            return
        from dtwork.analysis.gns import GNSEstimator, no_estimate_reason

        reason = no_estimate_reason(self.state.world_size, self.k)
        if reason is not None:
            if self.state.rank == 0:
                print(f"dtwork: {reason}")
            return
        gns = self.state.config.gns
        # one sample every `every` steps: decay^every per sample keeps the average's span in steps;
        # a loop over the same wrapped model goes on with its estimate (ctx.wrap starts a new one)
        if self.state.gns_state is None:
            self.state.gns_state = GNSEstimator(gns.ema_decay**gns.every)
        self._arm_gns()

    def _gns_step(self) -> bool:
        """Whether the noise scale is measured at the step being taken (every Nth step)."""
        return self.state.gns_state is not None and self.step % self.state.config.gns.every == 0

    def _arm_gns(self) -> None:
        """Tell the models' hooks whether the coming step is measured (the others skip the norms)."""
        if self.state.gns_state is None:
            return
        measuring = self._gns_step()
        for m in self._gns_models(active=False):
            state = measure_state(m)
            if state is not None:
                state.measuring = measuring

    def _grad_vector(self) -> torch.Tensor:
        grads = [
            p.grad.detach().float().flatten()
            for m in self._gns_models()
            for p in m.parameters()
            if p.grad is not None
        ]
        return torch.cat(grads) if grads else torch.zeros(1, device=self.state.device)

    def micro_gns(self) -> bool:
        """Accumulation, on a measured step: the micro-batches are the small batches."""
        return self.k > 1 and self._gns_step()

    def before_backward(self) -> None:
        if self.micro_gns() and not (self.is_last_micro and self.state.world_size > 1):
            self._grad_snapshot = self._grad_vector() if self.micro % self.k else None

    def after_backward(self, scale: float) -> None:
        self.grad_scale = scale
        if not self.micro_gns():
            return
        if self.is_last_micro and self.state.world_size > 1:
            return  # the exchange replaced the local gradient: the hook measured the step's
        g = self._grad_vector()
        micro = g if self._grad_snapshot is None else g - self._grad_snapshot
        factor = self.k if self.state.config.optimizations.average_aggregated_gradients else 1.0
        self._gns_micro.append(micro.pow(2).sum() * factor**2 / scale**2)  # read with the sync
        if self.is_last_micro:  # the accumulated gradient, before ctx.step zeroes it
            self._gns_big = g.pow(2).sum() * (factor / self.k) ** 2 / scale**2

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
        states = [measure_state(m) for m in self._gns_models()]
        norms = [s.norms() for s in states if s is not None]
        measured = [n for n in norms if n is not None]
        hooked = None
        if measured and len(measured) == len(norms):
            hooked = sum(n[0] for n in measured) / scale**2, sum(n[1] for n in measured) / scale**2
        if not self.micro_gns():
            return hooked
        micro, self._gns_micro = self._gns_micro, []
        big: Norm | None = self._gns_big
        self._gns_big = None
        if self.state.world_size > 1:  # k - 1 micro-batches per rank, the exchanged gradient's share
            averaged = self.state.config.optimizations.average_aggregated_gradients
            big = None if hooked is None else hooked[1] / (1.0 if averaged else self.k**2)
        elif len(micro) < 2:
            return None
        if not micro or big is None:
            return None
        return torch.stack(micro).sum() / len(micro), big

    def _gns_sizes(self) -> tuple[int, int]:
        from dtwork.analysis.gns import batch_sizes_for

        return batch_sizes_for(self._micro_len, self.state.world_size, self.k)

    # -- end of step ---------------------------------------------------------------------------

    def _end_step(self) -> None:
        state = self.state
        if self.validate is not None and self.validate_every and (self.step + 1) % self.validate_every == 0:
            self.add_log(dict(self.validate() or {}))  # logged at this step, like ctx.log
        scale = self.grad_scale if state.scaler is not None else 1.0  # the scale the gradients carry
        norms = self._local_norms(scale) if self.stepped or state.scaler is None else None
        self.step += 1
        comm = 0.0
        exchanged = False
        for m in self._models:
            s = measure_state(m)
            if s is not None:
                comm += s.exposed_comm()
                if s.buckets:  # exchanged gradients: trained by this loop
                    self._trained[id(m)] = m
                    self.state.touch(m)
                    exchanged = True
                s.reset()
        self._perf_tick(comm, exchanged)
        if self.adaptive is not None:
            self.adaptive.measure(comm)  # the progress that _done() reads
        self._drain()  # launched a step ago or more; may stop the loop at this step
        self._record_step(norms)
        if self.sync.due() or self._done():
            self.sync.launch()
            if self.sync.waits_now:  # slow steps: agree at this step, so a stop leaves at its end
                self._drain()
        if self.adaptive is not None and self.adaptive.decide():
            if self.sync.unsent:  # the steps at the old batch: their GNS norms read with its sizes
                self.sync.launch()
            self._drain()
            self.k, self.micro = self.adaptive.split.accumulation, 0  # the next step's micro-batches
        self._arm_gns()
        if self.check_every and self.step % self.check_every == 0:
            guards.check_replicas(list(self._trained.values()), self.step, state.device)
        if self.every and (self.step % self.every == 0 or self.stopped_early):
            self.save_checkpoint()
        self._progress("train")

    def _perf_tick(self, comm: float, exchanged: bool) -> None:
        p = self._perf
        p["samples"] += self._samples
        p["steps"] += 1
        p["comm"] += comm
        p["exchanged"] += exchanged
        self._samples = 0
        now = time.perf_counter()
        elapsed = now - p["t"]
        if elapsed < PERF_SECONDS and not self._done():
            return
        self.state.publisher.add(
            make_perf_record(
                self.step,
                self.state.rank,
                samples=p["samples"],
                seconds=elapsed,
                steps=int(p["steps"]),
                comm=p["comm"] if p["exchanged"] else None,  # no exchange: no efficiency to show
                data=p["data"],
            )
        )
        self._perf = {"t": now, "samples": 0, "steps": 0, "data": 0.0, "comm": 0.0, "exchanged": 0}
        self._gpu_tick()

    def _gpu_tick(self) -> None:
        idx = self.state.gpu_index
        if idx is None or time.monotonic() - self._last_gpu < GPU_SECONDS:
            return
        self._last_gpu = time.monotonic()
        from dtwork.shared import telemetry

        for s in telemetry.sample([idx]):
            vals = {k: v for k, v in s.to_dict().items() if k != "index" and v is not None}
            self.state.publisher.record("gpu", self.step, vals)

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
        if s.head.stop > 0 and not self.stopped_early:
            # Every rank reads the same reduced flag at the same step: all leave together.
            self.stopped_early = True
            self.state.publisher.record(
                "event", self.step, {}, event="stopped", message=f"stopped at step {self.step}"
            )
        if s.local and self.state.rank == 0:
            avg = self.state.config.optimizations.average_training_metrics
            logged = {n: s.logs[i] if avg else float(s.local[n]) for i, n in enumerate(s.local)}
            self.state.publisher.record("log", s.step, logged)
        if s.head.gns_measured == ws and self.state.gns_state is not None:  # every rank measured it
            self._gns_update(float(s.head.gns_small) / ws, float(s.head.gns_big_share), s.step)

    def _publish_unsynced(self) -> None:
        """A loop left early on this rank (an error, a ``break``): its unsent steps cannot be
        reduced any more (the other ranks may not call the all-reduce); rank 0 records its own
        logged values for them, so that no row is lost."""
        entries = self.sync.take_unsent()
        if self.state.rank == 0:
            for step, local in entries:
                if local:
                    self.state.publisher.record("log", step, {n: float(v) for n, v in local.items()})

    def _gns_update(self, small: float, big: float, step: int) -> None:
        state, est = self.state, self.state.gns_state
        assert est is not None  # the caller checked
        b_small, b_big = self._gns_sizes()
        est.update(small, big, b_small, b_big)
        state.gns = est.b_simple
        values = est.record_values()
        if state.rank == 0 and values:
            self._gns_record = (step, {**values, "b_small": float(b_small), "b_big": float(b_big)})
            self._publish_gns()

    def _publish_gns(self, force: bool = False) -> None:
        """Send the latest estimate at most every PERF_SECONDS (and the last one of a loop):
        it is a moving average, and a record per step costs the kernel more than it tells."""
        if self._gns_record is None:
            return
        now = time.perf_counter()
        if force or now - self._gns_published >= PERF_SECONDS:
            step, values = self._gns_record
            self.state.publisher.record("gns", step, values)
            self._gns_record = None
            self._gns_published = now

    # -- checkpoints, progress -------------------------------------------------------------------

    def position(self) -> dict[str, Any]:
        pos: dict[str, Any] = {
            "step": self.step,
            "epoch": self.epoch,
            "micro": self.micro,
            "first": self.first,
        }
        if self.adaptive is not None:
            pos["adaptive"] = self.adaptive.state_dict()
        return pos

    def save_checkpoint(self) -> None:
        gc.collect()  # a checkpoint holds the live models only (not those earlier cells replaced)
        path = checkpoint.save(self.state, self.position())
        self._saved_step = self.step
        if path is not None:
            self.state.publisher.record(
                "event", self.step, {}, event="checkpoint", message=f"checkpoint {path}"
            )

    def _load_resume(self) -> dict[str, Any] | None:
        gc.collect()  # resume into the live models only
        found = checkpoint.resume_from(self.state, self.resume)
        if found is None:
            if self.state.rank == 0:
                print("dtwork: resume=True but no checkpoint yet: starting from step 0")
            return None
        path, position = found
        self.pending_optimizers = position.pop(checkpoint.PENDING, [])
        self._saved_step = position["step"]
        if self.state.rank == 0:
            print(f"dtwork: resumed from {path} (step {position['step']})")
        return position

    def _progress(self, phase: str) -> None:
        total = None if self.max_steps is None else self.first + self.max_steps
        if self.adaptive is not None and self.max_steps is not None:  # in optimizer steps, as `step`
            total = self.adaptive.steps_total(self.step, self.max_steps)
        self.state.publisher.progress(step=self.step, total=total, phase=phase, epoch=self.epoch)
