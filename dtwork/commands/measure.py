"""Kernel side of the analysis commands: scaling sweeps, data-loading check, bucket tuning, GNS advice.

Each command calls ``dtwork.runtime.bench.measure`` on every rank (through ``Cluster.run``),
turns the per-rank numbers into an ``analysis`` result, stores it in the run store
(``store.add_result``), prints one plain line and, inside IPython, shows a figure from
``dtwork.plots``. No torch here: the engines own the devices.

Scaling efficiency E(n) = T(n) / (n T(1)) with T in samples/s (``analysis.scaling``).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from dtwork.errors import DtworkError
from dtwork.shared import batch
from dtwork.shared.records import DIVERGED, divergence_text, finite

if TYPE_CHECKING:
    from dtwork.analysis.gns import BatchAdvice
    from dtwork.analysis.loading import Interval
    from dtwork.analysis.scaling import ScalingResult
    from dtwork.cluster import Cluster
    from dtwork.config import ExperimentConfig
    from dtwork.store.runs import RunStore

Shape = int | str | Sequence[int] | None  # --shape as typed (3,32,32), or a tuple from Python

DEFAULT_PER_SLOT = 32
DEFAULT_SIZES: tuple[float, ...] = (1, 4, 16, 64, 256)


# -- shipped to the engines (pickled by reference: this module imports no torch) ------------------


def _bench(*args: Any) -> Any:  # a pass-through to the rank: bench.measure's arguments and result
    from dtwork.runtime.bench import measure

    return measure(*args)


# -- helpers ------------------------------------------------------------------------------------


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    return get_ipython() is not None


def _shape(shape: Shape) -> tuple[int, ...] | None:
    if shape is None:
        return None
    if isinstance(shape, int):
        return (shape,)
    if isinstance(shape, str):
        try:
            return tuple(int(v) for v in shape.split(",") if v.strip())
        except ValueError:
            raise DtworkError(f"--shape takes whole numbers such as 3,32,32 — got {shape!r}") from None
    return tuple(int(v) for v in shape)


def _check_slots(cluster: Cluster, slots: Iterable[int] | None) -> list[int]:
    world = cluster.world_size
    if slots is None:
        out, n = [], 1
        while n < world:
            out.append(n)
            n *= 2
        return sorted(set(out + [world]))
    out = sorted(set(int(s) for s in slots))
    if not out:
        raise DtworkError("--slots needs at least one world size, such as 1,2")
    if out[0] < 1:
        raise DtworkError(f"--slots {out[0]} is not a world size: use 1 or more")
    if out[-1] > world:
        raise DtworkError(f"--slots {out[-1]} exceeds the {world} ranks of this cluster")
    return out


def _run_bench(
    cluster: Cluster,
    model_expr: str,
    world: int,
    per_slot: int,
    *,
    steps: int,
    warmup: int,
    shape: tuple[int, ...] | None,
    loader_expr: str | None = None,
    synthetic: bool = True,
    bucket_mb: float | None = None,
    loader_settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Call the engine-side measurement on every rank; return rank 0's numbers (world-wide)."""
    if not isinstance(model_expr, str) or not model_expr.strip():
        raise DtworkError("give a model expression such as Net() (defined in a %%dtrain cell)")
    out = cluster.run(
        _bench,
        model_expr,
        world,
        per_slot,
        steps,
        warmup,
        shape,
        loader_expr,
        synthetic,
        bucket_mb,
        loader_settings,
    )
    mine = [r for r in out[:world] if r is not None]
    errors = [r["error"] for r in mine if "error" in r]
    if errors:
        what = f"model expression {model_expr!r}"
        if loader_expr:
            what = f"model {model_expr!r} or loader {loader_expr!r} expression"
        hint = (
            " (define it in a %%dtrain cell first)"
            if errors[0].startswith(("NameError", "AttributeError"))
            else ""
        )
        if "pass --shape" in errors[0]:  # the rank's one line already says what to do
            raise DtworkError(f"{model_expr}: {errors[0]}")
        raise DtworkError(f"{what} failed on the engines: {errors[0]}{hint}")
    return {
        **mine[0],
        "comm_time": max(r["comm_time"] for r in mine),
        "step_time": max(r["step_time"] for r in mine),
    }


