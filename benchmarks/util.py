"""Helpers: the machine and versions, a real ipykernel to drive, silenced output, free ports, clean exits."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import queue
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dtwork", "torch", "ipyparallel", "pyzmq", "ipykernel", "plotly", "accelerate", "lightning")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z")


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Send this process's Python-level stdout (a cell's output, widget reprs) to /dev/null."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that ``finally`` blocks stop the engines this process started."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def git_commit() -> str | None:
    """The commit measured, with "+" when the checkout has uncommitted changes; None outside git."""
    cmd = ["git", "-C", str(ROOT), "describe", "--always", "--dirty=+"]
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    return None


def machine() -> dict[str, Any]:
    import psutil

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.lower().startswith("model name")), cpu)
    out = dict(platform=platform.platform(), cpu_model=cpu, logical_cpus=psutil.cpu_count(logical=True))
    memory = round(psutil.virtual_memory().total / 2**30, 1)
    out |= dict(physical_cpus=psutil.cpu_count(logical=False), memory_gib=memory)
    return out | {"load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def versions() -> dict[str, Any]:
    def version(pkg: str) -> str | None:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(pkg)
        return None

    return {"python": platform.python_version(), **{pkg: version(pkg) for pkg in PACKAGES}}


class Kernel:
    """A fresh ipykernel whose published messages this process reads, as a notebook server would."""

    def __init__(self, cwd: os.PathLike[str] | str) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), startup_timeout=120)

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def run(self, code: str, timeout: float) -> tuple[Any, dict[str, int]]:
        """Run ``code``, which prints ``RESULT <json>``; return that value and the messages seen, by type."""
        msg_id, deadline = self.kc.execute(code, store_history=False), time.monotonic() + timeout
        counts: dict[str, int] = {}
        text: list[str] = []
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"the kernel ran past {timeout:.0f} s") from None
            kind = msg["msg_type"]
            counts[kind] = counts.get(kind, 0) + 1
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if kind == "stream":
                chunk = msg["content"].get("text", "")
                text.append(chunk)
                if msg["content"].get("name") == "stderr":  # the progress lines, as they come
                    sys.stderr.write(chunk)
            elif kind == "error":
                text.append("\n".join(msg["content"].get("traceback", [])))
            elif kind == "status" and msg["content"].get("execution_state") == "idle":
                break
        out = "".join(text)
        line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError("the kernel did not report a result:\n" + out[-3000:])
        return json.loads(line[len("RESULT ") :]), counts
