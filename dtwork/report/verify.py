"""Verification: re-execute a written report and compare the re-run's metrics with the recorded ones.

The re-run records into its own store beside the report (``%dtrain start --store``), so the
comparison reads what the re-run really logged, step by step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_markdown_cell

from dtwork.report.build import RERUN_STORE, code_span, escape, now, table
from dtwork.shared.records import TRAINING_KINDS, Row
from dtwork.store.runs import RunStore

__all__ = ["VERIFY_TAG", "Verdict", "compare", "failure", "verify"]

VERIFY_TAG = "dtwork-verification"


@dataclass
class Verdict:
    """How closely a re-run matched: ``verified`` is None until a re-run was compared."""

    verified: bool | None = None
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    text: str = ""


def compare(recorded: Sequence[Row], rerun: Sequence[Row]) -> dict[str, float]:
    """Max |recorded - rerun| of every training metric at every recorded step: a step or a metric
    the re-run lacks, or a metric only the re-run logged, counts as inf. Timings (throughput, the
    scaling estimate) differ from run to run and are not compared."""
    old, new = _by_name(recorded), _by_name(rerun)
    diffs = {}
    for name, values in old.items():
        got = new.get(name, {})
        diffs[name] = max(
            (_gap(a, got[s]) if s in got else math.inf for s, a in values.items()), default=math.inf
        )
    diffs.update(dict.fromkeys(new.keys() - old.keys(), math.inf))
    return diffs


def _by_name(rows: Sequence[Row]) -> dict[str, dict[int, float | None]]:
    """The training metrics' values by name and step (the last written wins)."""
    out: dict[str, dict[int, float | None]] = {}
    for r in rows:
        if r.get("kind", "log") in TRAINING_KINDS:
            out.setdefault(r["name"], {})[r["step"]] = r["value"]
    return out


def _gap(a: float | None, b: float | None) -> float:
    """|a - b|, 0 for the same missing, NaN or infinite value, inf when only one is such a value."""
    if a is None or b is None:
        return 0.0 if a is b else math.inf
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf


def rerun(path: Path, timeout: float) -> tuple[Sequence[Row] | None, str]:
    """Execute the notebook in its folder (kernel python3); the re-run's metrics from its store."""
    from nbclient import NotebookClient

    store = path.with_name(path.stem + RERUN_STORE)
    before = None
    if store.exists():
        with RunStore(store, readonly=True) as s:
            before = s.latest_run_id()
    meta = {"metadata": {"path": str(path.parent)}}
    nb = nbformat.read(path, as_version=4)
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources=meta).execute()
    except Exception as exc:
        return None, failure(nb, exc)
    with RunStore(store, readonly=True) as s:
        rid = s.latest_run_id()
        return (None, "it recorded no run") if rid in (None, before) else (s.metrics(rid), "")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


def failure(nb: NotebookNode, exc: BaseException) -> str:
    """Which cell of the re-run failed (its number and first line) and with what: the error, and
    for a rank's failure the error under it ("NameError: name 'make_model' is not defined")."""
    value = _ANSI.sub("", str(getattr(exc, "evalue", exc)))
    lines = [line.strip() for line in value.splitlines() if line.strip()]
    said = f"{getattr(exc, 'ename', type(exc).__name__)}: {lines[0] if lines else ''}"
    cause = next((line for line in reversed(lines[1:]) if _ERROR_LINE.match(line)), None)
    if cause is not None and cause not in said:
        said += f" ({cause})"
    code = [c for c in nb.cells if c.cell_type == "code"]
    failed = next(
        (
            i
            for i, c in enumerate(code, 1)
            if any(o.get("output_type") == "error" for o in c.get("outputs", []))
        ),
        None,
    )
    if failed is None:
        return said
    body = [line.strip() for line in code[failed - 1].source.splitlines() if line.strip()]
    first = next((line for line in body if not line.startswith("%%")), body[0] if body else "")
    return f"code cell {failed} ({first[:60]}): {said}"


def verify(
    path: Path, recorded: Sequence[Row], timeout: float, tolerance: float
) -> tuple[Verdict, NotebookNode]:
    """Re-run the report at ``path``; the verdict, and the markdown cell that states it."""
    metrics, why = rerun(path, timeout)
    diffs = compare(recorded, metrics) if metrics is not None else {}
    worst = max(diffs.values(), default=math.inf)
    verified = bool(diffs) and worst <= tolerance
    verdict = "reproduced" if verified else "did NOT reproduce"
    text = (
        f"the re-run {verdict} the recorded metrics (max abs difference {worst:.3g}, tolerance {tolerance:g})"
        if metrics is not None
        else f"the re-run failed: {why}"
    )
    rows = table(
        [(escape(k), v) for k, v in sorted(diffs.items())],
        ("metric", "max abs difference over the common steps"),
    )
    cell: NotebookNode = new_markdown_cell(
        f"## Verification\n\nRe-executed headlessly on {now()} (kernel python3, store "
        f"{code_span(path.stem + RERUN_STORE)}): **{escape(text)}**.\n\n{rows if metrics else ''}",
        metadata={"tags": [VERIFY_TAG]},
    )
    return Verdict(verified, diffs, text), cell
