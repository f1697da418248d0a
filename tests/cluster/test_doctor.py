"""``python -m dtwork doctor``: the installation check, run as a user runs it (a subprocess)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dtwork.commands import doctor

CPU_CHECKS = ["engines start", "process group", "DDP equivalence", "GNS known problem", "resume bitwise"]


GPU_CHECKS = [
    "NCCL engines start",
    "NVML per rank",
    "process group (GPU)",
    "DDP equivalence (GPU)",
    "resume bitwise (GPU)",
    "fp16 AMP + GNS",
    "bf16 AMP + GNS",
    "bf16 throughput",
]


def _doctor(*args: str, timeout: float = 300) -> tuple[int, dict[str, str], str]:
    """Run the command; return its exit status, the table's rows (check -> row) and its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "dtwork", "doctor", *args], capture_output=True, text=True, timeout=timeout
    )
    out = proc.stdout + proc.stderr
    head = next(i for i, line in enumerate(proc.stdout.splitlines()) if line.startswith("check "))
    rows = {}
    for line in proc.stdout.splitlines()[head + 1 :]:
        name = next((n for n in CPU_CHECKS + GPU_CHECKS if line.startswith(n + "  ")), None)
        if name is not None and name not in rows:
            rows[name] = line[len(name) :].strip()
    return proc.returncode, rows, out


def _status(row: str) -> str:
    return row.split()[0]


def _has_cuda() -> bool:
    return torch.cuda.is_available()


def test_doctor_passes_here_and_says_why_gpu_checks_are_skipped() -> None:
    code, rows, out = _doctor("--gpu")
    assert code == 0, out
    for name in CPU_CHECKS:
        assert _status(rows[name]) == "ok", out
    assert "max |DDP - one process|" in rows["DDP equivalence"] and "vs truth" in rows["GNS known problem"]
    for name in GPU_CHECKS:
        if _has_cuda():
            assert _status(rows[name]) == "ok", out
        else:
            assert _status(rows[name]) == "skip" and "has no CUDA" in rows[name], out
    assert out.rstrip().endswith("all checks ok" + ("" if _has_cuda() else f" ({len(GPU_CHECKS)} skipped)"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_doctor_gpu_checks_pass_on_a_cuda_machine() -> None:
    checks = {c.name: c for c in doctor.run(gpu=True, verbose=False)}
    for name in CPU_CHECKS + GPU_CHECKS:
        assert checks[name].status == "ok", (name, checks[name].detail)
    assert "TFLOP/s per rank" in checks["bf16 throughput"].detail
