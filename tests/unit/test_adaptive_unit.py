"""Adaptive batch size by goodput on 2 real gloo ranks: ctx.steps and a hand loop, and a resume.

Its tests that need no engines; the others are in tests/cluster/test_adaptive.py.
"""

from __future__ import annotations

import pytest

from dtwork.errors import DtworkError


def _state(world_size: int = 1, rank: int = 0, per_slot: int = 4):
    import torch

    from dtwork.config import load_config
    from dtwork.runtime.core.state import RankState

    state = RankState(rank, world_size, 0, torch.device("cpu"), "gloo", load_config(None))
    state.per_slot_batch_size, state.global_batch_size = per_slot, per_slot * world_size
    return state


def test_the_sampler_neither_repeats_nor_skips_when_the_batch_changes_between_micro_batches() -> None:
    """Two ranks' samplers, the per-slot batch changed at random between micro-batches (the same on
    both, as the broadcast decision makes it); an odd dataset leaves out one sample per epoch."""
    import random

    from dtwork.runtime.loop.adaptive import AdaptiveSampler

    size, pick = 1001, random.Random(0)
    samplers = [AdaptiveSampler(size, 2, r, per_slot=3, seed=5) for r in (0, 1)]
    for epoch in range(3):
        for s in samplers:
            s.begin()
        its = [iter(s) for s in samplers]
        taken: list[int] = []
        while True:
            parts = [next(it, None) for it in its]
            if parts[0] is None:
                assert parts[1] is None
                break
            assert len(parts[0]) == len(parts[1])  # every rank takes as many: DDP's steps stay equal
            taken += parts[0] + parts[1]
            per_slot = pick.choice([1, 2, 7, 30])
            for s in samplers:
                s.per_slot = per_slot
        assert len(taken) == len(set(taken)) == size - 1, epoch
        assert samplers[0].epoch == epoch + 1 and samplers[0].served == (epoch + 1) * (size - 1)


def test_a_lambda_schedule_runs_on_progress_and_the_factor_multiplies_it(capsys) -> None:
    """One rank, no collective: a batch twice the starting one advances the schedule two steps a step."""
    import torch

    from dtwork.analysis.goodput import Split
    from dtwork.runtime.loop.adaptive import make_adaptive_loader

    state = _state(per_slot=4)
    data = torch.utils.data.TensorDataset(torch.arange(64.0))
    loader = make_adaptive_loader(state, data, max_global_batch=64, decide_every=1000)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda p: 1.0 / (1.0 + p))
    state.register("optimizers", opt)
    state.register("schedulers", sched)
    ab = loader.adaptive
    assert ab.begin(1, None) == 1
    assert "the adaptive batch stays at 4 without a gradient noise scale" in capsys.readouterr().out
    it = iter(loader)
    next(it)
    ab.after_step()  # one step at the starting batch: progress 1
    assert ab.progress == 1 and opt.param_groups[0]["lr"] == pytest.approx(0.1 / 2)
    ab.split, ab.factor = Split(8, 1, 1), 2.0  # what a decision for batch 8 under "linear" leaves
    loader.set_batch(8)
    assert len(next(it)[0]) == 8
    opt.step()
    sched.step()  # as ctx.step does; the adaptive LR then replaces the raw step's value
    ab.after_step()
    assert ab.progress == 3 and opt.param_groups[0]["lr"] == pytest.approx(0.1 / 4 * 2.0)
    assert sched.last_epoch == 3 and sched.get_last_lr() == [opt.param_groups[0]["lr"]]
    assert ab.steps_total(2, 7) == 2 + 2  # progress 4 left at 2 per step: the progress bar's total
    assert ab.rule() == "adascale"  # SGD; an Adam-like optimizer takes the square root of the gain
    adam = torch.optim.Adam(model.parameters())
    state.register("optimizers", adam)
    assert ab.rule() == "sqrt"
    with pytest.raises(DtworkError, match="lr_rule must be one of adascale, sqrt, linear, sqrt-batch"):
        ab.configure(lr_rule="cube")


def test_misuse_gets_one_line_that_says_what_to_do() -> None:
    import torch

    from dtwork.runtime.loop.adaptive import adaptive_for, make_adaptive_loader

    state = _state(per_slot=4)
    data = torch.utils.data.TensorDataset(torch.arange(64.0))
    with pytest.raises(DtworkError, match=r"pass loader = ctx.loader\(dataset, adaptive=True\)"):
        adaptive_for(torch.utils.data.DataLoader(data), True, 64, None, None, None)
    with pytest.raises(DtworkError, match="go with adaptive=True: add it"):
        adaptive_for(make_adaptive_loader(state, data), False, 64, None, None, None)
    with pytest.raises(DtworkError, match="adaptive batch needs a cap: max_global_batch=M"):
        adaptive_for(make_adaptive_loader(state, data), True, None, None, None, None)
    with pytest.raises(DtworkError, match="below the starting global batch 4: raise it"):
        adaptive_for(make_adaptive_loader(state, data), True, 2, None, None, None)
    with pytest.raises(DtworkError, match="drop num_workers"):
        make_adaptive_loader(state, data, num_workers=2)


def test_a_batch_change_rescales_adams_second_moments_to_the_new_batch() -> None:
    """E|g|^2 = |G|^2 (1 + B_simple / M): after a growth from 4 to 8 at B_simple ~ 20, the second
    moments gathered at 4 are ~1.7x what the new batch's gradients give; the decision scales them
    by (1 + B/8) / (1 + B/4) (the batch event says by how much). One rank."""
    import numpy as np
    import torch

    from dtwork.analysis.gns import GNSEstimator
    from dtwork.analysis.goodput import StepObservation, second_moment_ratio
    from dtwork.runtime.loop.adaptive import make_adaptive_loader

    state = _state(per_slot=4)
    rng, d = np.random.default_rng(0), 4096
    est = GNSEstimator(ema_decay=0.98)
    for _ in range(300):  # |G|^2 = 1, tr(Sigma) = 20: B_simple 20, measured at 4 and 8
        small = 1 / np.sqrt(d) + rng.standard_normal((2, d)) * np.sqrt(20 / d / 4)
        est.update(float((small**2).sum(-1).mean()), float((small.mean(0) ** 2).sum()), 4, 8)
    assert est.settled
    state.gns_state, state.gns = est, est.b_simple
    model = torch.nn.Linear(3, 2)
    adam = torch.optim.AdamW(model.parameters(), lr=1e-3, amsgrad=True)
    model(torch.randn(5, 3)).sum().backward()
    adam.step()
    state.register("models", model)
    state.register("optimizers", adam)
    before = {k: v.clone() for k, v in adam.state[model.weight].items() if k.endswith("exp_avg_sq")}
    data = torch.utils.data.TensorDataset(torch.arange(64.0))
    loader = make_adaptive_loader(state, data, max_global_batch=64, decide_every=1)
    ab = loader.adaptive
    ab.begin(1, None)
    ab.profile = [StepObservation(4, 1, 1, 0.100), StepObservation(2, 1, 1, 0.099)]  # fixed cost: grow
    assert ab._decide(1) and ab.split.global_batch == 8
    ratio = second_moment_ratio(est.b_simple, 8, 4)
    assert 0.55 < ratio < 0.62 and ab.moments == ratio
    for name, value in before.items():
        assert torch.equal(adam.state[model.weight][name], value * ratio), name
