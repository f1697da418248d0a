"""Export a run as a notebook that someone else can read and re-run (+ standalone HTML).

The notebook holds a header with a summary table, the environment, the config as YAML, the run's
``%%dtrain`` cells between ``%dtrain start`` (same slots, backend and config; a store next to the
report) and ``%dtrain stop``, the recorded metrics as data, and the figures and analyses rebuilt
from that data by :mod:`dtwork.plots` (the dashboard's own functions). Secrets are scrubbed first
and the report says where (never the values). ``verify=True`` re-executes the notebook with
nbclient and compares the re-run's metrics, read from the re-run's store, with the recorded ones.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shlex
import statistics
import sys
import tempfile
import types
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import nbformat
import yaml
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from dtwork import plots
from dtwork.analysis.gns import BatchAdvice, advise
from dtwork.analysis.scaling import ScalingResult
from dtwork.errors import DtworkError
from dtwork.store import RunStore, default_store_path

__all__ = ["Report", "Scrubber", "advice", "b_simple", "compare", "export", "rows", "scaling", "show"]

SCRUBBED = "<scrubbed>"
RERUN_STORE = ".rerun.sqlite"  # the re-run's store: the report's stem + this, beside the report
VERIFY_TAG = "dtwork-verification"
DATA_TAG = "dtwork-data"  # the metrics cell: collapsed in JupyterLab, its source left out of the HTML
_ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_WORD = r"token(?!iz)|secret|passw(?:or)?d|pwd|credential|auth(?!or)|api_?key|access_?key|private_?key"
_SECRET_KEY = re.compile(rf"(?i)(?:{_WORD})|(?:^|[_.-])keys?$")
_TOKEN = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|hf_[A-Za-z0-9]{20,}|sk-[\w-]{20,}"
    r"|xox[abprs]-[\w-]{10,}|glpat-[\w-]{20,}|AKIA[0-9A-Z]{16})"
)
_ASSIGNED = (  # NAME = "quoted" or NAME=LongBareValue, NAME secret-looking; then any *key = long value
    re.compile(
        rf"(?i)\b(?P<name>[\w.-]*(?:{_WORD})[\w.-]*)['\"]?\s*[:=]\s*"
        r"(?:(?P<q>['\"])(?P<v>[^'\"\n]+)(?P=q)|(?P<b>[A-Za-z0-9+/_-]{8,}={0,2})(?![\w(.\[]))"
    ),
    re.compile(
        r"(?i)\b(?P<name>[\w.-]*key)['\"]?\s*[:=]\s*['\"]?(?P<b>[A-Za-z0-9+/_-]{16,}={0,2})(?![\w(.\[])"
    ),
)


@dataclass
class Report:
    """What :func:`export` wrote; ``verified`` stays None unless asked to verify."""

    path: Path
    html_path: Path | None
    run_id: int
    scrubbed: list[str] = field(default_factory=list)
    verified: bool | None = None
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    verification: str = ""

    def describe(self) -> str:
        """One line for the ``%dtrain report`` magic."""
        html = f" and {self.html_path.name}" if self.html_path else ""
        scrubbed = f"; scrubbed {len(self.scrubbed)} secret(s)" if self.scrubbed else ""
        checked = f"; {self.verification}" if self.verification else ""
        return f"dtwork: wrote run {self.run_id}'s report to {self.path}{html}{scrubbed}{checked}"


class Scrubber:
    """Replace secrets by ``<scrubbed>``; ``found`` says where and what kind, never the value.

    Scrubbed: values under secret-looking keys; token shapes (``ghp_``, ``hf_``, ``sk-`` ...);
    quoted or long values assigned to secret-looking names; any text equal to the current value
    (8+ characters) of an environment variable named like KEY|TOKEN|SECRET|PASSWORD|AUTH.
    """

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        pairs = [(v, k) for k, v in env.items() if _ENV_NAME.search(k) and len(v.strip()) >= 8]
        self._env = sorted(pairs, key=lambda p: -len(p[0]))
        self.found: list[str] = []

    def _note(self, place: str, what: str) -> str:
        if f"{place}: {what}" not in self.found:
            self.found.append(f"{place}: {what}")
        return SCRUBBED

    def text(self, text: str, place: str) -> str:
        for value, name in self._env:
            if value in text:
                text = text.replace(value, self._note(place, f"the value of ${name}"))
        text = _TOKEN.sub(lambda m: self._note(place, "a token"), text)
        for pattern in _ASSIGNED:
            text = pattern.sub(lambda m: self._value(m, place), text)
        return text

    def _value(self, m: re.Match[str], place: str) -> str:
        group = "v" if m.groupdict().get("v") else "b"
        if m[group] == SCRUBBED:
            return m[0]
        (a, b), s = m.span(group), m.start()
        return m[0][: a - s] + self._note(place, f"a secret assigned to {m['name']}") + m[0][b - s :]

    def data(self, value: Any, place: str) -> Any:
        """Scrub a JSON-like value: leaves under secret-looking keys go whole, strings by :meth:`text`."""
        if isinstance(value, dict):
            return {k: self._item(k, v, f"{place}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [self.data(v, f"{place}[{i}]") for i, v in enumerate(value)]
        return self.text(value, place) if isinstance(value, str) else value

    def _item(self, key: Any, value: Any, place: str) -> Any:
        leaf = value is not None and not isinstance(value, (bool, dict, list))
        if leaf and isinstance(key, str) and _SECRET_KEY.search(key) and value != SCRUBBED:
            return self._note(place, "a secret-named setting")
        return self.data(value, place)


# -- what the report's cells call (export runs the same cells to make their outputs) -------------

_sink: tuple[list[Any], io.StringIO] | None = None  # (outputs, stdout) while export runs a cell
_js_sent = False


def show(fig: Any) -> None:
    """Display a plotly figure that renders offline: plotly.js is inlined with the first one."""
    global _js_sent
    html = fig.to_html(full_html=False, include_plotlyjs=not _js_sent)
    if not _js_sent:  # the UMD bundle must set window.Plotly even where require.js defines `define`
        html = f"<script>window._dtDefine = window.define; window.define = undefined;</script>{html}"
        html += "<script>window.define = window._dtDefine;</script>"
    _js_sent = True
    plotly_json = json.loads(fig.to_json())
    bundle = {
        "text/html": html,
        "application/vnd.plotly.v1+json": plotly_json,
        "text/plain": fig.layout.title.text or "figure",
    }
    if _sink is None:
        from IPython.display import display

        return display(bundle, raw=True)
    _flush(*_sink)
    _sink[0].append(new_output("display_data", data=bundle))


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The embedded metric rows as :mod:`dtwork.plots` takes them."""
    return [dict(zip(data["columns"], r, strict=True)) for r in data["rows"]]


