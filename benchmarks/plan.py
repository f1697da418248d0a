"""How much of every phase a run of the suite measures: the full run, or ``--smoke``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ADAPTIVE", "SEARCH", "Plan"]


def _kinds(mlp: int, convnet: int) -> Any:
    return field(default_factory=lambda: {"mlp": mlp, "convnet": convnet})


@dataclass
class Plan:
    """How much of everything to run: the full run, or ``--smoke`` (a few steps of everything)."""

    smoke: bool = False
    coldstart_reps: int = 3
    round_trips: int = 30
    throughput_reps: int = 4
    warmup: dict[str, int] = _kinds(10, 3)
    steps: dict[str, int] = _kinds(250, 50)  # 2-3 s: shorter runs measure scheduling more than training
    latency_reps_inprocess: int = 5
    latency_reps_relaunch: int = 3
    window_warmup: dict[str, int] = _kinds(30, 8)  # covers the live view's first draw
    gns_cycles: dict[str, int] = _kinds(160, 40)
    live_window: dict[str, int] = _kinds(180, 44)  # about 2 s: four redraws
    live_cycles: dict[str, int] = _kinds(30, 20)
    turn_blocks: int = 6
    turn_steps: dict[str, int] = _kinds(30, 8)
    turn_cycles: dict[str, int] = _kinds(12, 8)
    hand_window: int = 30  # MLP steps: about 0.3 s
    hand_cycles: int = 80
    rerun_reps: int = 5
    rerun_epochs: int = 2
    scale_ranks: tuple[int, ...] = (8, 32, 128, 256)
    scale_seconds: float = 30.0
    adaptive: dict[str, Any] = field(default_factory=lambda: dict(ADAPTIVE))
    fsdp_steps: int = 40  # a small transformer: about 2 s a turn on 2 cores
    fsdp_reps: int = 3
    long_run: tuple[tuple[float, int], ...] = ((24.0, 8), (1.0, 256))  # (hours, ranks): issue 43's two runs
    search: dict[str, Any] = field(default_factory=lambda: dict(SEARCH))

    @classmethod
    def smoke_plan(cls) -> Plan:
        """A step or two of everything, once: it checks that everything runs."""
        per_kind = "warmup steps window_warmup gns_cycles live_window live_cycles turn_steps turn_cycles"
        once = "coldstart_reps throughput_reps latency_reps_inprocess latency_reps_relaunch turn_blocks"
        small = dict(hand_window=2, hand_cycles=2, rerun_epochs=1, scale_ranks=(4,), scale_seconds=1.0)
        small |= dict(fsdp_steps=2, fsdp_reps=1, long_run=((0.2, 2),))
        small |= dict.fromkeys(per_kind.split(), {"mlp": 2, "convnet": 1})
        small["adaptive"] = ADAPTIVE | ADAPTIVE_SMOKE
        small["search"] = SEARCH | SEARCH_SMOKE
        return cls(True, **dict.fromkeys([*once.split(), "rerun_reps"], 1), round_trips=3, **small)


# issue 36's phase (benchmarks/adaptive.py), fixed before it was run: the grid, the seeds, the
# adaptive arm's start (the grid's smallest batch at its middle learning rate: no sweep), the target
# (a margin above the entropy rate), the sample cap of a run that does not reach it, the data
ADAPTIVE: dict[str, Any] = dict(
    batches=(64, 128, 256, 512, 1024, 2048),  # 32 took 40% of a seed's grid under load: left out
    lrs=(1e-3, 3e-3, 1e-2),
    seeds=5,
    start_batch=64,
    start_lr=3e-3,
    max_global_batch=2048,
    lr_rule="sqrt",  # Adam: the square root of AdaScale's gain
    decide_every=20,  # steps: about 300 steps at the start batch reach the target; 100 would allow 3
    # the GNS horizon, 100 steps: at the default (1000 steps, windows of 50) a run of ~300 steps
    # never has an interval to decide on (measured: "no GNS interval yet" at all 16 decisions)
    gns_ema_decay=0.99,
    margin=0.02,  # nats above the entropy rate
    cap_samples=65536,  # a run that has not reached the target by then counts as not reached
    eval_every=2048,  # samples
    train_sequences=65536,
    val_sequences=2048,
    probe_sequences=2048,
    probe_batch=128,
    probe_lr=3e-3,
    timeout_s=1800,
)
ADAPTIVE_SMOKE: dict[str, Any] = dict(
    batches=(32, 64),
    lrs=(3e-3,),
    seeds=1,
    start_batch=32,
    max_global_batch=64,
    decide_every=4,
    cap_samples=1024,
    eval_every=512,
    train_sequences=2048,
    val_sequences=128,
    probe_sequences=256,
    probe_batch=32,
    timeout_s=300,
)


# issue 48's phase (benchmarks/search.py): 16 trials, 4 ranks as 2 groups of 2 against one after another;
# ASHA's rungs at 4, 16 and 64 batches (divisor 4), the same global batch on either arm
SEARCH: dict[str, Any] = dict(
    ranks=4, slots=2, trials=16, length=64, rungs=3, divisor=4, global_batch=64, samples=8192, reps=2
)
SEARCH_SMOKE: dict[str, Any] = dict(trials=4, length=8, rungs=2, divisor=2, samples=512, reps=1)
