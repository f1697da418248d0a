"""The report notebook, built from the run store.

It opens with a header with a summary table, then the figures and analyses rebuilt by
:mod:`dtwork.report.helpers` from the recorded metrics (a collapsed data cell before them), the
events, the environment, and last the re-run: the config as YAML (folded), the run's ``%%dtrain``
cells between ``%dtrain start`` (same slots, backend and config; a store next to the report) and
``%dtrain stop``. Everything the user wrote (names, messages, errors, config values)
is scrubbed of secrets, and escaped wherever it lands in markdown: nbconvert keeps raw HTML there.
"""

from __future__ import annotations

import html
import json
import re
import shlex
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from dtwork import plots
from dtwork.errors import DtworkError
from dtwork.report import helpers
from dtwork.report.scrub import SCRUBBED, Scrubber
from dtwork.shared.records import CELL_SETTINGS, DIVERGED, CellSettings, divergence_text, is_own, segment_text
from dtwork.store.runs import RunStore

if TYPE_CHECKING:
    from dtwork.store.rows import CellRow, RunRow

__all__ = ["CONFIG_TAG", "DATA_TAG", "RERUN_STORE", "code_span", "escape", "notebook", "now", "table"]

RERUN_STORE = ".rerun.sqlite"  # the re-run's store: the report's stem + this, beside the report
DATA_TAG = "dtwork-data"  # the metrics cell: collapsed in JupyterLab, its source left out of the HTML
CONFIG_TAG = "dtwork-config"  # the cell writing the config: collapsed; the HTML folds it in <details>
COLUMNS = ["kind", "step", "rank", "name", "value", "time"]

FIGURES_CELL = """from dtwork.report import helpers

helpers.show(helpers.figures(RECORDED))"""
ANALYSIS_CELL = "helpers.show(helpers.analyses(RECORDED))"

_MARKDOWN = re.compile(r"([\\`*_\[\]|~$#!])")  # backslash-escaped: links, emphasis, tables, math


def escape(text: object) -> str:
    """``text`` as literal markdown on one line: HTML escaped, markdown syntax backslashed."""
    flat = " ".join(str(text).split())
    return _MARKDOWN.sub(r"\\\1", html.escape(flat, quote=True))


def code_span(text: object) -> str:
    """``text`` as an inline code span, which shows raw HTML as text; fenced past its own backticks."""
    flat = " ".join(str(text).split())
    fence = "`" * (max((len(r) for r in re.findall("`+", flat)), default=0) + 1)
    return (
        f"{fence} {flat} {fence}" if flat.startswith("`") or flat.endswith("`") else f"{fence}{flat}{fence}"
    )


