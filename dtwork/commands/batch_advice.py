"""``%dtrain gns``: batch-size advice from the run's gradient noise scale, with why it says so.

B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018), estimated during training (``runtime.measure``)
and stored as metrics; the advice is ``analysis.gns.advise``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtwork.commands.bench_call import in_ipython
from dtwork.errors import DtworkError
from dtwork.shared.records import DIVERGED, divergence_text, finite

if TYPE_CHECKING:
    from dtwork.analysis.gns import BatchAdvice
    from dtwork.cluster import Cluster
    from dtwork.config import ExperimentConfig
    from dtwork.store.runs import RunStore

__all__ = ["gns_advice", "interval_text", "step_batch"]


def _latest(store: RunStore, run_id: int, name: str) -> float | None:
    rows = [v for r in store.metrics(run_id, name) if (v := finite(r.get("value"))) is not None]
    return rows[-1] if rows else None


def _learning_rates(cluster: Cluster) -> tuple[list[float], str]:
    """The learning rates the advice scales: those of the newest optimizer's parameter groups as
    they are now (after its schedule), else the config's ``lr.base`` (scaled to the batch)."""
    from dtwork.runtime import entry

    try:
        (per_optimizer,) = cluster.engines.call(entry.optimizer_lrs, (), {}, ranks=[0])
    except Exception:  # no rank to ask (stopped): the config's
        per_optimizer = []
    if per_optimizer and per_optimizer[-1]:
        groups = len(per_optimizer[-1])
        where = "the optimizer's, after its schedule" + (
            f"; {groups} parameter groups, each scaled alike" if groups > 1 else ""
        )
        return per_optimizer[-1], where
    return [
        cluster.config.effective_lr()
    ], "the config's lr.base: no optimizer made with ctx.optimizer or stepped by ctx.step"


def _left_out_text(store: RunStore, run_id: int) -> str | None:
    """Why some steps are not in the estimate: non-finite gradients, a diverged run; else None."""
    left = _latest(store, run_id, "left_out")
    diverged = next((e["data"] for e in store.events(run_id, DIVERGED)), None)
    if not left and not diverged:
        return None
    parts = [f"{left:.0f} measurement(s) with non-finite gradients left out"] if left else []
    if diverged:
        parts.append(f"the run {divergence_text(diverged)}")
    return "; ".join(parts) + ": the estimate and this advice use the finite steps only"


def _adaptive_text(store: RunStore, run_id: int) -> list[str]:
    """Why the adaptive batch is what it is: its last decision and its last change; [] without one."""
    rows = [r for r in store.metrics(run_id) if r["kind"] == "adaptive"]  # not a logged metric's name
    if not rows:
        return []
    step = rows[-1]["step"]
    last = {r["name"]: r["value"] for r in rows if r["step"] == step}
    gain, eff, thr = last.get("predicted_gain"), last.get("efficiency"), 100 * (last.get("threshold") or 0.0)
    out = [
        f"adaptive batch: global batch {last.get('global_batch') or 0:.0f} = {last.get('per_slot_batch') or 0:.0f} "
        f"per slot x {last.get('accumulation') or 1:.0f} accumulated, LR x{last.get('lr_factor') or 1:.3g} "
        f"(decision at step {step})"
    ]
    if gain is None:  # the last decision did not decide (the GNS interval not settled): no move
        out.append(
            f"  no settled GNS interval at the last decision: the batch stays at {last.get('global_batch') or 0:.0f}"
        )
    else:
        eff_text = f", efficiency E = {eff:.2f} against the starting batch" if eff is not None else ""
        out.append(
            f"  best predicted goodput gain {100 * gain:.1f}% (a switch needs more than {thr:.0f}%){eff_text}"
        )
    changes = store.events(run_id, kind="batch")
    if changes:
        out.append(f"  last change: {changes[-1]['message']}")
    return out


