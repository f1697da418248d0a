"""The sidebar's TypeScript passes prettier and eslint (``jlpm run lint:check`` in extension/).

Runs wherever the extension's node modules hold the linters; with ``DTWORK_BROWSER_TESTS=1`` (as in
CI) it installs them first when missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import node_modules
import pytest

EXTENSION = Path(__file__).resolve().parents[2] / "extension"
LINTERS = ("eslint", "prettier", "typescript-eslint")


def _linters_missing() -> list[str]:
    return [name for name in LINTERS if not (EXTENSION / "node_modules" / name).is_dir()]


def test_extension_passes_prettier_and_eslint() -> None:
    if shutil.which("jlpm") is None or shutil.which("node") is None:
        pytest.skip("the extension's linters need node and jlpm on PATH (jlpm comes with jupyterlab)")
    if os.environ.get("DTWORK_BROWSER_TESTS") == "1":
        node_modules.install(EXTENSION)  # under the lock: the browser suite may be installing there now
    elif _linters_missing():
        pytest.skip(
            f"extension/node_modules lacks {', '.join(_linters_missing())}: run `cd extension && jlpm "
            "install` (or set DTWORK_BROWSER_TESTS=1, which installs them)"
        )
    proc = subprocess.run(
        ["jlpm", "run", "lint:check"], cwd=EXTENSION, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (
        "`cd extension && jlpm lint` fixes formatting and what eslint can:\n"
        + proc.stdout[-4000:]
        + proc.stderr[-2000:]
    )
    assert "All matched files use Prettier code style" in proc.stdout
