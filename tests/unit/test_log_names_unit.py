"""Ranks that ``ctx.log`` different names fail at once on every rank, naming each rank's names.

Its tests that need no engines; the others are in tests/cluster/test_log_names.py.
"""

from __future__ import annotations

import torch

from dtwork.runtime.loop.sync import StepHead, StepSync, names_key


def test_the_agreement_test_is_exact_for_any_split_of_keys() -> None:
    a, b = names_key(("loss",)), names_key(("acc", "loss"))
    assert a != b and a < 2**20 and b < 2**20
    for keys in ([a, a], [a, b], [a, a, a, b], [b, a, a]):
        head = StepHead(names=sum(keys), names_sq=sum(k * k for k in keys))
        agree = len(set(keys)) == 1
        assert (len(keys) * head.names_sq == head.names**2) is agree


def test_one_rank_sends_one_length_whatever_it_logged() -> None:
    sizes = []
    for names in ({}, {"loss": 1.0}, {f"m{i}": float(i) for i in range(32)}):
        sync = StepSync(torch.device("cpu"), world_size=1)
        sync.add_log(names)
        sync.record(0, StepHead())
        sync.launch()
        assert sync._pending is not None
        sizes.append(sync._pending[1].numel())
        (step,) = sync.drain()
        assert dict(zip(step.local, step.logs, strict=True)) == names
    assert len(set(sizes)) == 1
