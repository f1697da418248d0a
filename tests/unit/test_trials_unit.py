"""Trial helpers on 2 real CPU ranks: accumulation, compression, LR rules, evaluation, resume, store.

Its tests that need no engines; the others are in tests/cluster/test_trials.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


def test_ctx_log_reads_a_cpu_tensor_at_once_and_refuses_a_vector() -> None:
    """In a loop on a CPU rank ``ctx.log`` keeps a float (no tensor kept until the sync); a tensor of
    more than one element is refused at the call, with what to log instead."""
    from dtwork.errors import DtworkError
    from dtwork.runtime.context import Context

    ctx = Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    seen = []
    for _step, _ in ctx.steps(range(3), max_steps=3):
        ctx.log(loss=torch.tensor(2.0, requires_grad=True) * 1.5, one=torch.tensor([4.0]), n=3)
        seen.append({k: list(v) for k, v in ctx.loop.sync._logs.items()})
        if _step == 2:
            with pytest.raises(
                DtworkError,
                match=r"ctx.log\(acc=...\) takes a number or a one-element tensor, "
                r"got a tensor of shape \(2,\): log a reduction of it",
            ):
                ctx.log(acc=torch.ones(2))
    assert seen == [{"loss": [3.0], "one": [4.0], "n": [3.0]}] * 3
    assert all(type(v) is float for logs in seen for vs in logs.values() for v in vs)


def test_logged_tensors_kept_for_the_sync_are_read_in_one_stack_whatever_their_shape() -> None:
    """What a GPU rank keeps (detached one-element tensors, 0-d or not) becomes one float64 vector."""
    from dtwork.runtime.loop.sync import _stack_scalars

    cpu = torch.device("cpu")
    same = _stack_scalars([torch.tensor(1.0), torch.tensor(2.5, dtype=torch.float16)], cpu)
    mixed = _stack_scalars([torch.tensor([1.0]), torch.tensor(2.0), torch.tensor([[3]])], cpu)
    assert same.dtype == mixed.dtype == torch.float64
    assert same.tolist() == [1.0, 2.5] and mixed.tolist() == [1.0, 2.0, 3.0]


def test_records_outside_an_engine_stay_local_and_leave_the_shell_alone() -> None:
    """A Publisher in a plain process (a script, a benchmark) publishes nothing and makes no kernel
    shell (``publish_data`` would, and a later ``InteractiveShell.instance()`` would get it)."""
    code = (
        "from ipykernel.zmqshell import ZMQInteractiveShell\n"
        "from dtwork.runtime.core.publish import Publisher\n"
        "p = Publisher(0)\n"
        "p.record('log', 0, {'loss': 1.0}); p.progress(step=1); p.flush()\n"
        "print(ZMQInteractiveShell.initialized(), p._buf)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "[]"]
