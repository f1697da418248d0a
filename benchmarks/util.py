"""Small helpers: statistics, silencing output, free ports, clean exits, machine facts."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import socket
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

MB = 1024.0 * 1024.0


class Kernel:
    """A fresh ipykernel (jupyter_client) in ``cwd``, whose published messages this process reads
    as a notebook server would: ``run`` executes code that prints one line ``RESULT <json>``."""

    def __init__(self, cwd: os.PathLike[str] | str) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), startup_timeout=120)

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def run(self, code: str, timeout: float, echo_stderr: bool = False) -> tuple[Any, dict[str, int]]:
        """Run ``code``; return its RESULT (decoded) and the messages published meanwhile, by type
        (``comm_msg``: widget updates). ``echo_stderr``: copy the code's stderr here as it comes."""
        import json
        import queue

        msg_id = self.kc.execute(code, store_history=False)
        counts: dict[str, int] = {}
        text: list[str] = []
        errors: list[str] = []
        deadline = time.monotonic() + timeout
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
                if echo_stderr and msg["content"].get("name") == "stderr":
                    sys.stderr.write(chunk)
                    sys.stderr.flush()
            elif kind == "error":
                errors.append("\n".join(msg["content"].get("traceback", [])))
            elif kind == "status" and msg["content"].get("execution_state") == "idle":
                break
        line = next((ln for ln in "".join(text).splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(
                "the kernel did not report a result:\n" + ("\n".join(errors) or "".join(text))[-3000:]
            )
        return json.loads(line[len("RESULT ") :]), counts


def median(values: Sequence[float]) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(vals) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return float(a) / float(b)


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Ratios of measurements taken side by side (a[i] next to b[i])."""
    return [float(x) / float(y) for x, y in zip(a, b, strict=False) if y]


def bootstrap_ci(
    a: Sequence[float], b: Sequence[float] | None = None, n: int = 2000, seed: int = 0
) -> list[float] | None:
    """95% percentile-bootstrap interval of median(a), or of median(a) / median(b) (resampled apart).

    With 3-7 samples this is rough, but it says how far the noise of a shared machine reaches.
    """
    import random

    a = [float(x) for x in a]
    bb = [float(x) for x in b] if b is not None else None
    if len(a) < 2 or (bb is not None and len(bb) < 2):
        return None
    rng = random.Random(seed)
    stats = []
    for _ in range(n):
        m = statistics.median(rng.choices(a, k=len(a)))
        if bb is not None:
            d = statistics.median(rng.choices(bb, k=len(bb)))
            m = m / d if d else float("nan")
        stats.append(m)
    stats.sort()
    return [stats[int(0.025 * (n - 1))], stats[int(0.975 * (n - 1))]]


# two-sided 95% quantiles of Student's t, by degrees of freedom (1-30)
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def geometric_mean_ci(ratios: Sequence[float]) -> tuple[float | None, list[float] | None]:
    """Geometric mean of independent ratios and its 95% t-interval (computed on their logarithms)."""
    import math

    logs = [math.log(float(x)) for x in ratios if x and x > 0]
    if not logs:
        return None, None
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(m), None
    half = _T975[min(len(logs) - 1, len(_T975)) - 1] * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(m), [math.exp(m - half), math.exp(m + half)]


def summarize(runs: Sequence[float]) -> dict[str, Any]:
    vals = [float(v) for v in runs]
    return {
        "runs": vals,
        "median": median(vals),
        "min": min(vals) if vals else None,
        "max": max(vals) if vals else None,
    }


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Send this process's Python-level stdout to /dev/null (a cell's output, widget reprs)."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so that ``finally`` blocks stop the engines we started."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, handler)


class Timer:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0


def version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict[str, Any]:
    import psutil

    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "logical_cpus": psutil.cpu_count(logical=True),
        "physical_cpus": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "load_average_at_start": load_average(),
        "gpu": "none visible (NVML: no GPU)" if not _has_gpu() else "present",
    }


def _has_gpu() -> bool:
    try:
        from dtwork import telemetry

        return telemetry.gpu_count() > 0
    except Exception:
        return False


def versions() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        **{
            pkg: version(pkg)
            for pkg in (
                "dtwork",
                "torch",
                "ipyparallel",
                "pyzmq",
                "ipykernel",
                "plotly",
                "psutil",
                "accelerate",
                "lightning",
            )
        },
    }


def save_result(
    out: Path, name: str, prog: str, argv: list[str] | None, started: str, fields: dict[str, Any]
) -> Path:
    """Write a standalone benchmark's ``out/name``: its command line (``prog`` and ``argv``, or this
    process's arguments), when it started, the machine, the versions, then ``fields``; return the path."""
    args = sys.argv[1:] if argv is None else argv
    result = {
        "command": prog + "".join(f" {a}" for a in args),
        "started": started,
        "machine": machine(),
        "versions": versions(),
        **fields,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return path
