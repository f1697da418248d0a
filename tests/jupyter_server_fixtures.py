"""pytest-jupyter's server fixtures, for the modules that test dtwork's server extension.

Its plugin is not registered for the whole suite: its autouse fixtures (a fresh event loop and a
ServerApp clean-up around every test) and its async-test hooks would then apply to every test.
A module takes the fixtures with ``globals().update(server_fixtures())``.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_jupyter.jupyter_server as _jp

NAMES = (
    "echo_kernel_spec",
    "http_server",
    "http_server_client",
    "http_server_port",
    "io_loop",
    "jp_argv",
    "jp_auth_header",
    "jp_base_url",
    "jp_config_dir",
    "jp_configurable_serverapp",
    "jp_data_dir",
    "jp_env_config_path",
    "jp_env_jupyter_path",
    "jp_environ",
    "jp_extension_environ",
    "jp_fetch",
    "jp_home_dir",
    "jp_http_port",
    "jp_kernel_dir",
    "jp_logging_stream",
    "jp_nbconvert_templates",
    "jp_root_dir",
    "jp_runtime_dir",
    "jp_serverapp",
    "jp_system_config_path",
    "jp_system_jupyter_path",
    "jp_template_dir",
    "jp_web_app",
)
AUTOUSE = ("jp_asyncio_loop", "jp_server_cleanup")


def server_fixtures(autouse: bool = True) -> dict[str, Any]:
    """The fixtures by name. ``autouse=False``: the two autouse ones become plain fixtures, used
    only by the tests that need a server (for a module whose other tests must not get them)."""
    fixtures = {name: getattr(_jp, name) for name in NAMES}
    for name in AUTOUSE:
        fixture = getattr(_jp, name)
        fixtures[name] = fixture if autouse else pytest.fixture(fixture.__wrapped__)
    return fixtures
