"""``python -m dtwork script NB.ipynb -o train.py``: a notebook's %%dtrain cells as a torchrun script.

Its tests that need engines (a cluster, a kernel, a process group across processes); the others are
in tests/unit/test_script_export.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
from torchrun_ref import torchrun

QUICKSTART = Path(__file__).parents[2] / "notebooks" / "quickstart.ipynb"


def test_quickstart_as_a_torchrun_script_reaches_the_notebooks_loss(cluster: Any, tmp_path: Path) -> None:
    nb = nbformat.read(QUICKSTART, as_version=4)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "%dtrain start -n 2 --global-batch-size 64" in sources  # what the cluster below mirrors
    script = tmp_path / "train.py"
    cmd = [sys.executable, "-m", "dtwork", "script", str(QUICKSTART), "-o", str(script)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    with script.open("a") as f:
        f.write("\nif ctx.rank == 0:\n    print('FINAL', repr(loss.item()))\n")
    out = torchrun(script, [], tmp_path, timeout=600)
    assert "test accuracy" in out and out.count("trained 120 steps") == 1  # --rank0 kept
    exported = float(out.split("FINAL ")[1].split()[0])

    cluster.configure({"global_batch_size": 64})
    try:
        for source in sources:
            if source.startswith("%%dtrain"):
                first, _, body = source.partition("\n")
                cluster.run(body, rank0="--rank0" in first)
        notebook = [float(v.detach()) for v in cluster.pull("loss")]
    finally:
        cluster.configure(None)
    assert abs(notebook[0] - exported) <= 1e-6, (notebook, exported)
