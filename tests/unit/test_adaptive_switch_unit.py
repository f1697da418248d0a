"""One switch: ``ctx.steps(ctx.loader(dataset), adaptive=True)`` runs a plain ``ctx.loader`` as an
adaptive twin made from the same dataset and arguments (no engines; the loop is in
tests/cluster/test_adaptive_switch.py)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from dtwork.config import load_config
from dtwork.runtime.core.state import RankState
from dtwork.runtime.loop.adaptive import AdaptiveLoader, adaptive_for
from dtwork.runtime.loop.data import adaptive_twin, make_loader


def test_a_plain_ctx_loader_has_one_adaptive_twin_that_hand_loops_do_not_see() -> None:
    state = RankState(0, 1, 0, torch.device("cpu"), "gloo", load_config(None))
    state.per_slot_batch_size = state.global_batch_size = 4
    data = TensorDataset(torch.arange(64.0))
    plain = make_loader(state, data, shuffle=False, collate_fn=lambda rows: torch.stack([r[0] for r in rows]))
    twin = adaptive_twin(state, plain)
    assert isinstance(twin, AdaptiveLoader) and twin.per_slot_batch_size == 4
    assert [b.tolist() for b in list(twin)[:2]] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # its arguments kept
    assert adaptive_twin(state, plain) is twin  # a later loop goes on with its place and batch
    assert adaptive_for(twin, True, 64, None, None, None) is twin.adaptive
    assert state.adaptive is None  # a hand loop's ctx.step decides only ctx.loader(adaptive=True)'s
    other = DataLoader(data)
    assert adaptive_twin(state, other) is other  # not ctx.loader's: refused by adaptive_for as before