def _last(data: dict[str, Any], name: str) -> float | None:
    values = [r["value"] for r in rows(data) if r["rank"] is None and r["name"] == name]
    return values[-1] if values else None


def b_simple(data: dict[str, Any]) -> float | None:
    """The last B_simple = tr(Sigma)/|G|^2 recorded (None when not measured or not positive)."""
    b = _last(data, "b_simple")
    return b if b is not None and b > 0 else None


def scaling(data: dict[str, Any]) -> ScalingResult | None:
    """The run's latest scaling sweep (``%dtrain scaling`` stores one), if any."""
    for result in reversed(data.get("results", [])):
        with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):
            return ScalingResult.from_dict(result["data"])
    return None


def advice(data: dict[str, Any]) -> BatchAdvice | None:
    """Batch-size advice from the last B_simple, as ``%dtrain gns`` gives it (None: not measured)."""
    b, lr = b_simple(data), data["lr"]
    if b is None:
        return None
    batch = data["global_batch_size"] or int(_last(data, "b_big") or data["world_size"])
    return advise(b, batch, data["world_size"], lr["base"], warmup_steps=lr["warmup"])


def suggested_batch(adv: BatchAdvice) -> int:
    """The candidate global batch closest (in ratio) to the critical batch."""
    return min(adv.candidates, key=lambda c: abs(math.log(c / adv.critical_batch)))


