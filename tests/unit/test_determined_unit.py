"""Determined's own MNIST distributed tutorial config on a real 2-rank gloo cluster.

Its tests that need no engines; the others are in tests/cluster/test_determined.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import dtwork
from dtwork.config import Length, load_config
from dtwork.errors import ConfigError
from tests.cluster.test_determined import MNIST


def test_the_file_loads_as_written() -> None:
    cfg = load_config(MNIST)
    assert cfg.global_batch_size == 512 and cfg.resources.slots_per_trial == 8
    assert cfg.searcher.max_length == Length("batches", 117)
    assert cfg.searcher.metric == "validation_loss" and cfg.searcher.smaller_is_better
    assert cfg.hyperparameters["learning_rate"] == 1.0 and cfg.hyperparameters["global_batch_size"] == 512
    assert cfg.data == {
        "url": "https://s3-us-west-2.amazonaws.com/determined-ai-test-data/pytorch_mnist.tar.gz"
    }
    assert cfg.notes == (
        "determined-mnist-distributed.yaml: dtwork ignores entrypoint (it runs notebook cells on its own cluster)",
    )


def test_without_n_on_two_cpus_it_fails_at_once(monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(ConfigError) as info:
        dtwork.start(backend="gloo", config=MNIST)
    assert str(info.value) == (
        "resources.slots_per_trial: 8 is more than the 2 slots (CPU cores) on this machine, so the trial "
        "cannot be scheduled: start with -n 2 (the global batch 512 then splits 256 per slot), lower "
        "slots_per_trial to 2, or use --profile NAME to start engines on more hosts"
    )
