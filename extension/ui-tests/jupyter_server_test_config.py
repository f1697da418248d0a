"""Jupyter server for the Galata browser tests: `jupyter lab --config jupyter_server_test_config.py`.

Galata's settings (port 8888, no token, a temporary root) plus dtwork: the server extension
on, the labextension loaded from this tree's build (dtwork/labextension) ahead of any
installed copy, and a private cluster registry and run store shared by server and kernels.
"""

import os
import tempfile
from pathlib import Path

from jupyterlab.galata import configure_jupyter_server

c = get_config()  # noqa: F821

configure_jupyter_server(c)
c.LabApp.news_url = None
c.ServerApp.allow_root = True  # CI runs as root
c.ServerApp.jpserver_extensions.update({"dtwork": True})

REPO = Path(__file__).resolve().parents[2]
STATE = Path(tempfile.mkdtemp(prefix="dtwork-ui-tests-"))

# Kernels (and their engines) inherit these: the run store the kernel writes is the one
# the server extension reads, wherever the test notebook sits.
os.environ["DTWORK_HOME"] = str(STATE / "home")
os.environ["DTWORK_STORE"] = str(STATE / "runs.sqlite")

labextensions = STATE / "labextensions"
labextensions.mkdir()
(labextensions / "dtwork").symlink_to(REPO / "dtwork" / "labextension", target_is_directory=True)
galata_path = c.LabServerApp.extra_labextensions_path
c.LabServerApp.extra_labextensions_path = [str(labextensions), str(galata_path)]
