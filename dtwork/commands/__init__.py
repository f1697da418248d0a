"""The analysis commands run from the kernel (scaling, throughput, tune, GNS advice), doctor, script export. May import everything below the entry points.

One module per command; the four analysis commands are also importable from here
(``dtwork.commands.scaling(...)``), as ``%dtrain`` calls them.
"""

from __future__ import annotations

from dtwork.commands.batch_advice import gns_advice, step_batch
from dtwork.commands.loading_check import throughput
from dtwork.commands.scaling_sweep import scaling
from dtwork.commands.stacks import check_collectives, show_stacks
from dtwork.commands.tune import DEFAULT_SIZES, tune_buckets

__all__ = [
    "DEFAULT_SIZES",
    "check_collectives",
    "gns_advice",
    "scaling",
    "show_stacks",
    "step_batch",
    "throughput",
    "tune_buckets",
]
