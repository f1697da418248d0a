"""What the analysis commands share: the bench call on the ranks, argument checks, storing a result.

Each command builds a ``BenchRequest`` (``dtwork.shared.bench``) and times it on every rank
(``synthetic`` or ``real`` batches, through ``Cluster.run``), turns the numbers into an ``analysis``
result, stores it in the run store (``store_result``), prints one plain line and, inside IPython,
shows a figure from ``dtwork.plots``. No torch here: the engines own the devices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

from dtwork.errors import DtworkError
from dtwork.shared import batch
from dtwork.shared.bench import BenchFailure, BenchRequest, BenchResult

if TYPE_CHECKING:
    from dtwork.cluster import Cluster

__all__ = [
    "DEFAULT_PER_SLOT",
    "Shape",
    "check_slots",
    "default_per_slot",
    "in_ipython",
    "parse_shape",
    "real",
    "store_result",
    "synthetic",
]

Shape = int | str | Sequence[int] | None  # --shape as typed (3,32,32), or a tuple from Python
Answer = BenchResult | BenchFailure | None

DEFAULT_PER_SLOT = 32


# -- shipped to the engines (pickled by reference: this module imports no torch) ------------------


def _synthetic_on_rank(request: BenchRequest) -> Answer:
    from dtwork.runtime.bench import time_synthetic_steps

    return time_synthetic_steps(request)


def _real_on_rank(request: BenchRequest) -> Answer:
    from dtwork.runtime.bench import time_loader_steps

    return time_loader_steps(request)


# -- the bench call -------------------------------------------------------------------------------


def synthetic(cluster: Cluster, request: BenchRequest) -> BenchResult:
    """Time ``request`` on random batches on every rank; rank 0's numbers, the slowest rank's times."""
    return _on_ranks(cluster, request, _synthetic_on_rank)


def real(cluster: Cluster, request: BenchRequest) -> BenchResult:
    """Time ``request`` on its loader's batches on every rank, like ``synthetic``."""
    return _on_ranks(cluster, request, _real_on_rank)


def _on_ranks(
    cluster: Cluster, request: BenchRequest, on_rank: Callable[[BenchRequest], Answer]
) -> BenchResult:
    """Call ``on_rank`` on every rank; rank 0's numbers (world-wide), or the first rank's error."""
    model_expr = request.model_expr
    if not isinstance(model_expr, str) or not model_expr.strip():
        raise DtworkError("give a model expression such as Net() (defined in a %%dtrain cell)")
    answers = cast("list[Answer]", cluster.run(on_rank, request))
    mine = [r for r in answers[: request.world] if r is not None]
    errors = [r["error"] for r in mine if "error" in r]
    if errors:
        loader_expr = request.loader.expr if request.loader is not None else None
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
    results = [r for r in mine if "error" not in r]
    return {
        **results[0],
        "comm_time": max(r["comm_time"] for r in results),
        "step_time": max(r["step_time"] for r in results),
    }


# -- arguments ------------------------------------------------------------------------------------


def in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    return get_ipython() is not None


def parse_shape(shape: Shape) -> tuple[int, ...] | None:
    """``--shape`` as a tuple: 3,32,32 (a string), 20 (an int) or a sequence from Python."""
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


def check_slots(cluster: Cluster, slots: Iterable[int] | None) -> list[int]:
    """The world sizes to sweep: ``slots`` checked against the cluster, else 1, 2, 4, ... and all ranks."""
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


def default_per_slot(cluster: Cluster) -> int:
    """The cluster's per-slot batch, or DEFAULT_PER_SLOT without a global batch."""
    return batch.per_slot(cluster.global_batch_size, cluster.world_size) or DEFAULT_PER_SLOT


def store_result(cluster: Cluster, kind: str, data: Mapping[str, object]) -> int | None:
    """Store a command's result in the current run; a store that cannot take it only says so."""
    try:
        session = cluster.session
        run_id = session.ensure_run()
        return session.store.add_result(run_id, kind, data)
    except DtworkError:
        raise
    except Exception as exc:  # the measurement stands even when the store cannot take it
        print(f"dtwork: could not store the {kind} result: {exc}")
        return None
