"""Each common mistake fails at once with one line that says what to do (no hang, no silent drift).

Its tests that need no engines; the others are in tests/cluster/test_misuse.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from dtwork.errors import DtworkError, DtworkWarning
from dtwork.runtime.context import Context


def _ctx(global_batch_size: int | None = None) -> Context:
    return Context(
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
        global_batch_size=global_batch_size,
    )


def test_steps_over_a_dataset_iterate_its_loader_with_a_note() -> None:
    ds = torch.utils.data.TensorDataset(torch.arange(20.0).reshape(10, 2))
    with pytest.raises(
        DtworkError, match=r"ctx.steps got a dataset, not a loader: pass ctx.loader\(dataset\)"
    ):
        iter(_ctx().steps(ds, max_steps=2))
    ctx = _ctx(global_batch_size=4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sizes = [len(batch[0]) for _, batch in ctx.steps(ds, max_steps=2)]
    assert sizes == [4, 4]
    assert [str(w.message) for w in seen if w.category is DtworkWarning] == [
        "ctx.steps got a dataset: iterating ctx.loader(dataset) (batches of 4 per rank, sharded); "
        "pass ctx.loader(...) yourself to choose"
    ]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda ctx: ctx.steps(range(3), max_step=3),
            r"ctx.steps got an unknown argument max_step=: did you mean max_steps=\?",
        ),
        (
            lambda ctx: ctx.steps(range(3), max_steps="3"),
            r"ctx.steps: max_steps must be an int, got '3' \(str\): use max_steps=3",
        ),
        (lambda ctx: ctx.steps(range(3), max_epochs=1.5), r"max_epochs must be an int, got 1.5 \(float\)"),
        (
            lambda ctx: ctx.optimizer(torch.nn.Linear(2, 2)),
            r"ctx.optimizer takes parameters, got a model \(Linear\): use ctx.optimizer\(model.parameters\(\)\)",
        ),
        (
            lambda ctx: ctx.evaluate(
                torch.utils.data.TensorDataset(torch.ones(2, 2)), torch.nn.Linear(2, 2), None
            ),
            r"ctx.evaluate takes the model first: ctx.evaluate\(model, dataset_or_loader, metric_fn\)",
        ),
        (
            lambda ctx: ctx.evaluate(torch.nn.Linear(2, 2), [], None, batchsize=2),
            r"ctx.evaluate got an unknown argument batchsize=: did you mean batch_size=\?",
        ),
    ],
    ids=["max_step", "max_steps-str", "max_epochs-float", "optimizer-model", "evaluate-order", "evaluate-kw"],
)
def test_ctx_helpers_check_their_arguments(call: object, message: str) -> None:
    with pytest.raises(DtworkError, match=message):
        call(_ctx(global_batch_size=4))  # type: ignore[operator]
