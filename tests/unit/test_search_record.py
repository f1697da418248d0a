"""A search as a record of the run store: its tables (and the upgrade that adds them), the CLI that lists
searches and their trials, a dead kernel's search marked interrupted, and the search report, re-executed
to the same numbers. Real SQLite files; the CLI through its real entry point."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import nbformat
import pytest

from dtwork.cli import main
from dtwork.errors import DtworkError
from dtwork.report.helpers import PLOTLY_MIME
from dtwork.report.search import export_search
from dtwork.store import searches
from dtwork.store.runs import SCHEMA_VERSION, RunStore

SEARCH_YAML = """name: sweep
searcher: {name: grid, metric: val_loss, smaller_is_better: true, max_length: 3}
hyperparameters:
  global_batch_size: 8
  lr: {type: categorical, vals: [0.1, 0.01, 0.001]}
  model: {width: {type: const, val: 16}, act: {type: categorical, vals: [relu]}}
"""
CODE = "for step, _ in ctx.steps(range(3)):\n    ctx.log(val_loss=ctx.hparams['lr'] * (3 - step))"
LRS = (0.1, 0.01, 0.001)


def _new(hparams: list[dict[str, object]], cluster: str = "c1") -> searches.NewSearch:
    return searches.NewSearch(
        label="sweep.yaml",
        searcher="grid",
        metric="val_loss",
        smaller_is_better=True,
        config_yaml=SEARCH_YAML,
        code=CODE,
        cluster_id=cluster,
        world_size=2,
        backend="gloo",
        hparams=hparams,
    )


def _trial_run(store: RunStore, lr: float) -> int:
    run = store.create_run(world_size=2, backend="gloo", cluster_id="c1")
    store.add_metrics(run, [{"step": s, "name": "val_loss", "value": lr * (3 - s)} for s in range(3)])
    store.set_run_status(run, "completed", ended=True)
    return run


@pytest.fixture()
def searched(tmp_path: Path) -> tuple[Path, int, list[int]]:
    """A store holding a finished grid search of three trials (the third failed), each with its run."""
    path = tmp_path / ".dtwork" / "runs.sqlite"
    with RunStore(path) as store:
        hps = [{"global_batch_size": 8, "lr": lr, "model": {"width": 16, "act": "relu"}} for lr in LRS]
        sid = searches.create(store.db, _new(hps))
        runs = [_trial_run(store, lr) for lr in LRS]
        for number, (run, lr) in enumerate(zip(runs, LRS, strict=True), start=1):
            status = "failed" if number == 3 else "completed"
            metric = lr * 1 if number < 3 else None
            searches.set_trial(store.db, sid, number, run_id=run, status=status, metric=metric)
        searches.finish(store.db, sid, "completed")
    return path, sid, runs


def test_a_v5_store_opens_and_gets_the_search_tables_with_its_runs_kept(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with RunStore(path) as store:
        run = store.create_run(world_size=1, backend="gloo")
        store.add_metrics(run, [{"step": 0, "name": "loss", "value": 1.0}])
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE trials; DROP TABLE searches; PRAGMA user_version = 5;")
    conn.close()
    with pytest.raises(DtworkError, match="older dtwork"):  # read-only: it cannot be upgraded there
        RunStore(path, readonly=True)
    with RunStore(path) as store:
        assert store.db.connection().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [r["value"] for r in store.metrics(run, "loss")] == [1.0]
        assert searches.list_searches(store.db) == []
        sid = searches.create(store.db, _new([{"lr": 0.1}]))
        assert [t["status"] for t in searches.trials(store.db, sid)] == ["not run"]


def test_a_search_tallies_its_trials_and_counts_an_unclaimed_run_as_running(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.sqlite") as store:
        sid = searches.create(store.db, _new([{"lr": lr} for lr in LRS]))
        other = searches.create(store.db, _new([{"lr": 1.0}], cluster="c2"))
        first = _trial_run(store, 0.1)
        searches.set_trial(store.db, sid, 1, run_id=first, status="completed", metric=0.3)
        store.create_run(world_size=2, backend="gloo", cluster_id="c1")  # trial 2 training now
        s = searches.get(store.db, sid)
        assert (s["status"], s["trials"], s["running"], s["done"], s["best"]) == ("running", 3, 1, 1, 0.3)
        assert searches.get(store.db, other)["running"] == 0  # another cluster's run is not its trial
        searches.set_trial(store.db, sid, 2, run_id=first + 1, status="stopped", metric=float("nan"))
        searches.set_trial(store.db, sid, 3, run_id=None, status="failed", error="boom")
        s = searches.get(store.db, sid)
        assert (s["running"], s["stopped"], s["failed"], s["best"]) == (0, 1, 1, 0.3)  # NaN is never best
        trials = searches.trials(store.db, sid)
        assert trials[1]["metric"] != trials[1]["metric"]  # the NaN came back as NaN, not None
        assert [t["hparams"] for t in trials] == [{"lr": lr} for lr in LRS]
        searches.finish(store.db, sid, "completed")
        assert searches.get(store.db, sid)["ended_at"] is not None
        with pytest.raises(DtworkError, match="trial status must be one of"):
            searches.set_trial(store.db, sid, 1, run_id=first, status="done")
        with pytest.raises(DtworkError, match=r"no search 99 in .*; known searches: 1-2"):
            searches.get(store.db, 99)


def test_a_dead_kernels_search_is_marked_interrupted_with_its_runs(tmp_path: Path) -> None:
    from dtwork.launch.registry import _interrupt_runs

    path = tmp_path / "runs.sqlite"
    with RunStore(path) as store:
        mine = searches.create(store.db, _new([{"lr": 0.1}]))
        theirs = searches.create(store.db, _new([{"lr": 0.1}], cluster="c2"))
        run = store.create_run(world_size=2, backend="gloo", cluster_id="c1")
    _interrupt_runs({"store": str(path), "cluster_id": "c1"}, "the kernel died")
    with RunStore(path, readonly=True) as store:
        assert searches.get(store.db, mine)["status"] == "interrupted"
        assert searches.get(store.db, mine)["ended_at"] is not None
        assert searches.get(store.db, theirs)["status"] == "running"  # a live kernel's: left alone
        assert store.get_run(run)["status"] == "interrupted"


def test_the_cli_lists_searches_and_a_searchs_trials(
    searched: tuple[Path, int, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, sid, runs = searched
    assert main(["runs", "searches", "--store", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(path)
    assert out[1].split() == [
        *("id", "file", "searcher", "status", "best", "trials", "running", "stopped", "done", "failed"),
        "started",
    ]
    assert out[2].split()[:10] == [
        str(sid),
        "sweep.yaml",
        "grid",
        "completed",
        "val_loss",
        "0.01",
        "3",
        "0",
        "0",
        "2",
    ]
    assert main(["runs", "list", "--search", str(sid), "--store", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"search {sid}  sweep.yaml  grid  completed  metric val_loss (smaller is better), "
        f"best 0.01: trial 2 (run {runs[1]})"
    )
    assert out[1].split() == ["trial", "run", "status", "val_loss", "steps", "hyperparameters"]
    assert out[3].split() == [
        *("2", "*", str(runs[1]), "completed", "0.01", "2"),
        *("global_batch_size=8,", "lr=0.01,", "model.width=16,", "model.act='relu'"),
    ]
    assert out[4].split()[:5] == ["3", str(runs[2]), "failed", "-", "2"]
    assert main(["runs", "list", "--search", str(sid), "--json", "--store", str(path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["best"] == 2 and [t["run_id"] for t in data["trials"]] == runs
    assert "code" not in data["search"] and data["search"]["done"] == 2
    assert main(["runs", "list", "--search", "7", "--store", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no search 7 in {path}; known searches: {sid}" in err
    assert main(["runs", "list", "--search", "x", "--store", str(path)]) == 1
    assert "search id must be a whole number" in capsys.readouterr().err
    assert main(["runs", "export", "--search", str(sid), "--store", str(path)]) == 1
    assert "add --report PATH" in capsys.readouterr().err


def test_the_search_report_shows_the_best_and_re_executes_to_the_same_numbers(
    searched: tuple[Path, int, list[int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    path, sid, runs = searched
    target = tmp_path / "out" / "search.ipynb"
    target.parent.mkdir()
    assert main(["runs", "export", "--search", str(sid), "--report", str(target), "--store", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {target}"
    nb = nbformat.read(target, as_version=4)
    head = nb.cells[0].source
    assert head.startswith("# dtwork search report: sweep.yaml")
    assert f"| best trial | trial 2 (run {runs[1]}): 0.01 |" in head and "| lr | 0.01 |" in head
    figures = next(c for c in nb.cells if c.cell_type == "code" and c.outputs)
    text = figures.outputs[0].text
    assert text.startswith(f"Best: trial 2 (run {runs[1]}) val_loss=0.01; global_batch_size=8, lr=0.01")
    drawn = [o.data[PLOTLY_MIME] for o in figures.outputs if o.output_type == "display_data"]
    curves, parallel = drawn
    assert [t["name"] for t in curves["data"]] == ["trial 1", "trial 2 (best)", "trial 3"]
    assert curves["data"][1]["y"] == [0.03, 0.02, 0.01]
    dims = {d["label"]: d["values"] for d in parallel["data"][0]["dimensions"]}
    assert dims["lr"] == [0.1, 0.01] and dims["val_loss"] == [0.1, 0.01]  # the failed trial has no metric
    rerun = nb.cells[nb.cells.index(figures) + 1 :]
    assert [c.source.split("\n", 1)[0] for c in rerun if c.cell_type == "code"] == [
        "%%writefile search.yaml",
        "%load_ext dtwork",
        "%%dtrain search search.yaml",
        "%dtrain stop",
    ]
    assert "lr: {type: categorical, vals: [0.1, 0.01, 0.001]}" in rerun[1].source
    assert "--store search.rerun.sqlite" in rerun[2].source and CODE in rerun[3].source
    # Re-executed, the data and figure cells show what the report was written with.
    shell = InteractiveShell.instance()
    data_cell = nb.cells[nb.cells.index(figures) - 1]
    with capture_output() as captured:
        for cell in (data_cell, figures):
            assert shell.run_cell(cell.source).success
    assert captured.stdout == text
    assert [o.data[PLOTLY_MIME] for o in captured.outputs] == drawn
    assert export_search(sid, tmp_path / "out" / "again.ipynb", store=path, html=True).html_path is not None
    assert "Plotly.newPlot" in (tmp_path / "out" / "again.html").read_text()
    shell.run_line_magic("load_ext", "dtwork")
    shell.run_line_magic("dtrain", f"report {tmp_path / 'out' / 'm.ipynb'} --search {sid} --store {path}")
    assert f"wrote search {sid}'s report to {tmp_path / 'out' / 'm.ipynb'}" in capsys.readouterr().out
