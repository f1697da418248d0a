"""A real IPython kernel through jupyter_client, as a notebook server starts one: its own dtwork
home and run store, the dtwork under test first on its path (shared by the tests of kernels)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dtwork

ROOT = Path(dtwork.__file__).resolve().parents[1]  # the dtwork the kernels import: the one tested here


def start_kernel(home: Path) -> tuple[Any, Any]:  # jupyter_client's KernelManager and its client
    """Start a kernel whose cwd is ``home``; its manager and a client with its channels started."""
    from jupyter_client.manager import KernelManager

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "DTWORK_HOME": str(home),
        "DTWORK_STORE": str(home / "runs.sqlite"),
    }
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(home))
    kc = km.client()
    kc.start_channels()
    return km, kc