def interval_text(store: RunStore, run_id: int) -> str:
    """The latest estimate's 95% interval, and "not yet settled" until it is narrow enough to act on."""
    from dtwork.analysis.gns import GNSInterval

    rows = store.metrics(run_id, "b_simple")
    step = rows[-1]["step"] if rows else None
    lo, hi, settled = (
        next((r["value"] for r in reversed(store.metrics(run_id, n)) if r["step"] == step), None)
        for n in ("b_simple_lo", "b_simple_hi", "settled")
    )
    text = f" (95% interval {lo:.1f}-{hi:.1f})" if lo is not None and hi is not None else ""
    if settled is not None and not settled:
        low = (
            lo is not None
            and hi is not None
            and (estimate := rows[-1]["value"]) is not None  # a missing value: nothing settled
            and GNSInterval(estimate, lo, hi, 0.0, False).low_settled
        )
        text += (
            ", its lower end settled (a larger batch can rest on it), its upper end still wide"
            if low
            else ", not yet settled: train more steps before acting on it"
        )
    return text


def gns_advice(
    cluster: Cluster, *, dataset_size: int | None = None, run_id: int | None = None, quiet: bool = False
) -> BatchAdvice | None:
    """Batch-size advice from the latest B_simple of the current run (``analysis.gns.advise``).

    Returns a ``BatchAdvice``, or None (saying why) when the run has no noise-scale estimate.
    """
    from dtwork.analysis.gns import advise

    session = cluster.session
    store = session.store
    rid = run_id or session.run_id or store.latest_run_id()
    b_simple = _latest(store, rid, "b_simple") if rid is not None else None
    if rid is None or b_simple is None or not b_simple > 0:
        reason = "no gradient noise scale estimate in this run yet"
        if b_simple is not None:
            reason = f"the B_simple estimate is {b_simple:.3g} (not positive): train more steps"
        print(
            f"dtwork: {reason}: wrap the model with ctx.wrap(model, gns=True) (or gns.enabled in the config) "
            "and train a few steps under ctx.steps"
        )
        return None
    cfg = cluster.config
    global_batch = step_batch(
        _latest(store, rid, "b_big"), cluster.global_batch_size, cfg, cluster.world_size
    )
    lrs, lr_source = _learning_rates(cluster)
    try:
        advice = advise(
            b_simple,
            int(global_batch),
            cluster.world_size,
            base_lr=lrs[0],
            warmup_steps=cfg.lr.warmup,
            dataset_size=dataset_size,
        )
    except ValueError as exc:
        raise DtworkError(str(exc)) from None
    if not quiet:
        k = cfg.optimizations.aggregation_frequency
        per_step = (
            f" ({cluster.global_batch_size} x {k} accumulated)" if k > 1 and cluster.global_batch_size else ""
        )
        print(
            f"dtwork: B_simple ~ {b_simple:.1f}{interval_text(store, rid)} at a batch of {global_batch} "
            f"per optimizer step{per_step} (run {rid})"
        )
        print(f"  learning rate now: {', '.join(f'{lr:.3g}' for lr in lrs)} ({lr_source})")
        for line in advice.summary():
            print(f"  {line}")
        if (left := _left_out_text(store, rid)) is not None:
            print(f"  note: {left}")
        for line in _adaptive_text(store, rid):
            print(f"  {line}")
    if in_ipython():
        from IPython.display import display

        from dtwork.plots import gns_figure, tradeoff_figure

        display(gns_figure(store.metrics(rid, "b_simple"), global_batch))
        display(tradeoff_figure(b_simple, global_batch))
    return advice


def step_batch(b_big: float | None, global_batch: int | None, cfg: ExperimentConfig, world_size: int) -> int:
    """The examples one optimizer step sees: the estimator's B_big when the run has one, else the
    global batch times ``aggregation_frequency`` (every micro-batch of every rank)."""
    if b_big:
        return int(b_big)
    if global_batch:
        return global_batch * cfg.optimizations.aggregation_frequency
    return world_size