def _per_slot(cluster: Cluster) -> int:
    """The cluster's per-slot batch, or DEFAULT_PER_SLOT without a global batch."""
    return batch.per_slot(cluster.global_batch_size, cluster.world_size) or DEFAULT_PER_SLOT


def _store(cluster: Cluster, kind: str, data: dict[str, Any]) -> int | None:
    try:
        session = cluster.session
        run_id = session.ensure_run()
        return session.store.add_result(run_id, kind, data)
    except DtworkError:
        raise
    except Exception as exc:  # the measurement stands even when the store cannot take it
        print(f"dtwork: could not store the {kind} result: {exc}")
        return None


# -- scaling ------------------------------------------------------------------------------------


def scaling(
    cluster: Cluster,
    model_expr: str,
    *,
    slots: Sequence[int] | None = None,
    mode: str = "weak",
    steps: int = 20,
    warmup: int = 3,
    per_slot: int | None = None,
    global_batch: int | None = None,
    shape: Shape = None,
    bucket_mb: float | None = None,
    repeats: tuple[int, int] = (3, 8),
    quiet: bool = False,
) -> ScalingResult:
    """Measure throughput at each world size in ``slots`` and return a ``ScalingResult``.

    Weak scaling keeps the per-slot batch b (global b n); strong scaling keeps the global batch
    B (per slot B // n). Efficiency E(n) = T(n) / (n T(1)). Synthetic batches of
    ``(per_slot, *shape)`` (shape defaults to the in_features of the model's first layer, a Linear). Each world
    size is timed ``repeats[0]`` to ``repeats[1]`` times, until its throughput's 95% interval is
    within ``analysis.scaling.SETTLE_REL`` of its mean (else the point says it did not settle).
    """
    from dtwork.analysis.scaling import ScalingPoint, ScalingResult, mean_interval, plan_sizes, settled

    if mode not in ("weak", "strong"):
        raise DtworkError(f"scaling mode is weak or strong, got {mode!r}")
    if steps < 1:
        raise DtworkError(f"--steps must be at least 1, got {steps}")
    sizes = _check_slots(cluster, slots)
    b = per_slot or _per_slot(cluster)
    big = global_batch or cluster.global_batch_size or b * sizes[-1]
    shp = _shape(shape)
    result = ScalingResult(mode=mode)  # type: ignore[arg-type]
    from dtwork.plots import scaling_figure
    from dtwork.widgets.updating import UpdatingFigure

    shown = UpdatingFigure()

    try:
        for n in sizes:
            try:
                ps, gb = plan_sizes(mode, b, big, n)
            except ValueError as exc:
                raise DtworkError(str(exc)) from None
            runs: list[dict[str, Any]] = []
            while len(runs) < max(1, repeats[0]) or (
                len(runs) < repeats[1] and not settled([r["world_samples_per_s"] for r in runs])
            ):
                r = _run_bench(
                    cluster, model_expr, n, ps, steps=steps, warmup=warmup, shape=shp, bucket_mb=bucket_mb
                )
                shp = tuple(r["shape"]) if r.get("shape") else shp
                runs.append(r)
            mean, low, high = mean_interval([r["world_samples_per_s"] for r in runs])
            point = ScalingPoint(
                world_size=n,
                throughput=mean,
                step_time=statistics.median(r["step_time"] for r in runs),
                comm_time=statistics.median(r["comm_time"] for r in runs),
                per_slot_batch=ps,
                global_batch=gb,
                low=low,
                high=high,
                repeats=len(runs),
                settled=len(runs) < 2 or settled([r["world_samples_per_s"] for r in runs], at_least=2),
            )
            result = ScalingResult(mode=result.mode, points=[*result.points, point])
            shown.show(scaling_figure(result))
    finally:
        shown.done()
    _store(cluster, "scaling", result.to_dict())
    if not quiet:
        print(f"dtwork: {mode} scaling of {model_expr}: {result.headline()}")
        for warning in result.warnings():
            print(f"dtwork: warning: {warning}")
    return result


