"""The sidebar in a real JupyterLab and headless Chromium: runs the Galata/Playwright suite.

Opt in with ``DTWORK_BROWSER_TESTS=1``: then ``extension/ui-tests/run.sh`` installs what is
missing (Chromium from Debian, the node modules), rebuilds the extension and runs
``playwright test``, as a background job begun when the tests are collected; screenshots and
traces land in ``extension/ui-tests/test-results/``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import background
import pytest

REPO = Path(__file__).resolve().parents[2]
UI_TESTS = REPO / "extension" / "ui-tests"
CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
TIMEOUT_S = 1200


def _missing() -> list[str]:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"Chromium ({CHROMIUM})")
    if not (UI_TESTS / "node_modules" / "@jupyterlab" / "galata").is_dir():
        missing.append("the ui-tests node modules (extension/ui-tests/node_modules)")
    if shutil.which("node") is None or shutil.which("jlpm") is None:
        missing.append("node and jlpm on PATH")
    return missing


def test_panel_in_browser() -> None:
    missing = _missing()
    if os.environ.get("DTWORK_BROWSER_TESTS") != "1":
        have = f"missing here: {', '.join(missing)}" if missing else "Chromium and node modules are present"
        pytest.skip(
            "browser tests run only with DTWORK_BROWSER_TESTS=1 "
            f"(bash extension/ui-tests/run.sh installs Chromium and the node modules; {have})"
        )
    if shutil.which("node") is None or shutil.which("jlpm") is None:
        pytest.skip("browser tests need node and jlpm on PATH (jlpm comes with jupyterlab)")
    # begun when the tests were collected (tests/background.py): it waits on its own server and browser
    code, out, _ = background.result("test_panel_in_browser", timeout=TIMEOUT_S)
    lines = [line for line in out.splitlines() if not line.startswith("[WebServer]")]
    assert code == 0, "playwright suite failed:\n" + "\n".join(lines[-80:])
    assert any(" passed" in line for line in lines), "\n".join(lines[-40:])
