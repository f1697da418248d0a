"""The walkthrough notebooks execute headlessly (nbclient, kernel python3) and say what they should."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

EXPECTED: dict[str, list[str | tuple[str, ...]]] = {
    "scaling.ipynb": ["efficient, 95% interval", "weak scaling", "strong scaling"],
    "gns.ipynb": ["B_simple", "Critical batch size"],
    "adaptive.ipynb": [
        "from step 0: global batch 16",
        "adaptive batch: global batch",
        # %dtrain gns: the last decision weighed a switch, or kept the batch on a wide interval
        ("a switch needs more than 5%", "no settled GNS interval at the last decision"),
    ],
    "fsdp.ipynb": ["FSDP holds 0.5", "dtwork: memory on rank 0", "exported step 21"],
    "search.ipynb": [
        "adaptive_asha search lr-search.yaml (search 1): 4 trials, val_loss",
        "completed, to 64 batches",
        "stopped, to 16 batches",
        "best: trial",
        "adaptive_asha  completed  val_loss",  # %dtrain runs searches
        "trial  run  status",  # %dtrain runs list --search 1
        "wrote search 1's report",
    ],
}
QUICKSTART = ["trained 120 steps", "% scaling efficiency", "test accuracy", "wrote run 1's report"]


def _text(nb) -> str:
    parts: list[str] = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                parts.append(out["text"])
            data = out.get("data", {})
            if "text/plain" in data:
                parts.append(data["text/plain"])
            if out.get("output_type") == "error":
                parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "\n".join(parts)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    monkeypatch.setenv("DTWORK_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("DTWORK_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{name} failed: {str(exc)[-2000:]}")
    text = _text(nb)
    for expected in EXPECTED[name]:  # a string, or a tuple of alternatives
        either = (expected,) if isinstance(expected, str) else expected
        assert any(e in text for e in either), f"{expected!r} not in the outputs of {name}:\n{text[-3000:]}"


def test_quickstart_main_command_writes_the_executed_copy_and_its_report(tmp_path: Path, monkeypatch) -> None:
    """The README's first command, minus the install: ``python -m dtwork run notebooks/quickstart.ipynb``."""
    import subprocess
    import sys

    env = {"DTWORK_STORE": str(tmp_path / "runs.sqlite"), "DTWORK_HOME": str(tmp_path / "home")}
    monkeypatch.chdir(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "dtwork", "run", str(NOTEBOOKS / "quickstart.ipynb")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "reports" / "quickstart.ipynb").exists()
    assert (tmp_path / "reports" / "quickstart-report.ipynb").exists()
    assert (tmp_path / "reports" / "quickstart-report.html").exists()
    import nbformat

    text = _text(nbformat.read(tmp_path / "reports" / "quickstart.ipynb", as_version=4))
    for expected in QUICKSTART:
        assert expected in text, text[-3000:]
    report = nbformat.read(tmp_path / "reports" / "quickstart-report.ipynb", as_version=4)
    summary = "\n".join(cell.source for cell in report.cells)
    assert re.search(r"\| scaling efficiency \| \d+% \|", summary), summary[:3000]


def test_the_readmes_opening_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's first two code blocks, each a cell as a user types them, in a fresh kernel (its own
    2-rank cluster: a notebook's kernel cannot share the test process's)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    readme = (NOTEBOOKS.parent / "README.md").read_text(encoding="utf-8")
    cells = re.findall(r"```python\n(.*?)```", readme, flags=re.S)[:2]
    assert cells[0].startswith("%load_ext dtwork") and cells[1].startswith("%%dtrain")  # one magic a cell
    monkeypatch.setenv("DTWORK_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("DTWORK_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in [*cells, "%dtrain runs\n%dtrain stop"]]
    )
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"the README's example failed: {str(exc)[-2000:]}")
    assert re.search(r"\n +1 +- +running +2 +64 +200 ", _text(nb)), _text(nb)[
        -3000:
    ]  # run 1 trained its steps
