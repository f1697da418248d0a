"""``ctx.steps``: the training loop's bookkeeping, so the cell keeps plain PyTorch.

Per micro-batch it moves the batch to the device, toggles DDP's gradient sync for
``aggregation_frequency`` (only the last micro-batch of a step exchanges gradients, as
``no_sync`` does), enters autocast for mixed precision, and times data loading. Per step
it publishes throughput and checkpoints when due. The ranks agree on what each step leaves
behind ([stop flag, local |g|^2 for the GNS, logged scalars]) through ONE small asynchronous
all-reduce that carries the steps since the last one: launched every ``sync_every`` steps,
read one step later (so it overlaps compute), and every rank takes the same decision at the
same step (a consistent stop). ``sync_every`` follows the step time, the same on every rank
(it comes from the reduced values): every step when steps are slower than ``SYNC_SECONDS``,
fewer all-reduces for fast steps, whose latency (~0.7 ms with gloo on a small machine) would
otherwise cost a large share of each step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from dtwork.errors import DtworkError
from dtwork.runtime import checkpoint, control
from dtwork.runtime.data import batch_len, to_device
from dtwork.runtime.ddp import measure_state

MAX_LOGGED = 32
PERF_SECONDS = 0.1
HEAD = 4  # values per step before the logged metrics in the sync all-reduce (see _launch_sync)
SYNC_SECONDS = 0.1  # the ranks agree about this often (stop, metrics, GNS), or every step when slower
MAX_SYNC_EVERY = 64
GPU_SECONDS = 1.0


class StepLoop:
    """Iterate ``(step, batch)`` over micro-batches; ``step`` counts optimizer steps."""

    def __init__(
        self,
        ctx: Any,
        loader: Iterable[Any],
        *,
        max_steps: int | None = None,
        max_epochs: int | None = None,
        resume: Any = False,
        checkpoint_every: int | None = None,
        validate: Callable[[], Mapping[str, Any] | None] | None = None,
        validate_every: int | None = None,
    ) -> None:
        cfg = ctx.config
        self.ctx = ctx
        self.loader = loader
        self.k = cfg.optimizations.aggregation_frequency
        cfg_steps, cfg_epochs = cfg.stop(ctx.global_batch_size)  # max_steps, else searcher.max_length
        self.max_steps = max_steps if max_steps is not None else cfg_steps
        self.max_epochs = max_epochs if max_epochs is not None else cfg_epochs
        if self.max_steps is None and self.max_epochs is None:
            self.max_epochs = 1
        self.resume = resume or getattr(ctx, "auto_resume", False)
        period = cfg.checkpoint.every or cfg.steps_in(cfg.min_checkpoint_period, ctx.global_batch_size)
        self.every = checkpoint_every if checkpoint_every is not None else period
        self.validate = validate
        self.validate_every = validate_every or cfg.steps_in(cfg.min_validation_period, ctx.global_batch_size)
        if validate is not None and not self.validate_every:
            raise DtworkError(
                "ctx.steps(validate=fn) needs a period: min_validation_period in the config, or validate_every=N"
            )
        self._saved_step: int | None = None  # the step of the last checkpoint taken or resumed from
        self.step = 0
        self.epoch = 0
        self.micro = 0  # micro-batches seen in this epoch
        self.is_last_micro = True
        self.stepped = False
        self.stopped_early = False
        self._logs: dict[str, list[torch.Tensor | float]] = {}
        # steps not yet sent: (step, head values, {logged name: local mean}); the sync in flight
        self._unsynced: list[tuple[int, list[float], dict[str, Any]]] = []
        self._pending: tuple[Any, torch.Tensor, list[tuple[int, list[float], dict[str, Any]]]] | None = None
        self.sync_every = 1  # steps per sync all-reduce; the same on every rank
        self._last_sync = 0.0
        self._samples = 0
        self._gns_micro: list[float] = []
        self._gns_big: float | None = None
        self._gns_record: tuple[int, dict[str, float]] | None = None  # the estimate not yet sent
        self._gns_published = 0.0
        self._grad_snapshot: torch.Tensor | None = None
        self._micro_len = 0
        self._perf = {"t": 0.0, "samples": 0, "steps": 0, "data": 0.0, "comm": 0.0}
        self._last_gpu = 0.0
        self._models: list[Any] = []

    # -- the iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        ctx = self.ctx
        if ctx.loop is not None:
            raise DtworkError("ctx.steps is already running: nested training loops are not supported")
        self._setup_precision()
        self._setup_gns()
        resume_state = self._load_resume() if self.resume else None
        self._models = ctx.models
        ctx.loop = self
        control.clear()
        control.enter_loop()
        self._progress("train")
        # Sent at once, not at the next flush interval: a rank that stalls at the loop's first
        # steps is then still named by the kernel's watchdog (it knows the loop started).
        ctx.publisher.flush()
        try:
            yield from self._epochs(resume_state)
            if self.every and self.step and self._saved_step != self.step:
                self.save_checkpoint()  # the loop's end, also between two `every`
        finally:
            self._drain_pending()
            self._publish_unsynced()
            self._publish_gns(force=True)
            control.exit_loop()
            ctx.loop = None
            self._progress("done")
            ctx.publisher.flush()

    def _epochs(self, resume_state: dict[str, Any] | None) -> Iterator[tuple[int, Any]]:
        skip = 0
        if resume_state is not None:
            self.step, self.epoch, skip = resume_state["step"], resume_state["epoch"], resume_state["micro"]
            self._arm_gns()
        if self._done():
            return
        while True:
            set_epoch = getattr(getattr(self.loader, "sampler", None), "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)
            it = iter(self.loader)
            self.micro = 0
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
                if self._unsynced:  # every rank ends its last epoch at the same step
                    self._launch_sync()
                return

    def _one(self, batch: Any, data_time: float) -> Iterator[tuple[int, Any]]:
        self.is_last_micro = (self.micro + 1) % self.k == 0
        for m in self._models:
            m.require_backward_grad_sync = self.is_last_micro
        batch = to_device(batch, self.ctx.device)
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
        return self.stopped_early or (self.max_steps is not None and self.step >= self.max_steps)

    # -- precision ---------------------------------------------------------------------------

    def _setup_precision(self) -> None:
        mp = self.ctx.config.mixed_precision
        if mp == "fp16" and self.ctx._scaler is None:
            self.ctx._scaler = torch.amp.GradScaler(self.ctx.device.type)

    def _autocast(self) -> Any:
        mp = self.ctx.config.mixed_precision
        if mp == "none":
            return contextlib.nullcontext()
        dtype = torch.float16 if mp == "fp16" else torch.bfloat16
        return torch.autocast(self.ctx.device.type, dtype=dtype)

    # -- gradient noise scale -------------------------------------------------------------------

    def _gns_models(self) -> list[Any]:
        return [m for m in self.ctx.models if (s := measure_state(m)) is not None and s.gns]  # once per step

    def _setup_gns(self) -> None:
        self.ctx.gns_state = None  # a new loop starts a new estimate (a resume restores it)
        if not self._gns_models():
            return
        from dtwork.analysis.gns import GNSEstimator, no_estimate_reason

        reason = no_estimate_reason(self.ctx.world_size, self.k)
        if reason is not None:
            if self.ctx.rank == 0:
                print(f"dtwork: {reason}")
            return
        gns = self.ctx.config.gns
        # one sample every `every` steps: decay^every per sample keeps the average's span in steps
        self.ctx.gns_state = GNSEstimator(gns.ema_decay**gns.every)
        self._arm_gns()

    def _gns_step(self) -> bool:
        """Whether the noise scale is measured at the step being taken (every Nth step)."""
        return self.ctx.gns_state is not None and self.step % self.ctx.config.gns.every == 0

    def _arm_gns(self) -> None:
        """Tell the models' hooks whether the coming step is measured (the others skip the norms)."""
        if self.ctx.gns_state is None:
            return
        measuring = self._gns_step()
        for m in self._gns_models():
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
        return torch.cat(grads) if grads else torch.zeros(1, device=self.ctx.device)

    def micro_gns(self) -> bool:
        """World size 1 with accumulation, on a measured step: the micro-batches are the small batches."""
        return self.ctx.world_size == 1 and self._gns_step()

    def before_backward(self) -> None:
        if self.micro_gns():
            self._grad_snapshot = self._grad_vector() if self.micro % self.k else None

    def after_backward(self, scale: float) -> None:
        if not self.micro_gns():
            return
        g = self._grad_vector()
        micro = g if self._grad_snapshot is None else g - self._grad_snapshot
        factor = self.k if self.ctx.config.optimizations.average_aggregated_gradients else 1.0
        self._gns_micro.append(float(micro.pow(2).sum()) * factor**2 / scale**2)
        if self.is_last_micro:  # the accumulated gradient, before ctx.step zeroes it
            self._gns_big = float(g.pow(2).sum()) * (factor / self.k) ** 2 / scale**2

    def _local_norms(self, scale: float) -> tuple[float, float] | None:
        """(local |G_small|^2, this rank's share of |G_big|^2) of this step, unscaled; None when not
        measured. The shares add up to |G_big|^2 in the sync all-reduce (at world size 1
        with accumulation the share is all of it)."""
        if self.ctx.gns_state is None:
            return None
        if self.micro_gns():
            micro, self._gns_micro = self._gns_micro, []
            if len(micro) < 2 or self._gns_big is None:
                return None
            big, self._gns_big = self._gns_big, None
            return sum(micro) / len(micro), big
        states = [measure_state(m) for m in self._gns_models()]
        norms = [s.norms() for s in states if s is not None]
        measured = [n for n in norms if n is not None]
        if not measured or len(measured) != len(norms):
            return None
        return sum(n[0] for n in measured) / scale**2, sum(n[1] for n in measured) / scale**2

    def _gns_sizes(self) -> tuple[int, int]:
        from dtwork.analysis.gns import batch_sizes_for

        return batch_sizes_for(self._micro_len, self.ctx.world_size, self.k)

    # -- end of step ---------------------------------------------------------------------------

    def _end_step(self) -> None:
        ctx = self.ctx
        if self.validate is not None and self.validate_every and (self.step + 1) % self.validate_every == 0:
            self.add_log(dict(self.validate() or {}))  # logged at this step, like ctx.log
        scale = float(ctx._scaler.get_scale()) if ctx._scaler is not None else 1.0
        norms = self._local_norms(scale) if self.stepped or ctx._scaler is None else None
        self.step += 1
        comm = 0.0
        for m in self._models:
            s = measure_state(m)
            if s is not None:
                comm += s.exposed_comm()
                s.reset()
        self._perf_tick(comm)
        self._drain_pending()  # launched a step ago or more; may stop the loop at this step
        self._record_step(norms)
        if len(self._unsynced) >= self.sync_every or self._done():
            self._launch_sync()
        self._arm_gns()
        if self.every and (self.step % self.every == 0 or self.stopped_early):
            self.save_checkpoint()
        self._progress("train")

    def _perf_tick(self, comm: float) -> None:
        p = self._perf
        p["samples"] += self._samples
        p["steps"] += 1
        p["comm"] += comm
        self._samples = 0
        now = time.perf_counter()
        elapsed = now - p["t"]
        if elapsed < PERF_SECONDS and not self._done():
            return
        steps = max(1, int(p["steps"]))
        step_time = elapsed / steps
        values = {
            "samples_per_s": p["samples"] / elapsed if elapsed > 0 else 0.0,
            "step_time": step_time,
            "data_time": p["data"] / steps,
            "comm_time": p["comm"] / steps,
            "compute_time": max(0.0, step_time - (p["data"] + p["comm"]) / steps),
        }
        self.ctx.publisher.record("perf", self.step, values)
        self._perf = {"t": now, "samples": 0, "steps": 0, "data": 0.0, "comm": 0.0}
        self._gpu_tick()

    def _gpu_tick(self) -> None:
        idx = getattr(self.ctx, "gpu_index", None)
        if idx is None or time.monotonic() - self._last_gpu < GPU_SECONDS:
            return
        self._last_gpu = time.monotonic()
        from dtwork import telemetry

        for s in telemetry.sample([idx]):
            vals = {k: v for k, v in s.to_dict().items() if k != "index" and v is not None}
            self.ctx.publisher.record("gpu", self.step, vals)

    def add_log(self, scalars: dict[str, Any]) -> None:
        """Keep the step's values at the least cost per call: it runs every step, in the loop's
        cold path, where every tensor operation pays the dispatcher's cold path (~5-15 us on a CPU).
        A number is kept as a float. A tensor on the CPU is read at once (``item``: there is no
        device to wait for, and a tensor kept until the sync cost a CPU rank ~10 us a step more:
        ``python -m benchmarks.rank_log``); a tensor on an accelerator is detached and kept, and
        the sync reads all of them in one operation (reading it here would wait for the device)."""
        logs = self._logs
        for name, value in scalars.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise DtworkError(
                        f"ctx.log({name}=...) takes a number or a one-element tensor, got a tensor of shape "
                        f"{tuple(value.shape)}: log a reduction of it (.mean(), .sum())"
                    )
                value = value.item() if value.is_cpu else value.detach()
            else:
                value = float(value)
            kept = logs.get(name)
            if kept is None:
                logs[name] = [value]
            else:
                kept.append(value)

    def _record_step(self, norms: tuple[float, float] | None) -> None:
        """Keep what this step leaves for the next sync: stop flag, GNS norms, logged means."""
        names = sorted(self._logs)[:MAX_LOGGED]
        local = {n: _mean(self._logs[n], self.ctx.device) for n in names}
        self._logs = {}
        small, big_share = norms if norms else (0.0, 0.0)
        # [stop requested, local |G_small|^2, ranks that measured, share of |G_big|^2]; logs follow
        head = [1.0 if control.requested() else 0.0, small, 1.0 if norms else 0.0, big_share]
        self._unsynced.append((self.step - 1, head, local))

    def _launch_sync(self) -> None:
        """All-reduce the unsent steps in one vector: this rank's seconds per step, every step's
        head, then every step's logs; read at the next step's end. Every rank calls it at the
        same steps. Two tensors are built whatever the number of steps carried."""
        ctx = self.ctx
        now = time.perf_counter()
        entries, self._unsynced = self._unsynced, []
        per_step = (now - self._last_sync) / len(entries) if self._last_sync else 0.0
        self._last_sync = now
        heads = [v for _, head, _ in entries for v in head]
        logs = [v for _, _, local in entries for v in local.values()]
        # The logs follow the heads in the entries' order, whatever their types (the layout must
        # be the same on every rank): numbers and tensors are converted in one operation each.
        tensor_at = [i for i, v in enumerate(logs) if isinstance(v, torch.Tensor)]
        if not tensor_at:
            vec = torch.tensor([per_step, *heads, *logs], dtype=torch.float64, device=ctx.device)
        else:
            stacked = _stack_scalars([logs[i] for i in tensor_at], ctx.device)
            if len(tensor_at) < len(logs):
                part = torch.tensor(
                    [0.0 if isinstance(v, torch.Tensor) else v for v in logs],
                    dtype=torch.float64,
                    device=ctx.device,
                )
                part[torch.tensor(tensor_at, device=ctx.device)] = stacked
                stacked = part
            vec = torch.cat(
                [torch.tensor([per_step, *heads], dtype=torch.float64, device=ctx.device), stacked]
            )
        work = dist.all_reduce(vec, async_op=True) if ctx.world_size > 1 else None
        self._pending = (work, vec, entries)

    def _drain_pending(self) -> None:
        if self._pending is None:
            return
        work, vec, entries = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        values = vec.tolist()
        ws = self.ctx.world_size
        if values[0] > 0:  # the ranks' mean seconds per step: how many steps the next sync waits for
            self.sync_every = max(1, min(MAX_SYNC_EVERY, int(SYNC_SECONDS / (values[0] / ws))))
        at = 1 + HEAD * len(entries)  # where the logs start
        for i, (step, _, local) in enumerate(entries):
            head, logs = values[1 + HEAD * i : 1 + HEAD * (i + 1)], values[at : at + len(local)]
            at += len(local)
            self._step_synced(step, head, logs, local)

    def _step_synced(self, step: int, head: list[float], logs: list[float], local: dict[str, Any]) -> None:
        """Act on one step's reduced values (the same on every rank)."""
        ws = self.ctx.world_size
        if head[0] > 0 and not self.stopped_early:
            # Every rank reads the same reduced flag at the same step: all leave together.
            self.stopped_early = True
            self.ctx.publisher.record(
                "event", self.step, {}, event="stopped", message=f"stopped at step {self.step}"
            )
        if local and self.ctx.rank == 0:
            avg = self.ctx.config.optimizations.average_training_metrics
            logged = {n: logs[i] / ws if avg else float(local[n]) for i, n in enumerate(local)}
            self.ctx.publisher.record("log", step, logged)
        if head[2] == ws and self.ctx.gns_state is not None:  # every rank measured this step
            self._gns_update(head[1] / ws, head[3], step)

    def _publish_unsynced(self) -> None:
        """A loop left early on this rank (an error, a ``break``): its unsent steps cannot be
        reduced any more (the other ranks may not call the all-reduce); rank 0 records its own
        logged values for them, so that no row is lost."""
        entries, self._unsynced = self._unsynced, []
        if self.ctx.rank == 0:
            for step, _, local in entries:
                if local:
                    self.ctx.publisher.record("log", step, {n: float(v) for n, v in local.items()})

    def _gns_update(self, small: float, big: float, step: int) -> None:
        ctx = self.ctx
        b_small, b_big = self._gns_sizes()
        ctx.gns_state.update(small, big, b_small, b_big)
        ctx.gns = ctx.gns_state.b_simple
        if ctx.rank == 0 and ctx.gns is not None:
            self._gns_record = (
                step,
                {
                    "b_simple": ctx.gns,
                    "g2": ctx.gns_state.g2,
                    "trace_sigma": ctx.gns_state.trace_sigma,
                    "b_small": float(b_small),
                    "b_big": float(b_big),
                },
            )
            self._publish_gns()

    def _publish_gns(self, force: bool = False) -> None:
        """Send the latest estimate at most every PERF_SECONDS (and the last one of a loop):
        it is a moving average, and a record per step costs the kernel more than it tells."""
        if self._gns_record is None:
            return
        now = time.perf_counter()
        if force or now - self._gns_published >= PERF_SECONDS:
            step, values = self._gns_record
            self.ctx.publisher.record("gns", step, values)
            self._gns_record = None
            self._gns_published = now

    # -- checkpoints, progress -------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "micro": self.micro}

    def save_checkpoint(self) -> None:
        self.ctx.forget_dropped()  # a checkpoint holds the live models only
        path = checkpoint.save(self.ctx, self.state())
        self._saved_step = self.step
        if path is not None:
            self.ctx.publisher.record(
                "event", self.step, {}, event="checkpoint", message=f"checkpoint {path}"
            )

    def _load_resume(self) -> dict[str, Any] | None:
        self.ctx.forget_dropped()
        path = checkpoint.find(self.ctx, self.resume)
        if path is None:
            if self.ctx.rank == 0:
                print("dtwork: resume=True but no checkpoint yet: starting from step 0")
            return None
        state = checkpoint.load(self.ctx, path)
        self._saved_step = state["step"]
        if self.ctx.rank == 0:
            print(f"dtwork: resumed from {path} (step {state['step']})")
        return state

    def _progress(self, phase: str) -> None:
        total = self.max_steps
        self.ctx.publisher.progress(step=self.step, total=total, phase=phase, epoch=self.epoch)


