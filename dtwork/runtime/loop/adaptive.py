"""Adaptive batch size on the ranks: a loader whose batch changes mid-epoch, and the decisions.

``ctx.loader(dataset, adaptive=True)`` gives an :class:`AdaptiveLoader`. Its sampler walks one
global order per epoch (the same permutation on every rank) and keeps its place in *samples*, so
the per-slot batch can change between any two micro-batches without repeating or skipping one:
each micro-batch takes the next ``per_slot x world_size`` samples of the order and rank r keeps
its r-th slice. The last ``len(dataset) % world_size`` samples of an epoch's order are left out,
so every rank takes the same number of steps (a different few each epoch, when shuffled).

The loader's :class:`AdaptiveBatch` takes the decisions: every ``decide_every`` optimizer steps
the ranks all-reduce their measured step and communication times (the slowest step, the least
communication: a rank's wait for a straggler is the straggler's compute), rank 0 fits the throughput
model and runs :func:`dtwork.analysis.goodput.decide` on the settled GNS interval, and broadcasts
the split it chose. The learning rate is the schedule at the *progress* (samples trained over the
starting global batch) times the LR rule's factor, so a schedule written for the starting batch
keeps its meaning. ``ctx.steps(loader, adaptive=True)`` calls it at each step's end; a hand loop's
``ctx.step(opt)`` calls it after the optimizer step.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from dtwork.analysis import goodput
from dtwork.errors import DtworkError
from dtwork.runtime.loop.adaptive_sampler import AdaptiveSampler, SamplerState
from dtwork.runtime.loop.options import AdaptiveOptions, names
from dtwork.runtime.measure import handloop
from dtwork.shared.records import Kind

if TYPE_CHECKING:
    from collections.abc import Iterator

    from dtwork.runtime.core.state import RankState

# the names users pass (lr_rule=) and the rule of dtwork.analysis.goodput each one means
LR_RULES = {"adascale": "adascale", "sqrt": "adascale_sqrt", "linear": "linear", "sqrt-batch": "sqrt"}
THRESHOLD = 0.05  # the predicted goodput gain a switch needs (AdaptDL's)
OPTIONS = names(AdaptiveOptions)[1:]  # ctx.loader's and ctx.steps' (the flag is ctx.loader's own argument)
MAX_ACCUMULATION = 64  # micro-batches per step a decision may choose inside ctx.steps


__all__ = ["AdaptiveBatch", "AdaptiveLoader", "AdaptiveSampler", "adaptive_for", "make_adaptive_loader"]


class AdaptiveState(TypedDict):
    """An adaptive batch's state in a checkpoint."""

    sampler: SamplerState
    start_batch: int
    split: list[int]  # per slot, accumulation, slots
    factor: float
    profile: list[dict[str, Any]]  # the throughput fit's observations (asdict of goodput.StepObservation)
    steps: int


class AdaptiveLoader:
    """A loader over this rank's shard whose per-slot batch may change between micro-batches.

    Iterating it runs the rest of the current epoch (a ``break`` keeps the place); ``epoch`` and
    ``per_slot_batch_size`` read where it is. ``adaptive`` holds the decisions' settings and state.
    """

    def __init__(
        self, state: RankState, dataset: Any, per_slot: int, shuffle: bool, seed: int, **kwargs: Any
    ) -> None:
        if kwargs.get("num_workers"):
            raise DtworkError(
                "ctx.loader(adaptive=True) loads in the rank's process (workers would prefetch batches "
                "of the old size): drop num_workers"
            )
        for name in ("sampler", "batch_sampler", "batch_size", "drop_last"):
            if name in kwargs:
                raise DtworkError(f"ctx.loader(adaptive=True) chooses the batches itself: drop {name}=")
        self.sampler = AdaptiveSampler(len(dataset), state.world_size, state.rank, per_slot, seed, shuffle)
        self._loader = DataLoader(dataset, batch_sampler=self.sampler, **kwargs)
        self.adaptive = AdaptiveBatch(state, self)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def per_slot_batch_size(self) -> int:
        return self.sampler.per_slot

    def set_batch(self, per_slot: int) -> None:
        """Take ``per_slot`` examples per rank from the next micro-batch on."""
        self.sampler.per_slot = per_slot

    def __iter__(self) -> Iterator[object]:
        self.sampler.begin()
        return iter(self._loader)

    def __len__(self) -> int:
        return len(self.sampler)


