"""A real IPython kernel through jupyter_client, as a notebook server starts one: its own dtwork
home and run store, the dtwork under test first on its path (shared by the tests of kernels)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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


class Notebook:
    """A real IPython kernel with dtwork and a 2-rank cluster, driven through jupyter_client."""

    def __init__(self, home: Path) -> None:
        self.km, self.kc = start_kernel(home)
        self.kc.wait_for_ready(timeout=120)

    def run(
        self,
        code: str,
        answers: Callable[[str], str] | None = None,
        timeout: float = 240,
        heard: Callable[[str], object] | None = None,
    ) -> str:
        """Execute ``code`` as a notebook cell; ``answers`` replies to each input prompt, ``heard``
        sees each output as it comes; its output (streams and errors), failing the test on an error
        reply."""
        out: list[str] = []

        def output(msg: dict[str, Any]) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
                if heard is not None:
                    heard("".join(out))
            elif msg["msg_type"] == "error":
                out.append("\n".join(content["traceback"]))

        def stdin(msg: dict[str, Any]) -> None:
            assert answers is not None, f"unexpected prompt {msg['content']['prompt']!r}"
            self.kc.input(answers(msg["content"]["prompt"]))

        reply = self.kc.execute_interactive(
            code, allow_stdin=True, stdin_hook=stdin, output_hook=output, timeout=timeout
        )
        text = "".join(out)
        assert reply["content"]["status"] == "ok", text
        return text

    def fails(self, code: str, timeout: float = 240) -> str:
        """Execute ``code`` that must fail; its error's text."""
        with pytest.raises(AssertionError) as failed:
            self.run(code, timeout=timeout)
        return str(failed.value)

    def close(self, stop: bool = True) -> None:
        """Stop its cluster (``stop``), then the kernel (one already dead: only its resources)."""
        try:
            if stop:
                self.run("%dtrain stop", timeout=120)
        finally:
            self.kc.stop_channels()
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:
                self.km.cleanup_resources()
