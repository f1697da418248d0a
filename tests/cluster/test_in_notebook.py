"""Only a real kernel shell counts as a notebook (live view on, plain progress lines off)."""

from __future__ import annotations

import subprocess
import sys

# In a child: the kernel shell made here is process-wide state the other tests must not see.
CODE = """
from IPython.core.interactiveshell import InteractiveShell
from dtwork.kernel.watcher import in_notebook
InteractiveShell.instance()
print(in_notebook())
InteractiveShell.clear_instance()
from ipykernel.inprocess.manager import InProcessKernelManager
km = InProcessKernelManager()
km.start_kernel()
print(in_notebook())
"""


def test_a_plain_shell_is_no_notebook_and_a_kernel_shell_is() -> None:
    """A plain InteractiveShell (a test, a terminal) makes ``ZMQInteractiveShell.initialized()`` true
    through the singleton they share; ``in_notebook`` must still say no, and yes in a kernel."""
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]
