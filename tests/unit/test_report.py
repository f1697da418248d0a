"""dtwork.report: export a run as a notebook that re-runs to the same numbers, with no secrets."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from dtwork.errors import DtworkError
from dtwork.report import Scrubber, export
from dtwork.store.runs import RunStore


def test_scrubber_finds_secret_shapes_but_leaves_code_alone() -> None:
    s = Scrubber(environ={"SERVICE_PASSWORD": "s3cr3t-value-42", "HOME": "/root", "MY_KEY": "short"})
    text = 'url = "https://x?token=0123456789abcdef0123"\npassword = "hunter2"\nsk = "sk-' + "a" * 24 + '"'
    out = s.text(text + "\napi_key: 9f8e7d6c5b4a39281706f5e4\nnote: s3cr3t-value-42", "cell 1")
    assert all(v not in out for v in ("0123456789abcdef0123", "hunter2", "a" * 24, "9f8e7d6c5b4a", "s3cr3t"))
    assert "$SERVICE_PASSWORD" in "\n".join(s.found) and "s3cr3t" not in "\n".join(s.found)
    code = 'tokenizer = "bert-base"\npassword = getpass()\nkey_dim: 64\nsort_key = "loss"\nauthor: "Ada"'
    assert Scrubber(environ={}).text(code, "cell 2") == code
    cfg = {"hyperparameters": {"hub_token": "abc", "depth": 2, "auth": {"password": 123456}}}
    assert Scrubber(environ={}).data(cfg, "config") == {
        "hyperparameters": {"hub_token": "<scrubbed>", "depth": 2, "auth": {"password": "<scrubbed>"}}
    }


@pytest.fixture
def small_store(tmp_path: Path) -> tuple[Path, int, int]:
    """A store written directly (no cluster): an empty run, then a run with a cell and metrics."""
    path = tmp_path / "store" / "runs.sqlite"
    with RunStore(path) as s:
        empty = s.create_run(world_size=2, backend="gloo")
        rid = s.create_run(world_size=2, backend="gloo", global_batch_size=16, per_slot_batch_size=8)
        s.add_cell(rid, "x = 1")
        logged = (("loss", None, lambda i: 1 / (i + 1)), ("b_simple", None, lambda i: 60.0))
        perf = tuple(("samples_per_s", r, lambda i: 50.0) for r in (0, 1))
        rows = [
            {"step": i, "rank": r, "name": n, "value": f(i)} for i in range(5) for n, r, f in logged + perf
        ]
        s.add_metrics(rid, rows)
        point = {"step_time": 0.1, "comm_time": 0.01, "per_slot_batch": 8}
        points = [
            {**point, "world_size": n, "throughput": t, "global_batch": 8 * n}
            for n, t in ((1, 50.0), (2, 90.0))
        ]
        s.add_result(rid, "scaling", {"mode": "weak", "points": points})
    return path, rid, empty


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mode) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("run", "target", "message"),
    [
        (99, "r.ipynb", "no run 99 in"),
        (None, "missing/r.ipynb", "the folder"),
        (None, "r.txt", "must end with .ipynb"),
        (None, "folder.ipynb", "is a folder"),
        ("empty", "r.ipynb", "has no cells: nothing to export"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    small_store: tuple[Path, int, int], tmp_path: Path, run: object, target: str, message: str
) -> None:
    store, _, empty = small_store
    out = tmp_path / "out"
    (out / "folder.ipynb").mkdir(parents=True)
    before = _tree(out)
    with pytest.raises(DtworkError) as info:
        export(empty if run == "empty" else run, out / target, store=store, html=True)  # type: ignore[arg-type]
    assert message in str(info.value) and "\n" not in str(info.value)
    assert _tree(out) == before


def test_unwritable_folder_is_refused(
    small_store: tuple[Path, int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, rid, _ = small_store
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only folder (root writes anyway)
    with pytest.raises(DtworkError, match="the folder .* is not writable"):
        export(rid, tmp_path / "ro" / "r.ipynb", store=store)
    assert not any((tmp_path / "ro").iterdir())


def test_report_magic_on_a_real_shell(
    small_store: tuple[Path, int, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    store, rid, _ = small_store
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "dtwork")
    ip.run_line_magic("dtrain", f"report {tmp_path / 'm.ipynb'} --run {rid} --store {store} --html")
    assert (tmp_path / "m.ipynb").is_file() and (tmp_path / "m.html").is_file()
    assert f"wrote run {rid}'s report" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    ip.run_line_magic("dtrain", f"report --store {store}")  # the latest run, to reports/run-<id>.ipynb
    header = nbformat.read(tmp_path / "reports" / f"run-{rid}.ipynb", as_version=4).cells[0].source
    expected = ["scaling efficiency | 90%", "B_simple | 60", "final loss | 0.2", "ranks) | 100", "batch | 64"]
    assert all(f"{line} |" in header for line in expected), header
    with pytest.raises(DtworkError, match="unrecognized arguments: --frobnicate") as info:
        ip.run_line_magic("dtrain", "report --frobnicate")
    assert "\n" not in str(info.value)


def test_the_report_opens_with_summary_and_figures_and_folds_the_config(
    small_store: tuple[Path, int, int], tmp_path: Path
) -> None:
    store, rid, _ = small_store
    rep = export(rid, tmp_path / "r.ipynb", store=store, html=True)
    nb = nbformat.read(rep.path, as_version=4)
    heads = [c.source.split("\n", 1)[0] for c in nb.cells if c.cell_type == "markdown"]
    assert heads[:3] == [heads[0], "## Figures", "## Analyses: scaling and gradient noise scale"]
    assert heads[0].startswith("# dtwork report") and "summary" in nb.cells[0].source
    assert heads.index("## Re-run") > heads.index("## Events")
    writes = next(i for i, c in enumerate(nb.cells) if c.source.startswith("%%writefile"))
    figures = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.outputs)
    assert figures < writes
    assert nb.cells[writes].metadata["jupyter"]["source_hidden"] is True  # collapsed in JupyterLab
    html = rep.html_path.read_text()  # type: ignore[union-attr]
    assert "%%writefile" not in html  # the config once, inside the fold, not again as a cell's source
    details = html.index("<details>")
    assert details < html.index("global_batch_size:") < html.index("</details>", details)
    assert html.index("Plotly.newPlot") < details  # the figures come before the config


def test_a_failed_re_run_names_the_cell_and_the_ranks_error_under_it() -> None:
    from nbclient.exceptions import CellExecutionError
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from dtwork.report.verify import failure

    evalue = (
        "dtwork: the cell failed on rank 0\n\x1b[0;31mTraceback\x1b[0m\n  cell line 2\n"
        "NameError: name 'make_model' is not defined"
    )
    failing = new_code_cell("%%dtrain\nmodel = make_model()")
    failing.outputs = [new_output("error", ename="RankFailure", evalue=evalue, traceback=[])]
    nb = new_notebook(cells=[new_markdown_cell("# run 3"), new_code_cell("%load_ext dtwork"), failing])
    said = failure(nb, CellExecutionError("...", "RankFailure", evalue))
    assert said == (
        "code cell 2 (model = make_model()): RankFailure: dtwork: the cell failed on rank 0 "
        "(NameError: name 'make_model' is not defined)"
    )


def test_an_export_reads_every_metric_row_only_to_verify(
    small_store: tuple[Path, int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every recorded value is read for the re-run to match; an export without it reads the figures'
    rows only, so that a day-long run's export costs what the report shows (issue 43)."""
    store, rid, _ = small_store
    real, calls = RunStore.metrics, []

    def counted(self: RunStore, *args: object, **kwargs: object) -> object:
        calls.append((args, kwargs))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RunStore, "metrics", counted)
    rep = export(rid, tmp_path / "r.ipynb", store=store)
    assert rep.path.exists() and calls == []
    nb = nbformat.read(rep.path, as_version=4)
    assert any('\\"loss\\"' in c.source or '"loss"' in c.source for c in nb.cells)  # its data still there