# -- ctx.backward / ctx.step / ctx.log --------------------------------------------------------------


def _mean(values: list[Any], device: torch.device) -> Any:
    """The mean of one name's values in a step: the value itself when logged once (the usual
    case: no tensor operation), a float for numbers, else a 0-d float64 tensor."""
    if len(values) == 1:
        return values[0]
    if not any(isinstance(v, torch.Tensor) for v in values):
        return sum(values) / len(values)
    return torch.stack(
        [torch.as_tensor(v, device=device).to(torch.float64).reshape(()) for v in values]
    ).mean()


def _stack_scalars(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One-element tensors (kept by ``add_log``: 0-d or not, on the rank's device or not) as one
    1-d float64 tensor on ``device``: one operation when they have one shape and one device, as
    a training loop's logged values have."""
    try:
        out = torch.stack(tensors)
    except RuntimeError:  # shapes (), (1,) ... or devices mixed
        out = torch.stack([t.reshape(()).to(device) for t in tensors])
    return out.reshape(-1).to(device=device, dtype=torch.float64)


def backward(ctx: Any, loss: torch.Tensor) -> None:
    """Scale for accumulation and fp16, then backward (outside autocast)."""
    loop: StepLoop | None = ctx.loop
    if loop is not None and loop.k > 1 and ctx.config.optimizations.average_aggregated_gradients:
        loss = loss / loop.k
    scale = 1.0
    if ctx._scaler is not None:
        scale = float(ctx._scaler.get_scale())
        loss = ctx._scaler.scale(loss)
    if loop is not None:
        loop.before_backward()
    with torch.autocast(ctx.device.type, enabled=False):
        loss.backward()
    if loop is not None:
        loop.after_backward(scale)


def optimizer_step(ctx: Any, optimizer: torch.optim.Optimizer) -> bool:
    """Step at the last micro-batch of a step (scaler-aware), zero the grads, step schedules."""
    loop: StepLoop | None = ctx.loop
    ctx.register("optimizers", optimizer)
    if loop is not None and not loop.is_last_micro:
        return False
    if ctx._scaler is not None:
        ctx._scaler.step(optimizer)
        ctx._scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for sched in ctx.schedulers:
        if getattr(sched, "optimizer", None) is optimizer:
            sched.step()
    if loop is not None:
        loop.stepped = True
    return True


def log_scalars(ctx: Any, scalars: dict[str, Any]) -> None:
    """Inside ``ctx.steps``: averaged with the step's all-reduce. Outside: reduced at once."""
    step = scalars.pop("step", None)
    if not scalars:
        return
    if ctx.loop is not None:
        ctx.loop.add_log(scalars)
        return
    names = sorted(scalars)
    vec = torch.stack(
        [torch.as_tensor(scalars[n]).detach().to(ctx.device, torch.float64).reshape(()) for n in names]
    )
    if ctx.config.optimizations.average_training_metrics and ctx.world_size > 1:
        dist.all_reduce(vec)
        vec /= ctx.world_size
    ctx._log_step = step if step is not None else getattr(ctx, "_log_step", -1) + 1
    if ctx.rank == 0:
        ctx.publisher.record("log", ctx._log_step, dict(zip(names, vec.tolist(), strict=True)))
        ctx.publisher.flush()
