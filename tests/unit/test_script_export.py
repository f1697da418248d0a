"""``python -m dtwork script NB.ipynb -o train.py``: a notebook's %%dtrain cells as a torchrun script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from dtwork.commands.script_export import notebook_to_script
from dtwork.errors import DtworkError


def _notebook(tmp_path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_cell_options_and_run_become_python(tmp_path: Path) -> None:
    path = _notebook(
        tmp_path,
        "%load_ext dtwork\n%dtrain start --config exp.yaml --backend gloo",
        "%%dtrain --ranks 0\ntext = '''two\nlines'''\nfor i in range(2):\n    print(i)",
        "%%dtrain\n%run train.py --epochs 3",
        "%dtrain config other.yaml",
        "x = cluster.pull('a')\nprint(x)",
    )
    text = notebook_to_script(path)
    assert "context_from_env(global_batch_size=None, config='exp.yaml', backend='gloo')" in text
    assert (
        "if ctx.rank in (0,):\n    text = '''two\nlines'''\n    for i in range(2):\n        print(i)" in text
    )
    assert "run_script('train.py', ['--epochs', '3'], namespace=globals())" in text
    assert "ctx.configure('other.yaml')" in text
    assert "#   cell 5: x = cluster.pull('a') ..." in text
    compile(text, "train.py", "exec")


def test_ipython_syntax_in_a_rank_cell_is_refused(tmp_path: Path) -> None:
    path = _notebook(tmp_path, "%%dtrain\n%time y = 1")
    with pytest.raises(DtworkError, match="cell 1 uses IPython syntax"):
        notebook_to_script(path)


def test_the_cli_says_what_is_wrong(tmp_path: Path) -> None:
    path = _notebook(tmp_path, "print('kernel only')")
    cmd = [sys.executable, "-m", "dtwork", "script", str(path), "-o", str(tmp_path / "t.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "has no %%dtrain cell" in proc.stderr
    assert not (tmp_path / "t.py").exists()