FIGURES_CELL = """import dtwork.report as report
from dtwork import plots

rows = report.rows(RECORDED)
for fig in (plots.metrics_figure(rows), plots.throughput_figure(rows), plots.step_time_figure(rows)):
    report.show(fig)
if any(r["kind"] == "gpu" for r in rows):
    report.show(plots.gpu_figure(rows))"""
ANALYSIS_CELL = """result, advice = report.scaling(RECORDED), report.advice(RECORDED)
print(result.headline() if result else "No scaling sweep was recorded for this run.")
if result:
    report.show(plots.scaling_figure(result))
print("\\n".join(advice.summary()) if advice else "The gradient noise scale was not measured in this run.")
if advice:
    report.show(plots.gns_figure(rows, advice.global_batch))
    report.show(plots.tradeoff_figure(report.b_simple(RECORDED), advice.global_batch))"""


def _flush(outputs: list[Any], buf: io.StringIO) -> None:
    if buf.getvalue():
        outputs.append(new_output("stream", name="stdout", text=buf.getvalue()))
        buf.seek(0)
        buf.truncate()


def _run_cell(source: str, ns: dict[str, Any]) -> Any:
    """A code cell of ``source`` holding the outputs it produces when run (here, in-process)."""
    global _sink
    outputs: list[Any] = []
    _sink = (outputs, io.StringIO())
    try:
        with contextlib.redirect_stdout(_sink[1]):
            exec(source, ns)
        _flush(*_sink)
    finally:
        _sink = None
    return new_code_cell(source, outputs=outputs)


# -- the notebook --------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value in (None, "") else str(value).replace("|", "/").replace("\n", " ")


