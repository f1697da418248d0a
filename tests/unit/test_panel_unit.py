"""The panel's data handling (vitest), run with the browser tests: ``DTWORK_BROWSER_TESTS=1``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import node_modules
import pytest

EXTENSION = Path(__file__).resolve().parents[2] / "extension"


def test_panel_unit_tests() -> None:
    if os.environ.get("DTWORK_BROWSER_TESTS") != "1":
        pytest.skip("the extension's unit tests run with DTWORK_BROWSER_TESTS=1 (they need its node modules)")
    if shutil.which("jlpm") is None or shutil.which("node") is None:
        pytest.skip("the extension's unit tests need node and jlpm on PATH (jlpm comes with jupyterlab)")
    node_modules.install(EXTENSION)
    proc = subprocess.run(["jlpm", "test"], cwd=EXTENSION, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout
