"""What a report notebook's cells import: its recorded data as rows, the figures and the analyses.

The exporter calls the same functions to fill those cells' outputs, so a re-run shows what the
exported notebook shows. Figures travel as plotly JSON (``application/vnd.plotly.v1+json``),
which JupyterLab renders, so that the notebook does not carry plotly.js.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeAlias, TypedDict, cast

from nbformat import NotebookNode
from nbformat.v4 import new_output

from dtwork import plots
from dtwork.analysis.gns import BatchAdvice, advise
from dtwork.analysis.scaling import ScalingResult
from dtwork.shared.records import Row, adaptive_decisions, batch_changes

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "PLOTLY_MIME",
    "Item",
    "LrSettings",
    "Recorded",
    "adaptive_trajectory",
    "advice",
    "analyses",
    "b_simple",
    "bundle",
    "figures",
    "outputs",
    "rows",
    "scaling",
    "show",
    "suggested_batch",
]

PLOTLY_MIME = "application/vnd.plotly.v1+json"

Item: TypeAlias = "str | go.Figure"  # a line of text or a plotly figure


class LrSettings(TypedDict):
    """The learning rate the batch-size advice scales, and its warmup steps."""

    base: float
    warmup: int


class RecordedResult(TypedDict):
    kind: str
    data: object  # the analysis result as it stored it (JSON)


class RecordedSegment(TypedDict):
    first_step: int
    cell_seq: int | None
    changed: list[str]


class Recorded(TypedDict):
    """What a report embeds as ``RECORDED`` (JSON): the run's shape, lr, results and metric rows."""

    run_id: int
    world_size: int
    global_batch_size: int | None
    lr: LrSettings
    results: list[RecordedResult]
    segments: list[RecordedSegment]
    columns: list[str]
    rows: list[list[object]]  # one list per row, in ``columns``' order


_made: list[tuple[list[list[object]], list[Row]]] = []  # the last rows made, with the lists they came from


def rows(data: Recorded) -> list[Row]:
    """The embedded metric rows as :mod:`dtwork.plots` takes them (read only: a report asks for them
    several times, and a 256-rank run embeds a few hundred thousand, so the last ones are kept)."""
    if _made and _made[0][0] is data["rows"]:  # the same list, held here: its id cannot be reused
        return _made[0][1]
    made = [cast("Row", dict(zip(data["columns"], r, strict=True))) for r in data["rows"]]
    _made[:] = [(data["rows"], made)]
    return made


def _last(data: Recorded, name: str) -> float | None:
    values = [r["value"] for r in rows(data) if r["rank"] is None and r["name"] == name]
    return values[-1] if values else None


def b_simple(data: Recorded) -> float | None:
    """The last B_simple = tr(Sigma)/|G|^2 recorded (None when not measured or not positive)."""
    b = _last(data, "b_simple")
    return b if b is not None and b > 0 else None


def scaling(data: Recorded) -> ScalingResult | None:
    """The run's latest scaling sweep (``%dtrain scaling`` stores one), if any."""
    for result in reversed(data.get("results", [])):
        with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):
            return ScalingResult.from_dict(result["data"])  # type: ignore[arg-type]
    return None


def advice(data: Recorded) -> BatchAdvice | None:
    """Batch-size advice from the last B_simple, as ``%dtrain gns`` gives it (None: not measured)."""
    b, lr = b_simple(data), data["lr"]
    if b is None:
        return None
    # the batch an optimizer step sees (B_big: every micro-batch of every rank), as %dtrain gns
    batch = int(_last(data, "b_big") or 0) or data["global_batch_size"] or data["world_size"]
    return advise(b, batch, data["world_size"], lr["base"], warmup_steps=lr["warmup"])


def suggested_batch(adv: BatchAdvice) -> int:
    """The candidate global batch closest (in ratio) to the critical batch."""
    return min(adv.candidates, key=lambda c: abs(math.log(c / adv.critical_batch)))


def figures(data: Recorded) -> list[Item]:
    """The dashboard's figures drawn from the recorded rows (GPU telemetry only when recorded)."""
    recorded = rows(data)
    starts = [seg["first_step"] for seg in data.get("segments", [])]  # each training cell's start
    out = [
        plots.mark_segments(plots.metrics_figure(recorded), starts),
        plots.throughput_figure(recorded),
        plots.step_time_figure(recorded),
    ]
    if any(r["kind"] == "gpu" for r in recorded):
        out.append(plots.gpu_figure(recorded))
    return out


def analyses(data: Recorded) -> list[Item]:
    """The scaling sweep and the gradient noise scale: a headline each, and their figures."""
    result, adv = scaling(data), advice(data)
    out: list[Item] = [result.headline() if result else "No scaling sweep was recorded for this run."]
    if result:
        out.append(plots.scaling_figure(result))
    out.append("\n".join(adv.summary()) if adv else "The gradient noise scale was not measured in this run.")
    if adv:
        out.append(plots.gns_figure(rows(data), adv.global_batch))
        out.append(plots.tradeoff_figure(b_simple(data), adv.global_batch))
    if trajectory := adaptive_trajectory(data):
        out.append("\n".join(["Adaptive batch (the decisions that changed it):", *trajectory]))
        out.append(plots.series_figure(plots.AdaptiveSeries().add(rows(data))))
    return out


def adaptive_trajectory(data: Recorded) -> list[str]:
    """One line per change of the adaptive batch: step, global batch = split, LR factor, efficiency."""
    out = []
    for step, v in batch_changes(adaptive_decisions(rows(data))):
        eff = f", efficiency {v['efficiency']:.2f}" if "efficiency" in v else ""
        out.append(
            f"  step {step}: global batch {v['global_batch']:.0f} = {v.get('per_slot_batch', 0):.0f} per slot x "
            f"{v.get('accumulation', 1):.0f} accumulated, LR x{v.get('lr_factor', 1):.3g}{eff}"
        )
    return out


def bundle(fig: go.Figure) -> dict[str, object]:
    """A figure's display data: plotly JSON for JupyterLab, its title for plain text."""
    return {PLOTLY_MIME: json.loads(fig.to_json()), "text/plain": fig.layout.title.text or "figure"}


def outputs(items: Iterable[Item]) -> list[NotebookNode]:
    """The cell outputs ``show(items)`` produces in a kernel: a stream per text run, a display per figure."""
    out: list[NotebookNode] = []
    for item in items:
        if not isinstance(item, str):
            out.append(new_output("display_data", data=bundle(item)))
        elif out and out[-1].output_type == "stream":
            out[-1].text += item + "\n"
        else:
            out.append(new_output("stream", name="stdout", text=item + "\n"))
    return out


def show(items: Iterable[Item]) -> None:
    """Print the texts and display the figures, in order."""
    from IPython.display import display

    for item in items:
        if isinstance(item, str):
            print(item)
        else:
            display(bundle(item), raw=True)
