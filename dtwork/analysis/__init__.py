"""Pure analysis functions: gradient noise scale, scaling efficiency and LR schedules.

Nothing here imports torch, ipyparallel or widgets, so it runs anywhere numpy does.
"""

from __future__ import annotations

from .gns import (
    BatchAdvice,
    GNSEstimator,
    advise,
    b_simple,
    batch_sizes_for,
    no_estimate_reason,
    tradeoff,
    tradeoff_curve,
    unbiased_estimates,
)
from .scaling import (
    MODES,
    ScalingPoint,
    ScalingResult,
    best_bucket,
    efficiency,
    plan_sizes,
    speedup,
)
from .schedules import (
    RULES,
    SCHEDULES,
    decay_factor,
    lars_trust_ratio,
    lr_at,
    scaled_lr,
    warmup_factor,
)

__all__ = [
    "MODES",
    "RULES",
    "SCHEDULES",
    "BatchAdvice",
    "GNSEstimator",
    "ScalingPoint",
    "ScalingResult",
    "advise",
    "b_simple",
    "batch_sizes_for",
    "best_bucket",
    "decay_factor",
    "efficiency",
    "lars_trust_ratio",
    "lr_at",
    "no_estimate_reason",
    "plan_sizes",
    "scaled_lr",
    "speedup",
    "tradeoff",
    "tradeoff_curve",
    "unbiased_estimates",
    "warmup_factor",
]
