"""The gradient noise scale measured in real 2-rank DDP runs, against the truth in closed form.

Its tests that need no engines; the others are in tests/cluster/test_gns.py.
"""

from __future__ import annotations

import torch


def test_norms_kept_on_the_device_are_read_with_the_sync() -> None:
    """On an accelerator the steps loop keeps each step's norms as 0-d tensors (reading one would
    wait for the device every step); the sync's vector reads them with everything else."""
    from dtwork.runtime.loop.sync import StepHead, StepSync

    sync = StepSync(torch.device("cpu"), world_size=1)
    small = torch.tensor(3.0, dtype=torch.float64)
    sync.add_log({"loss": 2.0})
    sync.record(0, StepHead(gns_small=small, gns_big_share=torch.tensor(1.5), gns_measured=1.0))
    sync.record(1, StepHead(gns_small=4.0, gns_big_share=2.0, gns_measured=1.0))
    sync.launch()
    first, second = sync.drain()
    assert (first.head.gns_small, first.head.gns_big_share, second.head.gns_small) == (3.0, 1.5, 4.0)
    assert first.logs == [2.0] and isinstance(first.head.gns_small, float)
