"""Determined's own MNIST distributed tutorial config on a real 2-rank gloo cluster.

The fixture is examples/tutorials/mnist_pytorch/distributed.yaml as Determined publishes it
(determined-ai/determined): slots_per_trial 8, hyperparameters.global_batch_size 512,
searcher.max_length {batches: 117}.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dtwork
from dtwork.config import load_config

MNIST = Path(__file__).parents[1] / "fixtures" / "determined-mnist-distributed.yaml"

TRAIN = """
import random, numpy as np, torch
from torch.utils.data import TensorDataset
seeds = (random.random(), float(np.random.rand()), float(torch.rand(())))
data = TensorDataset(torch.randn(60_000, 4), torch.randint(0, 2, (60_000,)))
model = ctx.wrap(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=ctx.hparams["learning_rate"] * 0.01)
validations = []
def validate():
    validations.append(ctx.loop.step)
    return {"validation_loss": 1.0 / (1 + len(validations))}
steps = 0
for step, (x, y) in ctx.steps(ctx.loader(data), **KW):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    ctx.backward(loss)
    ctx.step(opt)
    steps += 1
    batch = len(x)
facts = (ctx.per_slot_batch_size, ctx.global_batch_size, ctx.rank_seed, ctx.config.data.get("url"))
"""


@pytest.fixture(scope="module")
def mnist_cluster(state_dir: Path) -> Iterator[Any]:
    c = dtwork.start(n=2, backend="gloo", config=MNIST, timeout=60)
    c.session.live = False
    yield c
    c.stop()


def test_two_ranks_split_the_batch_and_stop_at_max_length(mnist_cluster: Any) -> None:
    c = mnist_cluster
    c.push({"KW": {}})
    c.run(TRAIN)
    url = "https://s3-us-west-2.amazonaws.com/determined-ai-test-data/pytorch_mnist.tar.gz"
    assert [f[:2] for f in c.pull("facts")] == [(256, 512), (256, 512)]
    assert [f[3] for f in c.pull("facts")] == [url, url]
    assert c.pull("batch") == [256, 256]
    assert c.pull("steps") == [117, 117]


def test_seed_seeds_every_generator_on_every_rank(mnist_cluster: Any) -> None:
    import random

    import numpy as np
    import torch

    c = mnist_cluster
    c.configure(load_config(MNIST).replace(seed=1234))
    c.push({"KW": {"max_steps": 1}})
    c.run(TRAIN)
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    assert c.pull("seeds") == [expected, expected]
    assert [f[2] for f in c.pull("facts")] == [1234, 1235]


def test_validation_and_checkpoint_periods_drive_the_loop(mnist_cluster: Any, tmp_path: Path) -> None:
    c = mnist_cluster
    cfg = load_config(MNIST).replace(
        records_per_epoch=5120,
        min_validation_period={"epochs": 1},  # 5120 / 512 = 10 steps
        min_checkpoint_period={"records": 10240},  # 20 steps
        searcher={"max_length": {"batches": 45}},
        checkpoint={"directory": str(tmp_path / "ckpt")},
    )
    c.configure(cfg)
    c.run(TRAIN.replace("**KW", "validate=validate"))
    assert c.pull("steps") == [45, 45]
    assert c.pull("validations") == [[9, 19, 29, 39], [9, 19, 29, 39]]
    saved = {int(p.stem.split("-")[1]) for p in (tmp_path / "ckpt").rglob("step-*.pt")}
    assert {20, 40} <= saved and not saved & {10, 30}  # every 20 steps (a final one may follow)
    store = c.session.store
    run = c.session.run_id  # not the store's newest: the other test workers write runs into it too
    assert [(m["step"], m["value"]) for m in store.metrics(run, "validation_loss")] == [
        (9, 0.5),
        (19, 1 / 3),
        (29, 0.25),
        (39, 0.2),
    ]


def test_auto_tune_tensor_fusion_sweeps_once_before_training(mnist_cluster: Any) -> None:
    from dtwork.runtime.loop.bucket_tuning import SIZES_MB

    c = mnist_cluster
    c.configure(load_config(MNIST).with_path("optimizations.auto_tune_tensor_fusion", True))
    c.run(
        "import torch\n"
        "first = ctx.wrap(torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)))\n"
        "chosen = ctx.config.optimizations.tensor_fusion_threshold\n"
        "again = ctx.wrap(torch.nn.Linear(4, 2))\n"
        "after = (chosen, ctx.config.optimizations.tensor_fusion_threshold, first.bucket_bytes_cap)\n"
    )
    after = c.pull("after")
    assert after[0] == after[1]  # the same choice on every rank
    chosen, kept, cap = after[0]
    assert chosen in SIZES_MB and kept == chosen and cap == int(chosen * 1024 * 1024)
    store = c.session.store
    events = store.events(c.session.run_id, kind="tensor_fusion")
    assert len(events) == 1 and events[0]["message"].startswith(f"auto-tuned bucket size {chosen:g} MB")
