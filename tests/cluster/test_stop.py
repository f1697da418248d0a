"""A quiet, clean stop: one line, runs marked as ended, a stop from the sidebar seen by the kernel,
plain text progress outside a notebook."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtwork.store.runs import RunStore

MAGIC_STOP = """
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "dtwork")
ip.run_line_magic("dtrain", "start -n 2 --backend gloo")
ip.run_cell_magic("dtrain", "--quiet", "for step, _ in ctx.steps(range(5), max_steps=5):\\n    ctx.log(loss=1.0)")
if FAIL:
    try:
        # a training cell that fails: a run's status is set by the cells that trained in it
        ip.run_cell_magic("dtrain", "--quiet", "for step, _ in ctx.steps(range(5), max_steps=5):\\n    raise ValueError('the last cell fails')")
    except Exception as exc:
        print(type(exc).__name__)
print("=== STOP", flush=True)
ip.run_line_magic("dtrain", "stop")
print("=== END", flush=True)
"""


def _run(script: str, tmp_path: Path) -> str:
    """Run a script in a fresh process (its own registry and store); return stdout and stderr."""
    env = {**os.environ, "DTWORK_HOME": str(tmp_path / "home"), "DTWORK_STORE": str(tmp_path / "runs.sqlite")}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.parametrize(("fail", "status"), [(False, "completed"), (True, "failed")])
def test_dtrain_stop_prints_one_line_and_the_run_ends(tmp_path, fail, status) -> None:
    out = _run(f"FAIL = {fail}\n" + MAGIC_STOP, tmp_path)
    stop = out.split("=== STOP\n", 1)[1].split("=== END", 1)[0]
    lines = stop.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtwork: stopped dtwork-"), stop
    assert "Output for" not in out and "did not exit" not in out and "Stopping cluster" not in out
    with RunStore(tmp_path / "runs.sqlite", readonly=True) as s:
        runs = s.list_runs()
    assert [r["status"] for r in runs] == [status]
    logs = list((tmp_path / "home" / "logs").glob("dtwork-*.log"))  # where ipyparallel's words went
    assert len(logs) == 1 and "Stopping controller" in logs[0].read_text()


PLAIN_SCRIPT = """
import dtwork
with dtwork.start(n=2, backend="gloo") as c:
    c.run("for step, _ in ctx.steps(range(30), max_steps=30):\\n    ctx.log(loss=1.0 / (step + 1))")
    c.run("6 * 7")
"""


def test_a_plain_script_prints_text_progress_and_results_no_widgets(tmp_path) -> None:
    out = _run(PLAIN_SCRIPT, tmp_path)
    assert "dtwork: step 30/30, loss 0.03333, ok in" in out
    assert "[rank 0] Out:\n42\n[rank 1] Out:\n42" in out
    for widget in ("Widget", "plotly", "HTML(", "text/plain", "application/vnd"):
        assert widget not in out, out[-3000:]
    with RunStore(tmp_path / "runs.sqlite", readonly=True) as s:
        assert [r["status"] for r in s.list_runs()] == ["completed"]


def test_a_cluster_stopped_from_the_sidebar_is_stopped_for_its_kernel(tmp_path, monkeypatch, capsys) -> None:
    import dtwork
    from dtwork.errors import DtworkError
    from dtwork.server import queries

    monkeypatch.setenv("DTWORK_STORE", str(tmp_path / "runs.sqlite"))
    c = dtwork.start(n=2, backend="gloo")
    try:
        c.run("x = 1", quiet=True)
        stopped = queries.stop_cluster(c.cluster_id)  # what POST /dtwork/clusters/<id>/stop does
        assert stopped["stopped"] == c.cluster_id and stopped["killed"]
        with pytest.raises(DtworkError, match="the cluster is stopped"):
            c.run("x = 2", quiet=True)  # the next command
        assert c.state == "stopped"
        assert "was stopped outside this kernel" in capsys.readouterr().err
        with RunStore(tmp_path / "runs.sqlite", readonly=True) as s:
            assert [r["status"] for r in s.list_runs()] == ["completed"]
    finally:
        c.stop()