# -- data loading -------------------------------------------------------------------------------


def _paired_rounds(
    first: Callable[[], float],
    second: Callable[[], float],
    rounds: tuple[int, int],
    decided: Callable[[Interval, int], bool],
) -> tuple[Interval, list[float], list[float]]:
    """Time ``first`` and ``second`` once a round, for ``rounds[0]`` to ``rounds[1]`` rounds until
    ``decided``; return the paired ratio first / second with its interval, and both timings."""
    from dtwork.analysis import loading

    a: list[float] = []
    b: list[float] = []
    least = max(2, min(rounds))
    while True:
        # Alternate which goes first, so a machine slowing down or warming up favours neither.
        for which in (0, 1) if len(a) % 2 == 0 else (1, 0):
            (b if which else a).append(second() if which else first())
        try:
            ratio = loading.paired(a, b)
        except ValueError as exc:
            raise DtworkError(str(exc)) from None
        if len(a) >= max(least, rounds[1]) or (len(a) >= least and decided(ratio, least)):
            return ratio, a, b


def throughput(
    cluster: Cluster,
    model_expr: str,
    loader_expr: str,
    *,
    steps: int = 10,
    warmup: int = 2,
    rounds: tuple[int, int] = (3, 8),
    advise: bool = True,
    quiet: bool = False,
) -> dict[str, Any]:
    """Compare real batches from ``loader_expr`` with synthetic ones of the same shape.

    One real and one synthetic timing per round, interleaved (``analysis.loading``), for
    ``rounds[0]`` to ``rounds[1]`` rounds, until the ratio's 95% interval gives a verdict. When
    loading is the bottleneck (and ``advise``), each candidate loader setting is timed against the
    current loader in paired rounds the same way and the best measurably faster one is advised. Returns
    ``{"real", "synthetic" (mean samples/s over all ranks), "ratio", "low", "high", "rounds",
    "verdict", "bottleneck", "sentence", "advice"}``.
    """
    from dtwork.analysis import loading

    if not loader_expr:
        raise DtworkError("throughput needs a loader: --data LOADER_EXPR (e.g. --data ctx.loader(ds))")
    if steps < 1:
        raise DtworkError(f"--steps must be at least 1, got {steps}")
    if rounds[1] < 2:
        raise DtworkError(f"--rounds must be at least 2 (an interval needs two), got {rounds[1]}")
    world = cluster.world_size

    def timed(synthetic: bool, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        return _run_bench(
            cluster,
            model_expr,
            world,
            DEFAULT_PER_SLOT,
            steps=steps,
            warmup=warmup,
            shape=None,
            loader_expr=loader_expr,
            synthetic=synthetic,
            loader_settings=settings,
        )

    facts: dict[str, Any] = {}

    def real_one(settings: dict[str, Any] | None = None) -> float:
        nonlocal facts
        r = timed(False, settings)
        facts = r.get("loader") or facts
        return float(r["world_samples_per_s"])

    ratio, real, synth = _paired_rounds(
        real_one, lambda: float(timed(True)["world_samples_per_s"]), rounds, loading.decided
    )
    kind = loading.verdict(ratio)
    mean_real, mean_synth = statistics.fmean(real), statistics.fmean(synth)
    sentence = loading.headline(kind, ratio, mean_real, mean_synth)
    advice = None
    if kind == "bottleneck" and advise:
        tried = []
        for setting in loading.candidates(facts):
            changed = functools.partial(real_one, setting)
            gain, _, _ = _paired_rounds(changed, real_one, rounds, loading.decided_gain)
            tried.append((setting, gain))
        advice = loading.advise(tried)
    out: dict[str, Any] = {
        "real": mean_real,
        "synthetic": mean_synth,
        "ratio": ratio.mean,
        "low": ratio.low,
        "high": ratio.high,
        "rounds": ratio.rounds,
        "verdict": kind,
        "bottleneck": kind == "bottleneck",
        "sentence": sentence,
        "advice": advice.to_dict() if advice else None,
        "advice_sentence": advice.sentence() if advice else None,
        "world_size": world,
        "model": model_expr,
        "loader": loader_expr,
    }
    _store(cluster, "throughput", out)
    if _in_ipython():
        from IPython.display import display

        from dtwork.plots import loading_figure

        display(loading_figure(mean_real, mean_synth, sentence.split(":")[0]))
    if not quiet:
        print(f"dtwork: {sentence}")
        if advice is not None:
            print(f"dtwork: advice: {advice.sentence()}")
    return out


# -- DDP bucket size ------------------------------------------------------------------------------


def tune_buckets(
    cluster: Cluster,
    model_expr: str,
    *,
    sizes: Sequence[float] = DEFAULT_SIZES,
    steps: int = 10,
    warmup: int = 2,
    per_slot: int | None = None,
    shape: Shape = None,
    write: bool = True,
    quiet: bool = False,
) -> dict[float, float]:
    """Time a step at each DDP bucket size (MB) on all ranks; return ``{size: step_time}``.

    The fastest (``analysis.scaling.best_bucket``) becomes ``optimizations.tensor_fusion_threshold``
    of the cluster config (with ``write``); stored as the "tensor_fusion" result.
    """
    from dtwork.analysis.scaling import best_bucket
    from dtwork.plots import bucket_figure
    from dtwork.widgets.updating import UpdatingFigure

    sizes = [float(s) for s in sizes]
    if not sizes or min(sizes) <= 0:
        raise DtworkError(f"--sizes takes positive bucket sizes in MB such as 1,4,16 — got {sizes}")
    world = cluster.world_size
    b = per_slot or _per_slot(cluster)
    shp = _shape(shape)
    results: dict[float, float] = {}
    shown = UpdatingFigure()
    try:
        for mb in sizes:
            r = _run_bench(cluster, model_expr, world, b, steps=steps, warmup=warmup, shape=shp, bucket_mb=mb)
            shp = tuple(r["shape"]) if r.get("shape") else shp
            results[mb] = r["step_time"]
            shown.show(bucket_figure(results))
    finally:
        shown.done()
    best = best_bucket(results)
    # stored in the run that was measured; writing the config then starts a new run
    _store(cluster, "tensor_fusion", {"results": {str(k): v for k, v in results.items()}, "best": best})
    if write:
        cluster.configure(cluster.config.with_path("optimizations.tensor_fusion_threshold", best))
    if not quiet:
        times = ", ".join(f"{mb:g} MB {t * 1e3:.1f} ms" for mb, t in results.items())
        where = "; written to optimizations.tensor_fusion_threshold" if write else ""
        print(f"dtwork: fastest bucket {best:g} MB ({times}){where}")
    return results


# -- gradient noise scale -----------------------------------------------------------------------


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


def _interval_text(store: RunStore, run_id: int) -> str:
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
            f"dtwork: B_simple ~ {b_simple:.1f}{_interval_text(store, rid)} at a batch of {global_batch} "
            f"per optimizer step{per_step} (run {rid})"
        )
        print(f"  learning rate now: {', '.join(f'{lr:.3g}' for lr in lrs)} ({lr_source})")
        for line in advice.summary():
            print(f"  {line}")
        if (left := _left_out_text(store, rid)) is not None:
            print(f"  note: {left}")
        for line in _adaptive_text(store, rid):
            print(f"  {line}")
    if _in_ipython():
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
