"""What a user of the Python API sees: rank 0's warnings once, ctx in functions, the step's batch.

Its tests that need no engines; the others are in tests/cluster/test_user_api.py.
"""

from __future__ import annotations

from dtwork.commands import step_batch
from dtwork.config import load_config


def test_gns_advice_uses_the_batch_an_optimizer_step_sees() -> None:
    cfg = load_config({"global_batch_size": 64, "optimizations": {"aggregation_frequency": 2}})
    assert step_batch(None, 64, cfg, 2) == 128
    assert step_batch(128.0, 64, cfg, 2) == 128  # the estimator's B_big when the run has one
    assert step_batch(None, None, cfg, 2) == 2
