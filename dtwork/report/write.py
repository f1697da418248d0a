"""Export: check the target, build the notebook, write it atomically, verify it, render the HTML.

Exports run one at a time per process (a double click in the sidebar asks twice): each keeps its
state in its own objects, and the lock keeps two of them from writing the same report at once.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from dtwork.errors import DtworkError
from dtwork.report.build import CONFIG_TAG, DATA_TAG, notebook
from dtwork.report.helpers import PLOTLY_MIME
from dtwork.report.scrub import Scrubber
from dtwork.report.verify import verify as rerun_and_compare
from dtwork.store.runs import RunStore

__all__ = ["Report", "export", "target_path", "to_html", "write_text"]

_EXPORTS = threading.Lock()

# The UMD bundle must set window.Plotly even where require.js defines `define`.
_BEFORE_PLOTLY = "<script>window._dtDefine = window.define; window.define = undefined;</script>"
_AFTER_PLOTLY = "<script>window.define = window._dtDefine;</script>"


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


def target_path(path: str | os.PathLike[str] | None, name: str) -> Path:
    """Check the target (default ``reports/<name>``) before anything is written; only a missing
    ``reports/`` folder is created."""
    default = Path.cwd() / "reports" / name
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


def write_text(path: Path, text: str) -> None:
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


def _with_figure_html(nb: NotebookNode) -> NotebookNode:
    """A copy of ``nb`` whose figures also carry HTML, plotly.js inlined with the first only."""
    import plotly.io as pio

    out, first = copy.deepcopy(nb), True
    for cell in out.cells:
        for output in cell.get("outputs", []):
            fig = output.get("data", {}).get(PLOTLY_MIME)
            if fig is None:
                continue
            div = pio.to_html(fig, full_html=False, include_plotlyjs=first, validate=False)
            output["data"]["text/html"] = f"{_BEFORE_PLOTLY}{div}{_AFTER_PLOTLY}" if first else div
            first = False
    return out


def to_html(nb: NotebookNode) -> str:
    """Standalone HTML of a report: plotly.js inline once; the template's CDN scripts dropped."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    remove = {"enabled": True, "remove_input_tags": [DATA_TAG], "remove_cell_tags": [CONFIG_TAG]}
    config = Config({"TagRemovePreprocessor": remove})  # the config shows once, folded in <details>
    exporter = HTMLExporter(config=config, require_js_url="", mathjax_url="")
    body, _ = exporter.from_notebook_node(_with_figure_html(nb))
    return body.replace('<script src=""></script>', "")


def export(
    run_id: int | str | None = None,
    path: str | os.PathLike[str] | None = None,
    *,
    store: str | os.PathLike[str] | None = None,
    html: bool = False,
    verify: bool = False,
    timeout: float = 900.0,
    tolerance: float = 1e-6,
    environ: Mapping[str, str] | None = None,
) -> Report:
    """Write run ``run_id`` (default: the latest) to ``path`` (default ``reports/run-<id>.ipynb``).

    ``html`` also writes the ``.html`` beside it (nbconvert, plotly.js inline). ``verify``
    re-executes the notebook (nbclient, ``timeout`` s per cell, cwd = its folder) and appends how
    closely the re-run matched (``tolerance``: the largest difference that counts as reproduced).
    ``environ`` is the kernel's environment, whose secret-looking values are scrubbed wherever
    they appear (default: this process's, right when the kernel itself exports).
    Bad input raises a one-line ``DtworkError`` before anything is written.
    """
    with _EXPORTS:
        return _export(run_id, path, store, html, verify, timeout, tolerance, environ)


def _export(
    run_id: int | str | None,
    path: str | os.PathLike[str] | None,
    store: str | os.PathLike[str] | None,
    want_html: bool,
    verify: bool,
    timeout: float,
    tolerance: float,
    environ: Mapping[str, str] | None,
) -> Report:
    with RunStore(store, readonly=True) as s:
        rid = s.latest_run_id() if run_id is None else s.get_run(run_id)["id"]
        if rid is None:
            raise DtworkError(f"no runs in {s.path}: run a %%dtrain cell first")
        if not s.cells(rid):
            raise DtworkError(f"run {rid} has no cells: nothing to export; run a %%dtrain cell in it first")
        target, scrub = (
            target_path(path, f"run-{rid}.ipynb"),
            Scrubber(os.environ if environ is None else environ),
        )
        nb = notebook(s, rid, target, scrub)
        # every recorded value, for the re-run to match: read only when verifying (a long run's are many)
        recorded = s.metrics(rid) if verify else []
    target.parent.mkdir(exist_ok=True)
    write_text(target, nbformat.writes(nb))
    report = Report(target, None, rid, list(scrub.found))
    if verify:
        verdict, cell = rerun_and_compare(target, recorded, timeout, tolerance)
        report.verified, report.max_abs_diff, report.verification = (
            verdict.verified,
            verdict.max_abs_diff,
            verdict.text,
        )
        nb.cells.append(cell)
        write_text(target, nbformat.writes(nb))
    if want_html:
        report.html_path = target.with_suffix(".html")
        write_text(report.html_path, to_html(nb))
    return report