class AdaptiveBatch:
    """The batch decisions of one adaptive loader (see the module docstring)."""

    def __init__(self, state: RankState, loader: AdaptiveLoader) -> None:
        self.state, self.loader = state, loader
        ab = state.config.optimizations.adaptive_batch_size
        self.max_global_batch = ab.max_global_batch_size
        self.min_per_slot_batch = ab.min_per_slot_batch_size
        self.decide_every = ab.decide_every
        self.lr_rule: str | None = None  # None: by the optimizer (adascale, or sqrt for Adam-like)
        self.start_batch = loader.per_slot_batch_size * state.world_size  # M0: the LR was tuned here
        self.split = goodput.Split(loader.per_slot_batch_size, 1, state.world_size)
        self.factor = 1.0  # the LR rule's factor on top of the schedule
        self.profile: list[goodput.StepObservation] = []  # one observation per split tried
        self.decision: goodput.BatchDecision | None = None  # the last one
        self.steps = 0  # optimizer steps taken under this controller
        self.moments = 1.0  # the factor the last change put on Adam-like second moments
        self._window: list[tuple[float, float]] = []  # (step seconds, comm seconds) since the last decision
        self._t_last = 0.0
        self._trained = loader.sampler.served  # samples served up to the last optimizer step's end
        self._served = -1  # the samples served at the last hand-loop step; -1: none yet
        state.adaptive = self

    # -- settings ----------------------------------------------------------------------------------

    def configure(
        self,
        max_global_batch: int | None = None,
        min_per_slot_batch: int | None = None,
        decide_every: int | None = None,
        lr_rule: str | None = None,
    ) -> None:
        """Take the options of ``ctx.steps`` (or ``ctx.loader``) over the config's."""
        for name, value in (
            ("max_global_batch", max_global_batch),
            ("min_per_slot_batch", min_per_slot_batch),
            ("decide_every", decide_every),
        ):
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise DtworkError(f"adaptive batch: {name} must be a positive integer, got {value!r}")
                setattr(self, name, value)
        if lr_rule is not None:
            if lr_rule not in LR_RULES:
                raise DtworkError(f"lr_rule must be one of {', '.join(LR_RULES)}, got {lr_rule!r}")
            self.lr_rule = lr_rule

    def rule(self) -> str:
        """The LR rule in use: the one chosen, else sqrt for Adam-like optimizers, adascale otherwise."""
        if self.lr_rule is not None:
            return self.lr_rule
        adam = any(
            isinstance(o, (torch.optim.Adam, torch.optim.AdamW)) for o in self.state.run_objects("optimizers")
        )
        return "sqrt" if adam else "adascale"

    @property
    def progress(self) -> float:
        """Training progress in optimizer steps at the starting global batch (samples / M0)."""
        return goodput.progress_steps(self._trained, self.start_batch)

    def steps_total(self, step: int, max_progress: int) -> int:
        """The optimizer steps a loop at ``step`` takes to ``max_progress``, at the current batch."""
        left = max(0.0, max_progress - self.progress) * self.start_batch / self.split.global_batch
        return step + math.ceil(left)

    def check(self) -> None:
        """Refuse settings a decision cannot run with (at a loop's start)."""
        if self.max_global_batch is None:
            raise DtworkError(
                "adaptive batch needs a cap: max_global_batch=M (or "
                "optimizations.adaptive_batch_size.max_global_batch_size in the config)"
            )
        if self.max_global_batch < self.start_batch:
            raise DtworkError(
                f"max_global_batch={self.max_global_batch} is below the starting global batch "
                f"{self.start_batch}: raise it"
            )

    def start(self, accumulation: int) -> None:
        """At a loop's start: the split it runs, published on the rank state."""
        self.check()
        k = self.split.accumulation if self.steps else accumulation  # a later loop goes on with it
        self.split = goodput.Split(self.loader.per_slot_batch_size, k, self.state.world_size)
        self._publish_split()
        self._t_last = 0.0
        self._window = []

    def begin(self, accumulation: int, saved: AdaptiveState | None) -> int:
        """At ``ctx.steps``' start: the split to run (``saved``, a resumed checkpoint's) and its LR;
        return the accumulation the loop runs with."""
        self.start(accumulation)
        if self.state.gns_state is None and self.state.rank == 0:  # decisions rest on the GNS interval
            print(
                f"dtwork: the adaptive batch stays at {self.split.global_batch} without a gradient noise "
                "scale: ctx.wrap(model, gns=True) (or gns.enabled in the config)"
            )
        if saved:
            self.load_state_dict(saved)
        self.apply_lr()
        return self.split.accumulation

    def _publish_split(self) -> None:
        self.loader.set_batch(self.split.per_slot)
        self.state.per_slot_batch_size = self.split.per_slot
        self.state.global_batch_size = self.split.global_batch

    # -- every step --------------------------------------------------------------------------------

    def after_step(self, comm: float = 0.0, max_accumulation: int = MAX_ACCUMULATION) -> bool:
        """At an optimizer step's end (every rank): ``measure``, then ``decide``."""
        self.measure(comm)
        return self.decide(max_accumulation)

    def measure(self, comm: float) -> None:
        """Count the step just taken: its seconds and communication, and the samples trained."""
        now = time.perf_counter()
        if self._t_last:
            self._window.append((now - self._t_last, comm))
        self._t_last = now
        self.steps += 1
        self._trained = self.loader.sampler.served

    def decide(self, max_accumulation: int = MAX_ACCUMULATION) -> bool:
        """Decide when due and set the LR; return whether the split changed (the caller's
        accumulation follows ``split``)."""
        changed = False
        if self.steps % self.decide_every == 0:
            changed = self._decide(max_accumulation)
            self._t_last = time.perf_counter()  # the decision's collectives are no step's time
        self.apply_lr()
        return changed

    def hand_step(self) -> None:
        """After ``ctx.step(opt)`` in a hand loop (every rank): as ``after_step``, no accumulation.
        A step that took nothing from this loader since the last is another loop's: left alone."""
        served = self.loader.sampler.served
        if served == self._served:
            return
        if self._served < 0:
            self.start(1)
        self._served = served
        self.after_step(handloop.last_comm(), max_accumulation=1)

    def _decide(self, max_accumulation: int) -> bool:
        state = self.state
        window, self._window = self._window, []
        # one MAX all-reduce of (step, -comm, -measured): the slowest rank's step, the least exposed
        # communication of any rank, and -1 only when every rank measured. A fast rank's exposed
        # communication includes its wait for the slowest rank's compute; counted as communication,
        # that wait would be fixed cost in the fit and make growing look cheap on a busy machine.
        # The rank that waited least was the straggler: its exposed time is communication proper.
        measured = torch.zeros(3, dtype=torch.float64)
        if window:  # the median step of the window: a checkpoint or an evaluation moves nothing
            measured[0] = float(sorted(w[0] for w in window)[len(window) // 2])
            measured[1] = -float(sorted(w[1] for w in window)[len(window) // 2])
            measured[2] = -1.0
        if state.world_size > 1:
            dist.all_reduce(measured, op=dist.ReduceOp.MAX)
        if measured[2] == -1.0:  # every rank measured
            step_s, comm_s = float(measured[0]), -float(measured[1])
            sp = self.split
            seen = goodput.StepObservation(sp.per_slot, sp.accumulation, sp.slots, step_s, comm_s)
            self.profile = goodput.condense([*self.profile, seen])  # a split tried again: their median
        answer = torch.zeros(4, dtype=torch.float64)
        if state.rank == 0:
            self.decision = self._choose(max_accumulation)
            chosen = self.decision.chosen
            b_simple = self._b_simple()
            b_simple = b_simple if b_simple is not None and math.isfinite(b_simple) else math.nan
            answer[:] = torch.tensor(
                [chosen.per_slot, chosen.accumulation, self._factor_for(chosen), b_simple],
                dtype=torch.float64,
            )
        if state.world_size > 1:
            dist.broadcast(answer, 0)
        per_slot, accumulation, factor = int(answer[0]), int(answer[1]), float(answer[2])
        new = goodput.Split(per_slot, accumulation, state.world_size)
        changed = new != self.split
        old, self.split, self.factor = self.split, new, factor
        self.moments = 1.0
        if changed:
            self._publish_split()
            if math.isfinite(float(answer[3])):
                self.moments = self._rescale_moments(float(answer[3]), new.global_batch, old.global_batch)
        if state.rank == 0:
            self._record(changed)
        return changed

    def _rescale_moments(self, b_simple: float, batch: int, old_batch: int) -> float:
        """Scale the run's Adam-like second moments to the new batch (every rank, the same B_simple
        from rank 0); return the factor, 1.0 when no optimizer keeps one."""
        ratio = goodput.second_moment_ratio(b_simple, batch, old_batch)
        scaled = False
        for opt in self.state.run_objects("optimizers"):
            for per_param in opt.state.values():
                for name in ("exp_avg_sq", "max_exp_avg_sq"):
                    moment = per_param.get(name) if isinstance(per_param, dict) else None
                    if isinstance(moment, torch.Tensor):
                        moment.mul_(ratio)
                        scaled = True
        return ratio if scaled else 1.0

    def _choose(self, max_accumulation: int) -> goodput.BatchDecision:
        gns = self.state.gns_state.decision_interval if self.state.gns_state is not None else None
        if not self.profile:
            why = "not deciding: no step time measured yet"
            return goodput.BatchDecision(False, self.split, None, None, None, None, None, why)
        model = goodput.fit_throughput(self.profile)
        return goodput.decide(
            gns,
            model,
            self.split,
            self.start_batch,
            self._bounds(max_accumulation),
            threshold=THRESHOLD,
            lr_rule=LR_RULES[self.rule()],
        )

    def _bounds(self, max_accumulation: int) -> goodput.BatchBounds:
        assert self.max_global_batch is not None  # configure refused a missing cap
        return goodput.BatchBounds(
            self.max_global_batch, self.min_per_slot_batch, max_accumulation=max_accumulation
        )

    def _b_simple(self) -> float | None:
        """The B_simple the LR rule and the moments take: the decisions' (the lower end where only
        that is known, as a far larger B_simple than the batch leaves it), else the running one."""
        est = self.state.gns_state
        interval = est.decision_interval if est is not None else None
        return interval.estimate if interval is not None else self.state.gns

    def _factor_for(self, split: goodput.Split) -> float:
        """The LR factor of ``split`` under the rule; the AdaScale rules keep theirs without a GNS."""
        rule = LR_RULES[self.rule()]
        gns = self._b_simple()
        if rule in ("adascale", "adascale_sqrt") and (gns is None or not math.isfinite(gns)):
            return self.factor
        return goodput.lr_factor(rule, split.global_batch, self.start_batch, gns)

    # -- the learning rate ------------------------------------------------------------------------

    def apply_lr(self) -> None:
        """Set the run's optimizers' LR: its schedule at the progress (LambdaLR) times the rule's factor."""
        progress = self.progress
        for opt in self.state.run_objects("optimizers"):  # not an earlier run's, still named somewhere
            sched = next((s for s in self.state.schedulers if getattr(s, "optimizer", None) is opt), None)
            lambdas = getattr(sched, "lr_lambdas", None)
            for i, group in enumerate(opt.param_groups):
                if sched is not None and lambdas is not None:
                    base = sched.base_lrs[i] * lambdas[i](progress)
                else:
                    base = group.setdefault("dtwork_base_lr", group["lr"])  # kept in the optimizer's state
                group["lr"] = base * self.factor
            if sched is not None and lambdas is not None:
                sched.last_epoch = int(progress)  # a schedule's state on progress, as a resume reads it
                sched._last_lr = [g["lr"] for g in opt.param_groups]  # what get_last_lr() reads

    # -- records, checkpoints --------------------------------------------------------------------

    def _record(self, changed: bool) -> None:
        d = self.decision
        if d is None:
            return
        values = {
            "global_batch": float(self.split.global_batch),
            "per_slot_batch": float(self.split.per_slot),
            "accumulation": float(self.split.accumulation),
            "lr_factor": self.factor,
            "progress": self.progress,
            "threshold": THRESHOLD,
        }
        for name, value in (
            ("efficiency", d.efficiency),
            ("goodput_predicted", d.goodput_best if d.switch else d.goodput_current),
            ("goodput_current", d.goodput_current),
            ("predicted_gain", d.predicted_gain),
        ):
            if value is not None and math.isfinite(value):
                values[name] = float(value)
        step = self.state.loop.step if self.state.loop is not None else self.steps
        self.state.publisher.record(Kind.ADAPTIVE, step, values)
        if changed:
            s = self.split
            moments = f", Adam's second moments x{self.moments:.3g}" if self.moments != 1.0 else ""
            self.state.publisher.record(
                "event",
                step,
                {},
                event="batch",
                message=f"global batch {s.global_batch} = {s.per_slot} x {s.accumulation} x {s.slots} "
                f"(LR x{self.factor:.3g}{moments}): {explain(d)}",
            )

    def state_dict(self) -> AdaptiveState:
        """What a resume needs: the loader's place, the split, the LR factor and the throughput fit."""
        return {
            "sampler": self.loader.sampler.state_dict(),
            "start_batch": self.start_batch,
            "split": [self.split.per_slot, self.split.accumulation, self.split.slots],
            "factor": self.factor,
            "profile": [asdict(o) for o in self.profile],
            "steps": self.steps,
        }

    def load_state_dict(self, sd: AdaptiveState) -> None:
        if sd["split"][2] != self.state.world_size:
            raise DtworkError(
                f"the checkpoint's adaptive batch ran on {sd['split'][2]} ranks, this cluster has "
                f"{self.state.world_size}: resume on the same world size"
            )
        self.loader.sampler.load_state_dict(sd["sampler"])
        self.start_batch = int(sd["start_batch"])
        self.split = goodput.Split(*(int(v) for v in sd["split"]))
        self.factor = float(sd["factor"])
        self.profile = [goodput.StepObservation(**o) for o in sd["profile"]]
        self.steps = int(sd["steps"])
        self._trained = self.loader.sampler.served
        self._publish_split()


def explain(d: goodput.BatchDecision) -> str:
    """One line on why the batch is what it is: the switch, or the reason it stays."""
    if d.switch and d.predicted_gain is not None:
        return f"predicted goodput gain {100 * d.predicted_gain:.1f}% above {100 * THRESHOLD:.0f}%"
    return d.reason or "no decision yet"


def make_adaptive_loader(
    state: RankState,
    dataset: Any,
    *,
    batch_size: int | None = None,
    shuffle: bool = True,
    seed: int | None = None,
    **kwargs: Any,
) -> AdaptiveLoader:
    """``ctx.loader(dataset, adaptive=True)``: the starting per-slot batch is the configured one."""
    bs = batch_size or state.per_slot_batch_size
    if bs is None:
        raise DtworkError(
            "ctx.loader(adaptive=True) needs a starting batch: set a global batch "
            "(%dtrain start --global-batch-size G) or pass batch_size="
        )
    seed = state.config.seed if seed is None else seed
    options = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
    loader = AdaptiveLoader(state, dataset, bs, shuffle, seed, **kwargs)
    loader.adaptive.configure(**options)
    return loader


def adaptive_for(
    loader: object,
    adaptive: bool,
    max_global_batch: int | None,
    min_per_slot_batch: int | None,
    decide_every: int | None,
    lr_rule: str | None,
) -> AdaptiveBatch | None:
    """The decisions ``ctx.steps(adaptive=True, ...)`` runs: the adaptive loader's, with these options."""
    options = (max_global_batch, min_per_slot_batch, decide_every, lr_rule)
    if not adaptive:
        if any(o is not None for o in options):
            raise DtworkError(
                "ctx.steps: max_global_batch, min_per_slot_batch, decide_every and lr_rule "
                "go with adaptive=True: add it"
            )
        return None
    if not isinstance(loader, AdaptiveLoader):
        raise DtworkError(
            "ctx.steps(adaptive=True) changes the batch of its loader: pass loader = ctx.loader(dataset, adaptive=True)"
        )
    loader.adaptive.configure(*options)
    loader.adaptive.check()
    return loader.adaptive
