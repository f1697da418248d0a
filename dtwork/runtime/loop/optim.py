"""The configured optimizer (SGD with momentum, Adam, AdamW, LARS) and LR schedule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

import torch
from torch.distributed.tensor import DTensor

from dtwork.analysis.schedules import decay_factor, lars_trust_ratio, scaled_lr, warmup_factor
from dtwork.runtime.core import effective_args

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.optim.optimizer import ParamsT

    from dtwork.runtime.core.state import RankState


class LARS(torch.optim.Optimizer):
    """SGD with momentum and layer-wise adaptive rate scaling (You et al. 2017, arXiv:1708.03888).

    Each parameter's step is scaled by the trust ratio eta*|w| / (|g| + wd*|w|); biases and
    norms (1-d parameters) use the plain rate.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
    ) -> None:
        super().__init__(
            params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": trust_coefficient}
        )

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                ratio = 1.0
                if p.dim() > 1:
                    ratio = lars_trust_ratio(
                        float(p.norm()), float(grad.norm()), group["eta"], group["weight_decay"]
                    )
                    grad = grad.add(p, alpha=group["weight_decay"])
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = torch.clone(grad).detach()
                else:
                    buf.mul_(group["momentum"]).add_(grad)
                p.add_(buf, alpha=-group["lr"] * ratio)
        return loss


def configured_lr(state: RankState) -> float:
    """The base LR scaled for the global batch (linear or sqrt rule; Goyal et al. 2017)."""
    lr = state.config.lr
    if lr.scaling == "none" or state.global_batch_size is None:
        return float(lr.base)
    return scaled_lr(
        lr.base, state.global_batch_size, lr.base_batch_size or state.global_batch_size, lr.scaling
    )


def make_optimizer(state: RankState, params: ParamsT, **overrides: Any) -> torch.optim.Optimizer:
    """Build the optimizer named by ``config.optimizer`` with the scaled LR; kwargs override."""
    o = state.config.optimizer
    effective_args.note(state, "ctx.optimizer", **overrides)
    lr = overrides.pop("lr", configured_lr(state))
    kind = overrides.pop("type", o.type)
    if kind == "sgd":
        opts: dict[str, Any] = {
            "momentum": o.momentum,
            "nesterov": o.nesterov,
            "weight_decay": o.weight_decay,
        }
        return torch.optim.SGD(params, lr=lr, **{**opts, **overrides})
    if kind in ("adam", "adamw"):
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        opts = {"betas": tuple(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}
        return cls(params, lr=lr, **{**opts, **overrides})
    if kind == "lars":
        opts = {
            "momentum": o.momentum,
            "weight_decay": o.weight_decay,
            "trust_coefficient": o.trust_coefficient,
        }
        return LARS(params, lr=lr, **{**opts, **overrides})
    from dtwork.errors import DtworkError

    raise DtworkError(f"unknown optimizer {kind!r}: use sgd, adam, adamw or lars")


def clip_grad_norm(
    state: RankState,
    model: torch.nn.Module,
    max_norm: float,
    norm_type: float = 2.0,
    optimizer: torch.optim.Optimizer | None = None,
) -> torch.Tensor | None:
    """Clip the gradients of ``model`` to ``max_norm``; return their total norm before clipping.

    With fp16 the gradients carry the loss scale: the optimizers of ``model`` (``optimizer``, or
    those ``ctx`` knows) are unscaled first, once per step, as ``GradScaler.unscale_`` requires.
    Inside ``ctx.steps`` with accumulation, only the last micro-batch clips (None before it).
    """
    loop = state.loop
    if loop is not None and not loop.is_last_micro:
        return None
    params = [p for p in model.parameters() if p.grad is not None]
    scaler = state.scaler
    if scaler is not None:
        mine = {id(p) for p in params}
        optimizers = [optimizer] if optimizer is not None else state.optimizers
        for opt in optimizers:
            if any(id(p) in mine for g in opt.param_groups for p in g["params"]):
                _unscale_once(scaler, opt)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    if isinstance(norm, DTensor):  # over FSDP shards: the total norm, replicated; a plain tensor to log
        norm = norm.full_tensor()
    return norm


def _unscale_once(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
    try:
        scaler.unscale_(optimizer)
    except RuntimeError as exc:
        if "already been called" not in str(exc):
            raise


def make_scheduler(
    state: RankState, optimizer: torch.optim.Optimizer, **overrides: Any
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR: linear warmup over ``lr.warmup`` steps, then the configured decay."""
    cfg = state.config
    s = cfg.lr_schedule
    warmup = int(overrides.pop("warmup", cfg.lr.warmup))
    kind = overrides.pop("type", s.type)
    total = overrides.pop("total_steps", cfg.schedule_total_steps())
    params = {
        "step_size": s.step_size,
        "gamma": s.gamma,
        "power": s.power,
        "min_factor": s.min_factor,
        **overrides,
    }
    decay_total = None if total is None else max(1, total - warmup)

    def factor(step: int) -> float:
        return warmup_factor(step, warmup) * decay_factor(max(0, step - warmup), kind, decay_total, **params)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
