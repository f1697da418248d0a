"""Learning-rate scaling rules, warmup, decay schedules and the LARS trust ratio.

References: Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour"
(arXiv:1706.02677) for linear scaling and gradual warmup; Krizhevsky 2014, "One weird trick
for parallelizing convolutional neural networks" (arXiv:1404.5997) for square-root scaling;
Loshchilov & Hutter 2017, "SGDR" (arXiv:1608.03983) for cosine decay; You, Gitman & Ginsburg
2017, "Large Batch Training of Convolutional Networks" (arXiv:1708.03888) for LARS.
"""

from __future__ import annotations

import math
from typing import Any

RULES: tuple[str, ...] = ("none", "linear", "sqrt")
SCHEDULES: tuple[str, ...] = ("constant", "step", "exponential", "cosine", "polynomial")


def scaled_lr(base_lr: float, global_batch: int, base_batch: int, rule: str) -> float:
    """Return the learning rate scaled from ``base_lr`` tuned at ``base_batch`` to ``global_batch``.

    none: lr = base; linear: lr = base * B / B_base (Goyal et al. 2017);
    sqrt: lr = base * sqrt(B / B_base) (Krizhevsky 2014).
    """
    if rule not in RULES:
        raise ValueError(f"LR scaling rule must be one of {', '.join(RULES)}, got {rule!r}.")
    if global_batch < 1 or base_batch < 1:
        raise ValueError(
            f"global_batch and base_batch must be at least 1, got {global_batch} and {base_batch}."
        )
    ratio = global_batch / base_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    return base_lr


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Return the linear warmup factor min(1, (step + 1) / warmup_steps), or 1 without warmup.

    Step 0 trains at lr/warmup_steps and step warmup_steps - 1 at the full lr (Goyal et al. 2017).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}.")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}.")
    if warmup_steps == 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


def _check_decay_args(
    schedule: str, total_steps: int | None, step_size: int, gamma: float, min_factor: float
) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"LR schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}.")
    if schedule in ("cosine", "polynomial"):
        if total_steps is None:
            raise ValueError(f"The {schedule} schedule needs total_steps: set the number of training steps.")
        if total_steps < 1:
            raise ValueError(
                f"The {schedule} schedule needs total_steps >= 1 after warmup, got {total_steps}."
            )
    if schedule in ("step", "exponential"):
        if step_size < 1:
            raise ValueError(f"step_size must be at least 1, got {step_size}.")
        if gamma <= 0:
            raise ValueError(f"gamma must be positive, got {gamma}.")
    if not 0.0 <= min_factor <= 1.0:
        raise ValueError(f"min_factor must be in [0, 1], got {min_factor}.")


def decay_factor(
    step: int,
    schedule: str,
    total_steps: int | None,
    *,
    step_size: int = 1000,
    gamma: float = 0.1,
    power: float = 1.0,
    min_factor: float = 0.0,
) -> float:
    """Return the decay multiplier at ``step`` (counted after warmup) over ``total_steps``.

    constant: 1; step: gamma**(t // step_size); exponential: gamma**(t / step_size);
    cosine: m + (1 - m) * (1 + cos(pi t / T)) / 2 (Loshchilov & Hutter 2017);
    polynomial: m + (1 - m) * (1 - t / T)**power; both hold m once t >= T.
    """
    _check_decay_args(schedule, total_steps, step_size, gamma, min_factor)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}.")
    if schedule == "step":
        return gamma ** (step // step_size)
    if schedule == "exponential":
        return float(gamma ** (step / step_size))
    if schedule == "constant":
        return 1.0
    assert total_steps is not None
    frac = min(1.0, step / total_steps)
    if schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * frac))
    else:
        shape = (1.0 - frac) ** power
    return min_factor + (1.0 - min_factor) * shape


def lr_at(
    step: int,
    base_lr: float,
    *,
    global_batch: int,
    base_batch: int,
    rule: str = "none",
    warmup_steps: int = 0,
    schedule: str = "constant",
    total_steps: int | None = None,
    **schedule_kwargs: Any,
) -> float:
    """Return the learning rate at ``step``.

    lr = scaled_lr(base_lr) * warmup_factor(step) * decay_factor(max(0, step - warmup), T - warmup)
    where T = total_steps, so decay starts after warmup (Goyal et al. 2017).
    """
    decay_total = None if total_steps is None else total_steps - warmup_steps
    if decay_total is not None and decay_total < 1 and schedule in ("cosine", "polynomial"):
        raise ValueError(f"total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps}).")
    lr = scaled_lr(base_lr, global_batch, base_batch, rule)
    warm = warmup_factor(step, warmup_steps)
    decay = decay_factor(max(0, step - warmup_steps), schedule, decay_total, **schedule_kwargs)
    return lr * warm * decay


def lars_trust_ratio(
    weight_norm: float,
    grad_norm: float,
    trust_coefficient: float = 0.001,
    weight_decay: float = 0.0,
    eps: float = 1e-9,
) -> float:
    """Return the LARS local lr ratio eta |w| / (|g| + wd |w| + eps), or 1 when |w| or |g| is 0.

    (You, Gitman & Ginsburg 2017, arXiv:1708.03888, eq. 6.)
    """
    if weight_norm < 0 or grad_norm < 0:
        raise ValueError(f"Norms must be >= 0, got weight_norm={weight_norm} and grad_norm={grad_norm}.")
    if weight_norm == 0 or grad_norm == 0:
        return 1.0
    return trust_coefficient * weight_norm / (grad_norm + weight_decay * weight_norm + eps)
