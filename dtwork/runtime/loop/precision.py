"""Mixed precision for ``ctx.steps``: the run's loss scaler at a loop's start, autocast per micro-batch."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from dtwork.runtime.parallel.strategy import run_strategy

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState


def setup_scaler(state: RankState) -> None:
    """The loss scaler ``optimizations.mixed_precision`` asks for, of the kind the run's models take."""
    mp = state.config.mixed_precision
    kind = run_strategy(state.run_modules()).scaler_kind  # the run's models, not a stale one's
    if mp == "fp16" and type(state.scaler) is not kind:
        state.scaler = kind(state.device.type)
    elif mp != "fp16":
        state.scaler = None  # bf16 and fp32 need no loss scaling


class Autocast:
    """Called per micro-batch: the autocast context of the configured precision (none for fp32)."""

    def __init__(self, state: RankState) -> None:
        mp = state.config.mixed_precision
        self.device_type = state.device.type
        self.dtype = None if mp == "none" else torch.float16 if mp == "fp16" else torch.bfloat16

    def __call__(self) -> contextlib.AbstractContextManager[object]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)