def now() -> str:
    return datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def _plain(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value in (None, "") else str(value)


def _fmt(value: object) -> str:
    return escape(_plain(value))


def table(pairs: Sequence[tuple[str, object]], head: tuple[str, str] = ("", "")) -> str:
    """A two-column markdown table; keys are written as given (escape user-derived ones first)."""
    return "\n".join([f"| {head[0]} | {head[1]} |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in pairs])


def _summary(run: RunRow, data: helpers.Recorded, last: dict[str, float]) -> list[tuple[str, object]]:
    by_rank: dict[int, list[float]] = {}  # ranks report at their own steps: a median per rank, summed
    for r in helpers.rows(data):
        if r["rank"] is not None and r["name"] == "samples_per_s" and r["value"] is not None:
            by_rank.setdefault(r["rank"], []).append(r["value"])
    throughput = sum(statistics.median(v) for v in by_rank.values())
    eff = last.get(plots.EFFICIENCY_NAME)  # the live estimate, else the scaling sweep's
    if eff is None and (result := helpers.scaling(data)) is not None:
        eff = result.efficiencies().get(run["world_size"])
    adv = helpers.advice(data)
    users = {r["name"] for r in helpers.rows(data) if not is_own(r)}  # dtwork's measurements stay apart
    return [
        ("world size", f"{run['world_size']} ({run['backend']})"),
        ("per-slot batch", run["per_slot_batch_size"]),
        ("global batch", run["global_batch_size"]),
        ("throughput (samples/s, over all ranks)", throughput or None),
        ("scaling efficiency", f"{eff:.0%}" if isinstance(eff, (int, float)) else "not measured"),
        ("steps", run["last_step"]),
        *[(f"final {escape(k)}", v) for k, v in last.items() if k in users],
        ("B_simple", helpers.b_simple(data) or "not measured"),
        ("suggested global batch", helpers.suggested_batch(adv) if adv else "not measured"),
    ]


def _header(store: RunStore, run: RunRow, data: helpers.Recorded, title: str, version: object) -> str:
    started = datetime.fromtimestamp(run["created_at"]).astimezone().strftime("%Y-%m-%d %H:%M")
    return (
        f"# dtwork report: {escape(title)}\n\nRun **{run['id']}** ({escape(run['status'])}, started "
        f"{started}) from {code_span(store.path.name)}, exported {now()} by dtwork {escape(version or '')}.\n\n"
        + table(
            _summary(run, data, store.last_metrics(run["id"]))
            + _result_row(store, run)
            + _diverged_row(store, run),
            ("summary", ""),
        )
    )


def _diverged_row(store: RunStore, run: RunRow) -> list[tuple[str, object]]:
    """The run's first non-finite logged value, where it has one."""
    d = next((e["data"] for e in store.events(run["id"], DIVERGED)), None)
    return [] if d is None else [("diverged", escape(divergence_text(d).removeprefix("diverged ")))]


def _result_row(store: RunStore, run: RunRow) -> list[tuple[str, object]]:
    """The config's searcher.metric at its best, as Determined reports a trial's result."""
    from dtwork.store.results import run_result

    result = run_result(store, run)
    if result is None:
        return []
    best = "no value yet" if result["best"] is None else f"{result['best']:.6g} at step {result['step']}"
    return [
        (f"result: {'lowest' if result['smaller_is_better'] else 'highest'} {escape(result['metric'])}", best)
    ]


def _environment(env: Mapping[str, Any], seed: object) -> str:  # Any: the ranks' JSON
    gpus = [
        f"{g.get('name')} ({_plain(g.get('memory_total_mb'))} MB, driver {g.get('driver')})"
        for g in env.get("gpus") or []
    ]
    ranks = [f"{r.get('rank')}: {r.get('hostname')} {r.get('device') or ''}" for r in env.get("ranks") or []]
    pairs = [
        (k, env.get(k.lower()))
        for k in ("dtwork", "torch", "ipyparallel", "numpy", "Python", "platform", "backend")
    ]
    pairs += [("devices", "; ".join(gpus) or "CPU (no GPU)"), ("hosts", ", ".join(env.get("hosts") or []))]
    return "## Environment\n\n" + table(
        [*pairs, ("ranks", "; ".join(ranks)), ("seed", seed)], ("", "at the run's start")
    )


def _config(run: RunRow, scrub: Scrubber) -> tuple[dict[str, object], str, helpers.LrSettings]:
    """The config scrubbed, as a dict and as YAML that ``load_config`` reads back; its lr settings."""
    from dtwork.config import load_config

    cfg = load_config(run["config_yaml"] or None)
    config = scrub.data(cfg.to_dict(), "config")
    lr: helpers.LrSettings = {"base": cfg.effective_lr(), "warmup": cfg.lr.warmup}
    try:
        return config, load_config(config).to_yaml(), lr
    except DtworkError:
        return config, yaml.safe_dump(config, sort_keys=False), lr


def _cell_settings(store: RunStore, run_id: int) -> dict[int, CellSettings]:
    """What each cell ran with (its options, optimizers, GNS), by cell, as the session recorded it."""
    return {int(r["data"]["seq"]): r["data"] for r in store.results(run_id, CELL_SETTINGS)}


def _optimizer_lr(settings: Mapping[int, CellSettings]) -> float | None:
    """The learning rate of the newest optimizer's first parameter group as the last cell left it."""
    for _, s in sorted(settings.items(), reverse=True):
        groups = s["optimizers"][-1]["groups"] if s.get("optimizers") else []
        lr = groups[0].get("lr") if groups else None
        if isinstance(lr, (int, float)):
            return float(lr)
    return None


def _segments(segs: Sequence[helpers.RecordedSegment]) -> str:
    """Where each training cell began on the run's one step axis (marked on the metrics figure)."""
    if len(segs) < 2:
        return ""
    items = "\n".join(f"- {escape(segment_text(seg))}" for seg in segs)
    return f"\n\n### Segments\n\nEach training cell went on with the run's steps (dotted lines on the metrics figure):\n\n{items}"


def _what_ran(settings: Mapping[int, CellSettings]) -> str:
    """The effective settings of each cell that trained: the config may say otherwise (a cell can
    pass ``gns=True`` to ``ctx.wrap``, or make its optimizer with its own learning rate)."""
    rows = []
    for seq, s in sorted(settings.items()):
        if not s.get("optimizers") and not s.get("models") and not s.get("calls"):
            continue
        gns = ", ".join("on" if m.get("gns") else "off" for m in s.get("models", [])) or "no wrapped model"
        opts = "; ".join(
            f"{o['class']} "
            + " / ".join(", ".join(f"{k} {_plain(v)}" for k, v in g.items()) for g in o["groups"])
            for o in s.get("optimizers", [])
        )
        calls = "; ".join(
            f"{helper}({', '.join(f'{k}={_plain(v)}' for k, v in args.items())})"
            for helper, args in (s.get("calls") or {}).items()
        )
        text = f"GNS {gns}; {opts or 'no optimizer'}" + (f"; {calls}" if calls else "")
        rows.append((f"cell {seq}", escape(text)))
    return "## What ran\n\n" + (table(rows, ("", "as the cell left it")) if rows else "No cell trained.")


def _rerun_cells(
    store: RunStore,
    run: RunRow,
    cells: Sequence[CellRow],
    path: Path,
    scrub: Scrubber,
    config: Mapping[str, object],
    text: str,
) -> list[NotebookNode]:
    """``%%writefile`` the config, ``%dtrain start`` as the run did, its cells, ``%dtrain stop``."""
    yaml_name, store_name = shlex.quote(f"{path.stem}.yaml"), shlex.quote(path.stem + RERUN_STORE)
    start = f"%dtrain start -n {run['world_size']} --backend {run['backend']} --config {yaml_name}"
    if run["global_batch_size"] and not config.get("global_batch_size"):
        start += f" --global-batch-size {run['global_batch_size']}"
    lines = text.count("\n") + 1
    folded = (  # built as HTML, escaped: the YAML holds the user's values
        f"<details><summary>The config as recorded ({lines} lines)</summary>\n"
        f"<pre>{html.escape(text)}</pre>\n</details>"
    )
    out = [
        new_markdown_cell(
            "## Re-run\n\nThe cells below re-run the run: the first (collapsed) writes the config beside "
            f"this notebook.\n\n{folded}"
        ),
        new_code_cell(
            f"%%writefile {yaml_name}\n{text}",
            metadata={"jupyter": {"source_hidden": True}, "tags": [CONFIG_TAG]},
        ),
        new_code_cell(f"%load_ext dtwork\n{start} --store {store_name}"),
    ]
    settings = {run["id"]: _cell_settings(store, run["id"])}
    earlier = {c["run_id"] for c in cells} - {run["id"]}
    if earlier:  # a new model began this run mid-notebook: what came before it is re-run too
        runs = ", ".join(map(str, sorted(earlier)))
        out.append(
            new_markdown_cell(f"The first cells below are run(s) {runs}'s: they set up what this run used.")
        )
    for cell in cells:
        if cell["run_id"] not in settings:
            settings[cell["run_id"]] = _cell_settings(store, cell["run_id"])
        ran = settings[cell["run_id"]].get(cell["seq"], {})
        flags = f" --ranks {','.join(map(str, cell['ranks']))}" if cell["ranks"] is not None else ""
        flags += " --rank0" if ran.get("rank0") else ""  # the cell's options, kept
        meta: dict[str, object] = {
            "dtwork": {"run": cell["run_id"], "seq": cell["seq"], "status": cell["status"]}
        }
        if cell["status"] not in ("ok", "running", None):  # nbclient goes on past a tagged cell
            meta["tags"] = ["raises-exception"]
            error = scrub.text(cell["error"] or "", f"cell {cell['seq']} error")
            out.append(
                new_markdown_cell(
                    f"Cell {cell['seq']} ended **{escape(cell['status'])}** in the run: {code_span(error)}"
                )
            )
        source = scrub.text(cell["source"] or "", f"cell {cell['seq']}")
        out.append(new_code_cell(f"%%dtrain{flags}\n{source}", metadata=meta))
    return [*out, new_code_cell("%dtrain stop")]


def _data_cell(data: helpers.Recorded) -> NotebookNode:
    """``RECORDED = json.loads(...)``: one metric row per line, floats exact."""
    head = json.dumps({k: v for k, v in data.items() if k != "rows"})[:-1] + ', "rows": ['
    lines = [json.dumps(r) + "," for r in data["rows"]]
    lines[-1:] = [lines[-1][:-1]] if lines else []
    body = "\n".join(f"    {p!r}" for p in [head, *lines, "]}"])
    meta = {"jupyter": {"source_hidden": True}, "tags": [DATA_TAG]}
    cell: NotebookNode = new_code_cell(f"import json\n\nRECORDED = json.loads(\n{body}\n)", metadata=meta)
    return cell


def _recorded(store: RunStore, run: RunRow, lr: helpers.LrSettings) -> helpers.Recorded:
    """What the report embeds as ``RECORDED``: the run's shape, lr, results and every metric row."""
    rid = run["id"]
    return {
        "run_id": rid,
        "world_size": run["world_size"],
        "global_batch_size": run["global_batch_size"],
        "lr": lr,
        "results": [{"kind": r["kind"], "data": r["data"]} for r in store.results(rid)],
        "segments": [
            {"first_step": seg["first_step"], "cell_seq": seg["cell_seq"], "changed": seg["changed"]}
            for seg in store.segments(rid)
        ],
        "columns": COLUMNS,
        "rows": [_in_columns(r) for r in store.figure_rows(rid)],  # a long run's: its rollups
    }


def _in_columns(row: Mapping[str, object]) -> list[object]:
    return [row[c] for c in COLUMNS]


def _code_cell(source: str, items: list[helpers.Item]) -> NotebookNode:
    cell: NotebookNode = new_code_cell(source, outputs=helpers.outputs(items))
    return cell


def notebook(store: RunStore, run_id: int, path: Path, scrub: Scrubber) -> NotebookNode:
    """The report of run ``run_id``, to be written at ``path``; figure and analysis outputs filled in."""
    run, env = store.get_run(run_id), scrub.data(store.environment(run_id), "environment")
    config, config_yaml, lr = _config(run, scrub)
    settings = _cell_settings(store, run_id)
    lr["base"] = _optimizer_lr(settings) or lr["base"]  # the advice scales what the optimizer used
    cells = store.history(run_id) + store.cells(run_id)
    rerun = _rerun_cells(store, run, cells, path, scrub, config, config_yaml)
    events = [
        (escape(e["kind"]), scrub.text(e["message"] or "", f"event {e['id']}")) for e in store.events(run_id)
    ]
    title = scrub.text(run["name"] or f"run {run_id}", "run name")
    data = _recorded(store, run, lr)
    nb: NotebookNode = new_notebook(
        metadata={"dtwork": {"run_id": run_id}, "title": f"dtwork report: {title}"}
    )
    # What a reader looks for first (summary, figures) leads; the config and the re-run come last.
    nb.cells = [
        new_markdown_cell(_header(store, run, data, title, env.get("dtwork"))),
        new_markdown_cell(
            "## Figures\n\nDrawn by `dtwork.plots` from `RECORDED`, as the live dashboard drew them. "
            "`RECORDED` holds the metrics as stored during the run (`rank` null: aggregated over ranks); "
            "its cell is collapsed, and left out of the HTML."
        ),
        _data_cell(data),
        _code_cell(FIGURES_CELL, helpers.figures(data)),
        new_markdown_cell("## Analyses: scaling and gradient noise scale"),
        _code_cell(ANALYSIS_CELL, helpers.analyses(data)),
        new_markdown_cell("## Events\n\n" + (table(events, ("kind", "message")) if events else "None.")),
        new_markdown_cell(_environment(env, config["seed"])),
        new_markdown_cell(_what_ran(settings) + _segments(data["segments"])),
        *rerun,
    ]
    items = "\n".join(f"- {code_span(f)}" for f in scrub.found) or "- nothing looked like a secret"
    nb.cells.append(
        new_markdown_cell(f"## Secrets\n\nReplaced by `{SCRUBBED}` (use your own to re-run):\n\n{items}")
    )
    return nb
