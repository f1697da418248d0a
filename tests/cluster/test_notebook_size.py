"""An executed notebook keeps what a reader needs (issue 27 item 5): each live training cell leaves
its figures as plotly JSON, not widget models carrying plotly's JavaScript."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat

TRAIN = (
    "%%dtrain\n"
    "for step, _ in ctx.steps(range(40), max_steps=40):\n"
    "    ctx.log(loss=2.0 * 10 ** (-step / 10), cell={n})\n"
)
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


def test_a_notebook_with_four_live_training_cells_is_saved_under_2_mb(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext dtwork\n%dtrain start -n 2"),
        *(nbformat.v4.new_code_cell(TRAIN.format(n=n)) for n in range(4)),
        nbformat.v4.new_code_cell("%dtrain stop"),
    ]
    path = tmp_path / "four_cells.ipynb"
    nbformat.write(nb, path)
    proc = subprocess.run(
        [sys.executable, "-m", "dtwork", "run", str(path), "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = tmp_path / "out" / path.name
    size = out.stat().st_size
    assert size < 2_000_000, f"{size} bytes"
    executed = nbformat.read(out, as_version=4)
    for cell in executed.cells[1:5]:
        shown = [o for o in cell.outputs if o.get("output_type") == "display_data"]
        assert [sorted(o.data) for o in shown] == [[PLOTLY, "text/plain"]], cell.outputs
        spec = shown[0].data[PLOTLY]
        assert "loss" in {t.get("name") for t in spec["data"]}
        assert "finished" in shown[0].data["text/plain"]
    state = executed.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    biggest = max((len(json.dumps(m)) for m in state.get("state", {}).values()), default=0)
    assert biggest < 200_000, f"a widget model of {biggest} bytes stayed in the notebook"
