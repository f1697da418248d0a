"""TensorBoard and MLflow exports of a real SQLite run store, read back with each tool's own reader.

Its tests that need engines (a cluster, a kernel, a process group across processes); the others are
in tests/unit/test_export.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def test_config_tensorboard_writes_live_from_the_kernel(cluster: object, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    c = cluster
    c.configure({"name": "live", "tensorboard": str(tmp_path / "tb")})  # type: ignore[attr-defined]
    c.run(  # type: ignore[attr-defined]
        "import torch\n"
        "for step, (x,) in ctx.steps(ctx.loader(ctx.synthetic((4,), size=512), batch_size=8), max_steps=30):\n"
        "    ctx.log(loss=float(x.sum()))\n"
    )
    session = c.session  # type: ignore[attr-defined]
    run = session.run_id
    stored = [(m["step"], m["value"]) for m in session.store.metrics(run, "loss")]
    assert len(stored) == 30
    acc = EventAccumulator(str(tmp_path / "tb" / f"run-{run}-live"), size_guidance={"scalars": 0})
    acc.Reload()
    read = [(e.step, e.value) for e in acc.Scalars("loss")]
    assert [s for s, _ in read] == [s for s, _ in stored]
    assert [v for _, v in read] == pytest.approx([v for _, v in stored], rel=1e-6)
    c.configure(None)  # type: ignore[attr-defined]
