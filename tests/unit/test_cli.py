"""``dtwork runs``: the installed console script, run in a subprocess on a real SQLite store."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from dtwork.config import load_config
from dtwork.errors import DtworkError
from dtwork.store.runs import RunStore

SCRIPT = shutil.which("dtwork", path=str(Path(sys.executable).parent)) or shutil.which("dtwork")
pytestmark = pytest.mark.skipif(
    SCRIPT is None, reason="the dtwork console script is not installed: pip install -e ."
)

CONFIG = load_config({"name": "mnist", "global_batch_size": 64, "searcher": {"metric": "validation_loss"}})


def dtwork(*args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DTWORK_STORE"}
    proc = subprocess.run([str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert (proc.returncode == 0) == ok, proc.stderr
    return proc


@pytest.fixture()
def notebook_dir(tmp_path: Path) -> Path:
    """A folder with a notebook and its store beside it (.dtwork/runs.sqlite), holding two runs."""
    (tmp_path / "train.ipynb").write_text("{}", encoding="utf-8")
    with RunStore(tmp_path / ".dtwork" / "runs.sqlite") as store:
        for n, (lr, status) in enumerate(((0.1, "completed"), (0.4, "failed")), start=1):
            run = store.create_run(
                name=f"lr-{lr}",
                world_size=2,
                backend="gloo",
                config_yaml=CONFIG.replace(hyperparameters={"lr": lr}).to_yaml(),
                global_batch_size=64,
                per_slot_batch_size=32,
            )
            cell = store.add_cell(run, "train()")
            store.finish_cell(run, cell, status)
            records = [{"step": s, "name": "loss", "value": n / (s + 1)} for s in range(20)]
            records += [
                {"step": s, "name": "validation_loss", "value": n * (0.5 + abs(s - 9) / 10)}
                for s in (4, 9, 14)
            ]
            store.add_metrics(run, records)
            store.add_result(run, "scaling", {"mode": "weak", "points": [
                {"world_size": 1, "throughput": 500.0, "step_time": 0.1, "comm_time": 0.0, "per_slot_batch": 32, "global_batch": 32},
                {"world_size": 2, "throughput": 950.0, "step_time": 0.1, "comm_time": 0.01, "per_slot_batch": 32, "global_batch": 64},
            ]})  # fmt: skip
            store.set_run_status(run, status, ended=True)
    return tmp_path


def test_list_finds_the_store_beside_the_notebook(notebook_dir: Path) -> None:
    out = dtwork("runs", "list", cwd=notebook_dir).stdout
    lines = out.splitlines()
    assert lines[0] == str(notebook_dir / ".dtwork" / "runs.sqlite")
    assert lines[1].split() == [
        "id",
        "name",
        "status",
        "ranks",
        "batch",
        "steps",
        "result",
        "started",
        "changed",
    ]
    assert lines[2].split()[:7] == ["2", "lr-0.4", "failed", "2", "64", "19", "validation_loss"]
    assert lines[2].split()[7:9] == ["1", "@9"]  # the best (smallest) validation loss and its step
    assert lines[3].split()[:3] == ["1", "lr-0.1", "completed"]
    assert lines[2].endswith("  lr=0.4") and lines[3].endswith("  lr=0.1")  # what differs, nothing else
    other = notebook_dir.parent / f"{notebook_dir.name}-elsewhere"
    other.mkdir()
    assert dtwork("runs", "--store", str(notebook_dir / "train.ipynb"), "list", cwd=other).stdout == out
    data = json.loads(dtwork("runs", "list", "--json", cwd=notebook_dir).stdout)
    assert [r["id"] for r in data] == [2, 1]
    assert data[1]["result"] == {
        "metric": "validation_loss",
        "best": 0.5,
        "step": 9,
        "smaller_is_better": True,
    }


def test_show_summarises_one_run(notebook_dir: Path) -> None:
    out = dtwork("runs", "show", "1", cwd=notebook_dir).stdout
    assert out.splitlines()[0].split() == ["run", "1", "lr-0.1", "completed"]
    assert "global batch 64 = 32 per slot" in out
    assert "hparams   optimizer=sgd lr=0.1\n" in out  # the config's optimizer and ctx.hparams
    assert "result    validation_loss 0.5 @9" in out
    loss = next(line for line in out.splitlines() if line.startswith("loss"))
    assert loss.split() == ["loss", "20", "0.05", "19", "0.05", "1"]
    assert "scaling   weak: 1: 500/s, 2: 950/s" in out
    data = json.loads(dtwork("runs", "show", "1", "--json", cwd=notebook_dir).stdout)
    assert data["metrics"]["loss"]["count"] == 20 and data["cells"] == 1


def test_compare_puts_two_runs_side_by_side_and_writes_a_plot(notebook_dir: Path) -> None:
    out = dtwork("runs", "compare", "1", "2", "--plot", "cmp.html", cwd=notebook_dir).stdout
    rows = {line.split("  ")[0].strip(): line.split() for line in out.splitlines()}
    assert rows["loss (last)"][-3:] == ["0.05", "0.1", "+100.0%"]
    assert rows["status"][-2:] == ["completed", "failed"]
    plot = notebook_dir / "cmp.html"
    assert out.splitlines()[-1] == f"plot: {plot}"
    html = plot.read_text(encoding="utf-8")
    assert "run 1 vs run 2" in html and "validation_loss" in html


def test_compare_of_three_runs_writes_its_plot_beside_the_store(notebook_dir: Path) -> None:
    with RunStore(notebook_dir / ".dtwork" / "runs.sqlite") as store:
        third = store.create_run(name="lr-0.8", world_size=2, backend="gloo")
        store.add_metrics(third, [{"step": s, "name": "loss", "value": 1e6 * (s + 1)} for s in range(20)])
    out = dtwork("runs", "compare", "1", "2", str(third), cwd=notebook_dir).stdout
    header = out.splitlines()[0].split()
    assert header == ["run", "1", "run", "2", "run", "3", "vs", "run", "1"]
    rows = {line.split("  ")[0].strip(): line.split() for line in out.splitlines()}
    assert rows["loss (last)"][-4:] == ["0.1", "2.000e+07", "+100.0%,", "+39999999900.0%"]
    plot = notebook_dir / ".dtwork" / "compare" / "runs-1-2-3.html"
    assert out.splitlines()[-1] == f"plot: {plot}"
    assert plot.stat().st_size < 200_000  # plotly.js once beside it, not in every figure
    assert not list(notebook_dir.glob("*.html")), "a compare wrote into the notebook's folder"
    data = json.loads(dtwork("runs", "compare", "1", "2", "3", "--json", cwd=notebook_dir).stdout)
    assert [r["id"] for r in data["runs"]] == [1, 2, 3] and data["plot"] == str(plot)
    err = dtwork("runs", "compare", "1", cwd=notebook_dir, ok=False).stderr
    assert err.strip() == "dtwork: dtwork runs compare takes two runs or more: dtwork runs compare 2 3 4"


def test_export_writes_tensorboard_and_says_where(notebook_dir: Path) -> None:
    pytest.importorskip("tensorboard")
    out = dtwork("runs", "export", "--tensorboard", "tb", cwd=notebook_dir).stdout
    assert out.splitlines()[0] == f"tensorboard: 2 run(s) in {notebook_dir / 'tb'}"
    assert sorted(p.name for p in (notebook_dir / "tb").iterdir()) == ["run-1-lr-0.1", "run-2-lr-0.4"]


def test_export_report(notebook_dir: Path) -> None:
    out = dtwork("runs", "export", "1", "--report", "r1.ipynb", cwd=notebook_dir).stdout
    assert (notebook_dir / "r1.ipynb").is_file()
    assert out.startswith("report: ")


def test_errors_are_one_line(notebook_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    empty = tmp_path_factory.mktemp("empty")
    err = dtwork("runs", "list", cwd=empty, ok=False).stderr
    assert err.startswith("dtwork: no run store at ") and len(err.strip().splitlines()) == 1
    err = dtwork("runs", "show", "7", cwd=notebook_dir, ok=False).stderr
    assert len(err.strip().splitlines()) == 1 and "7" in err
    err = dtwork("runs", "export", "1", cwd=notebook_dir, ok=False).stderr
    assert (
        err.strip()
        == "dtwork: dtwork runs export: say where: --report PATH, --tensorboard DIR or --mlflow URI"
    )


def test_the_magic_runs_the_same_commands(notebook_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("dtwork")  # silent when an earlier test loaded it
    store = notebook_dir / ".dtwork" / "runs.sqlite"
    ip.run_line_magic("dtrain", f"runs show 1 --store {store}")
    shown = capsys.readouterr().out
    assert shown == dtwork("runs", "show", "1", cwd=notebook_dir).stdout
    ip.run_line_magic("dtrain", f"runs export 2 --tensorboard {notebook_dir / 'tb'} --store {store}")
    assert capsys.readouterr().out.startswith(f"tensorboard: 1 run(s) in {notebook_dir / 'tb'}")
    assert [p.name for p in (notebook_dir / "tb").iterdir()] == ["run-2-lr-0.4"]


def test_python_m_dtwork_takes_the_same_parser(notebook_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DTWORK_STORE"}
    module = [sys.executable, "-m", "dtwork"]
    proc = subprocess.run(
        [*module, "runs", "list"], cwd=notebook_dir, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout == dtwork("runs", "list", cwd=notebook_dir).stdout
    helps = [
        subprocess.run([*cmd, "--help"], capture_output=True, text=True, check=True).stdout
        for cmd in (module, [str(SCRIPT)])
    ]
    assert helps[0].startswith("usage: python -m dtwork ") and helps[1].startswith("usage: dtwork ")
    assert helps[0].split("\n", 1)[1] == helps[1].split("\n", 1)[1]  # the same commands and options
    assert "{runs,run,script,clusters,doctor,help}" in helps[1]


HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\r\b\t\x7f\x9b\u202e\u2028"  # clear, title, clipboard


def _controls(text: str) -> list[str]:
    return [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u202e\u2028")]


def test_control_characters_in_names_are_printed_escaped(tmp_path: Path) -> None:
    store_file = tmp_path / "hostile.sqlite"
    with RunStore(store_file) as store:
        run = store.create_run(name=f"run{HOSTILE}", world_size=2, backend=f"gloo{HOSTILE}")
        store.add_cell(run, "train()")
        store.add_metrics(run, [{"step": 0, "name": f"loss{HOSTILE}", "value": 1.0}])
    for args in (["list"], ["list", "--json"], ["show", "1"], ["show", "1", "--json"], ["show", "9"]):
        proc = dtwork("runs", *args, "--store", str(store_file), cwd=tmp_path, ok=args[-1] != "9")
        assert proc.stdout or proc.stderr
        assert _controls(proc.stdout + proc.stderr) == [], args
        if args[-1] == "--json":  # the escapes keep the JSON valid and the names whole
            loaded = json.loads(proc.stdout)
            assert (loaded[0] if isinstance(loaded, list) else loaded)["name"] == f"run{HOSTILE}"
    listed = dtwork("runs", "list", "--store", str(store_file), cwd=tmp_path).stdout
    assert "run\\u001b[2J\\u001b]0;pwned\\u0007" in listed
    (tmp_path / "x\x1b[2J.sqlite").write_bytes(b"not a store at all")
    err = dtwork("runs", "list", "--store", str(tmp_path / "x\x1b[2J.sqlite"), cwd=tmp_path, ok=False).stderr
    assert _controls(err) == [] and "x\\u001b[2J.sqlite" in err


def test_a_damaged_store_is_one_line_without_traceback(tmp_path: Path) -> None:
    store_file = tmp_path / "runs.sqlite"
    with RunStore(store_file) as store:
        run = store.create_run(world_size=2, backend="gloo")
        store.add_metrics(run, [{"step": s, "name": "loss", "value": 1.0} for s in range(3000)])
    with closing(sqlite3.connect(store_file, isolation_level=None)) as conn:  # everything in the main file
        conn.execute("PRAGMA journal_mode = DELETE")
    with open(store_file, "r+b") as f:  # the header stays readable; every page after it is garbage
        f.seek(4096)
        f.write(b"\xff" * (store_file.stat().st_size - 4096))
    for args in (["list"], ["show", "1"], ["list", "--json"]):
        err = dtwork("runs", *args, "--store", str(store_file), cwd=tmp_path, ok=False).stderr
        assert err.startswith(f"dtwork: the run store {store_file} is damaged"), err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    from dtwork.cli import runs_table  # what %dtrain runs prints

    with pytest.raises(DtworkError, match=f"^the run store {store_file} is damaged [^\n]*$"):
        runs_table(store_file)