def _table(pairs: list[tuple[Any, Any]], head: tuple[str, str] = ("", "")) -> str:
    return "\n".join([f"| {head[0]} | {head[1]} |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in pairs])


def _summary(run: dict[str, Any], data: dict[str, Any], last: dict[str, float]) -> list[tuple[str, Any]]:
    by_rank: dict[int, list[float]] = {}  # ranks report at their own steps: a median per rank, summed
    for r in rows(data):
        if r["rank"] is not None and r["name"] == "samples_per_s":
            by_rank.setdefault(r["rank"], []).append(r["value"])
    throughput = run["summary"].get("throughput") or sum(statistics.median(v) for v in by_rank.values())
    eff = run["summary"].get("scaling_efficiency")
    if eff is None and (result := scaling(data)) is not None:
        eff = result.efficiencies().get(run["world_size"])
    adv = advice(data)
    return [
        ("world size", f"{run['world_size']} ({run['backend']})"),
        ("per-slot batch", run["per_slot_batch_size"]),
        ("global batch", run["global_batch_size"]),
        ("throughput (samples/s, over all ranks)", throughput or None),
        ("scaling efficiency", f"{eff:.0%}" if isinstance(eff, (int, float)) else "not measured"),
        ("steps", run["last_step"]),
        *[(f"final {k}", v) for k, v in last.items() if k not in plots.GNS_NAMES],
        ("B_simple", b_simple(data) or "not measured"),
        ("suggested global batch", suggested_batch(adv) if adv else "not measured"),
    ]


def _header(store: RunStore, run: dict[str, Any], data: dict[str, Any], title: str, version: Any) -> str:
    started = datetime.fromtimestamp(run["created_at"]).astimezone().strftime("%Y-%m-%d %H:%M")
    return (
        f"# dtwork report: {title}\n\nRun **{run['id']}** ({run['status']}, started {started}) from "
        f"`{store.path.name}`, exported {_now()} by dtwork {version or ''}.\n\n"
        + _table(_summary(run, data, store.last_metrics(run["id"])), ("summary", ""))
    )


def _environment(env: dict[str, Any], seed: Any) -> str:
    gpus = [
        f"{g.get('name')} ({_fmt(g.get('memory_total_mb'))} MB, driver {g.get('driver')})"
        for g in env.get("gpus") or []
    ]
    ranks = [f"{r.get('rank')}: {r.get('hostname')} {r.get('device') or ''}" for r in env.get("ranks") or []]
    pairs = [
        (k, env.get(k.lower()))
        for k in ("dtwork", "torch", "ipyparallel", "numpy", "Python", "platform", "backend")
    ]
    pairs += [("devices", "; ".join(gpus) or "CPU (no GPU)"), ("hosts", ", ".join(env.get("hosts") or []))]
    return "## Environment\n\n" + _table(
        [*pairs, ("ranks", "; ".join(ranks)), ("seed", seed)], ("", "at the run's start")
    )


def _config(run: dict[str, Any], scrub: Scrubber) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The config scrubbed, as a dict and as YAML that ``load_config`` reads back; its lr settings."""
    from dtwork.config import load_config

    cfg = load_config(run["config_yaml"] or None)
    config = scrub.data(cfg.to_dict(), "config")
    lr = {"base": cfg.effective_lr(), "warmup": cfg.lr.warmup}
    try:
        return config, load_config(config).to_yaml(), lr
    except DtworkError:
        return config, yaml.safe_dump(config, sort_keys=False), lr


def _rerun_cells(
    run: dict[str, Any], cells: list[Any], path: Path, scrub: Scrubber, config: Any, text: str
) -> list[Any]:
    """``%%writefile`` the config, ``%dtrain start`` as the run did, its cells, ``%dtrain stop``."""
    yaml_name, store_name = shlex.quote(f"{path.stem}.yaml"), shlex.quote(path.stem + RERUN_STORE)
    start = f"%dtrain start -n {run['world_size']} --backend {run['backend']} --config {yaml_name}"
    if run["global_batch_size"] and not config.get("global_batch_size"):
        start += f" --global-batch-size {run['global_batch_size']}"
    out = [
        new_markdown_cell(
            "## Re-run\n\nThe config as recorded; the next cell writes it beside this notebook."
        ),
        new_code_cell(f"%%writefile {yaml_name}\n{text}"),
        new_code_cell(f"%load_ext dtwork\n{start} --store {store_name}"),
    ]
    for cell in cells:
        flags = f" --ranks {','.join(map(str, cell['ranks']))}" if cell["ranks"] is not None else ""
        meta: dict[str, Any] = {"dtwork": {"seq": cell["seq"], "status": cell["status"]}}
        if cell["status"] not in ("ok", "running", None):  # nbclient goes on past a tagged cell
            meta["tags"] = ["raises-exception"]
            error = scrub.text(cell["error"] or "", f"cell {cell['seq']} error")
            out.append(
                new_markdown_cell(f"Cell {cell['seq']} ended **{cell['status']}** in the run: `{error}`")
            )
        source = scrub.text(cell["source"] or "", f"cell {cell['seq']}")
        out.append(new_code_cell(f"%%dtrain{flags}\n{source}", metadata=meta))
    return [*out, new_code_cell("%dtrain stop")]


def _data_cell(data: dict[str, Any]) -> Any:
    """``RECORDED = json.loads(...)``: one metric row per line, floats exact."""
    head = json.dumps({k: v for k, v in data.items() if k != "rows"})[:-1] + ', "rows": ['
    lines = [json.dumps(r) + "," for r in data["rows"]]
    lines[-1:] = [lines[-1][:-1]] if lines else []
    body = "\n".join(f"    {p!r}" for p in [head, *lines, "]}"])
    meta = {"jupyter": {"source_hidden": True}, "tags": [DATA_TAG]}
    return new_code_cell(f"import json\n\nRECORDED = json.loads(\n{body}\n)", metadata=meta)


def _notebook(store: RunStore, run_id: int, path: Path, scrub: Scrubber) -> Any:
    """The report; figure and analysis outputs come from running those cells here."""
    global _js_sent
    run, env = store.get_run(run_id), scrub.data(store.environment(run_id), "environment")
    config, config_yaml, lr = _config(run, scrub)
    rerun = _rerun_cells(run, store.cells(run_id), path, scrub, config, config_yaml)
    events = [(e["kind"], scrub.text(e["message"] or "", f"event {e['id']}")) for e in store.events(run_id)]
    title = scrub.text(run["name"] or f"run {run_id}", "run name")
    data = {"run_id": run_id, "world_size": run["world_size"], "global_batch_size": run["global_batch_size"]}
    data["lr"] = lr
    data["results"] = [{"kind": r["kind"], "data": r["data"]} for r in store.results(run_id)]
    data["columns"] = ["kind", "step", "rank", "name", "value", "time"]
    data["rows"] = [[r[c] for c in data["columns"]] for r in store.metrics(run_id, rank="all")]
    ns: dict[str, Any] = {"RECORDED": data}
    _js_sent = False
    nb = new_notebook(metadata={"dtwork": {"run_id": run_id}, "title": f"dtwork report: {title}"})
    nb.cells = [
        new_markdown_cell(_header(store, run, data, title, env.get("dtwork"))),
        new_markdown_cell(_environment(env, config["seed"])),
        *rerun,
        new_markdown_cell(
            "## Recorded metrics\n\nAs stored during the run (`rank` null: aggregated over ranks); "
            "the cell is collapsed, and left out of the HTML."
        ),
        _data_cell(data),
        new_markdown_cell(
            "## Figures\n\nDrawn by `dtwork.plots` from `RECORDED`, as the live dashboard drew them."
        ),
        _run_cell(FIGURES_CELL, ns),
        new_markdown_cell("## Analyses: scaling and gradient noise scale"),
        _run_cell(ANALYSIS_CELL, ns),
        new_markdown_cell("## Events\n\n" + (_table(events, ("kind", "message")) if events else "None.")),
    ]
    items = "\n".join(f"- {f}" for f in scrub.found) or "- nothing looked like a secret"
    nb.cells.append(
        new_markdown_cell(f"## Secrets\n\nReplaced by `{SCRUBBED}` (use your own to re-run):\n\n{items}")
    )
    return nb


# -- writing and verifying -----------------------------------------------------------------------


def _now() -> str:
    return datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def _target(path: Any, run_id: int) -> Path:
    """Check the target before anything is written; only a missing ``reports/`` folder is created."""
    default = Path.cwd() / "reports" / f"run-{run_id}.ipynb"
    target = default if path is None else Path(os.fspath(path)).expanduser().absolute()
    folder = target.parent
    if target.suffix != ".ipynb":
        raise DtworkError(f"the report path must end with .ipynb, got {target.name!r}")
    if target.is_dir():
        raise DtworkError(f"{target} is a folder: give a file name ending with .ipynb")
    creatable = folder.name == "reports" and folder.parent.is_dir() and os.access(folder.parent, os.W_OK)
    if not folder.is_dir() and not creatable:
        raise DtworkError(f"cannot write {target.name}: the folder {folder} does not exist; create it first")
    if folder.is_dir() and not os.access(folder, os.W_OK):
        raise DtworkError(f"cannot write {target.name}: the folder {folder} is not writable")
    return target


def _write(path: Path, text: str) -> None:
    """Write atomically: a temp file in the target's folder, then ``os.replace``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _html(nb: Any) -> str:
    """Standalone HTML: plotly.js is inline in the outputs; the template's CDN scripts are dropped."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    config = Config({"TagRemovePreprocessor": {"enabled": True, "remove_input_tags": [DATA_TAG]}})
    body, _ = HTMLExporter(config=config, require_js_url="", mathjax_url="").from_notebook_node(nb)
    return body.replace('<script src=""></script>', "")


def compare(recorded: list[dict[str, Any]], rerun: list[dict[str, Any]]) -> dict[str, float]:
    """Max |recorded - rerun| of each metric over the steps both have (inf: no step in common)."""
    new: dict[str, dict[int, float | None]] = {}
    for r in rerun:
        new.setdefault(r["name"], {})[r["step"]] = r["value"]
    old: dict[str, dict[int, float | None]] = {}
    for r in recorded:
        old.setdefault(r["name"], {})[r["step"]] = r["value"]
    diffs = {}
    for name, values in old.items():
        pairs = [(a, new[name][s]) for s, a in values.items() if s in new.get(name, {})]
        gaps = [
            abs(a - b) if a is not None and b is not None else 0.0 if a is b else math.inf for a, b in pairs
        ]
        diffs[name] = max(gaps, default=math.inf)
    return diffs


def _rerun(path: Path, timeout: float) -> tuple[list[dict[str, Any]] | None, str]:
    """Execute the notebook in its folder (kernel python3); the re-run's metrics from its store."""
    from nbclient import NotebookClient

    store = path.with_name(path.stem + RERUN_STORE)
    before = None
    if store.exists():
        with RunStore(store, readonly=True) as s:
            before = s.latest_run_id()
    meta = {"metadata": {"path": str(path.parent)}}
    try:
        NotebookClient(
            nbformat.read(path, as_version=4), timeout=timeout, kernel_name="python3", resources=meta
        ).execute()
    except Exception as exc:
        return (
            None,
            f"{getattr(exc, 'ename', type(exc).__name__)}: {getattr(exc, 'evalue', exc)}".splitlines()[0],
        )
    with RunStore(store, readonly=True) as s:
        rid = s.latest_run_id()
        return (None, "it recorded no run") if rid in (None, before) else (s.metrics(rid), "")


def _verify(report: Report, recorded: list[dict[str, Any]], timeout: float, tolerance: float) -> Any:
    """Re-run, fill ``report``'s verdict, and return the markdown cell that states it."""
    metrics, why = _rerun(report.path, timeout)
    report.max_abs_diff = compare(recorded, metrics) if metrics is not None else {}
    worst = max(report.max_abs_diff.values(), default=math.inf)
    report.verified = bool(report.max_abs_diff) and worst <= tolerance
    verdict = "reproduced" if report.verified else "did NOT reproduce"
    report.verification = (
        f"the re-run {verdict} the recorded metrics (max abs difference {worst:.3g}, tolerance {tolerance:g})"
        if metrics is not None
        else f"the re-run failed: {why}"
    )
    table = _table(
        sorted(report.max_abs_diff.items()), ("metric", "max abs difference over the common steps")
    )
    return new_markdown_cell(
        f"## Verification\n\nRe-executed headlessly on {_now()} (kernel python3, store "
        f"`{report.path.stem}{RERUN_STORE}`): **{report.verification}**.\n\n{table if metrics else ''}",
        metadata={"tags": [VERIFY_TAG]},
    )


def export(
    run_id: int | str | None = None,
    path: str | os.PathLike[str] | None = None,
    *,
    store: str | os.PathLike[str] | None = None,
    html: bool = False,
    verify: bool = False,
    timeout: float = 900.0,
    tolerance: float = 1e-6,
) -> Report:
    """Write run ``run_id`` (default: the latest) to ``path`` (default ``reports/run-<id>.ipynb``).

    ``html`` also writes the ``.html`` beside it (nbconvert, plotly.js inline). ``verify``
    re-executes the notebook (nbclient, ``timeout`` s per cell, cwd = its folder) and appends how
    closely the re-run matched (``tolerance``: the largest difference that counts as reproduced).
    Bad input raises a one-line ``DtworkError`` before anything is written.
    """
    with RunStore(store if store is not None else default_store_path(), readonly=True) as s:
        rid = s.latest_run_id() if run_id is None else s.get_run(run_id)["id"]
        if rid is None:
            raise DtworkError(f"no runs in {s.path}: run a %%dtrain cell first")
        if not s.cells(rid):
            raise DtworkError(f"run {rid} has no cells: nothing to export; run a %%dtrain cell in it first")
        target, scrub = _target(path, rid), Scrubber()
        nb, recorded = _notebook(s, rid, target, scrub), s.metrics(rid)
    target.parent.mkdir(exist_ok=True)
    _write(target, nbformat.writes(nb))
    report = Report(target, None, rid, list(scrub.found))
    if verify:
        nb.cells.append(_verify(report, recorded, timeout, tolerance))
        _write(target, nbformat.writes(nb))
    if html:
        report.html_path = target.with_suffix(".html")
        _write(report.html_path, _html(nb))
    return report


class _CallableModule(types.ModuleType):
    """Importing this submodule rebinds ``dtwork.report`` (the package's function) to the module:
    a callable module keeps ``dtwork.report(run_id, path, ...)`` working."""

    def __call__(self, run_id: int | str | None = None, path: Any = None, **kwargs: Any) -> Report:
        return export(run_id, path, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
