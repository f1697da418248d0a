"""``python -m dtwork doctor``: the installation check, run as a user runs it (a subprocess).

Its tests that need no engines; the others are in tests/cluster/test_doctor.py.
"""

from __future__ import annotations

import pytest

from dtwork.commands import doctor


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("Tesla T4", None),
    ],
)
def test_peak_by_device_name(name: str, peak: float | None) -> None:
    assert doctor.peak_tflops(name) == peak


def test_a_check_that_raises_is_one_failed_line() -> None:
    doc = doctor.Doctor()

    def broken() -> tuple[bool, str]:
        raise RuntimeError("NCCL error: unhandled system error\nmore lines")

    assert not doc.check("process group", broken)
    assert doc.check("fine", lambda: (True, "yes"))
    doc.skip("bf16 throughput", "skipped: no CUDA")
    text = doctor.table(doc.checks)
    lines = text.splitlines()
    assert lines[0].split() == ["check", "result", "time", "detail"]
    assert lines[1].split()[:3] == ["process", "group", "FAIL"]
    assert lines[1].endswith("RuntimeError: NCCL error: unhandled system error")
    assert lines[3].split()[:3] == ["bf16", "throughput", "skip"]


def test_a_rank_failure_keeps_the_ranks_exception() -> None:
    from dtwork.errors import RankFailure

    exc = RankFailure(
        "dtwork: the cell failed on rank 1\nTraceback ...\n  File x\nValueError: bad shape\nrank 0: ok"
    )
    assert doctor.one_line(exc) == "RankFailure: dtwork: the cell failed on rank 1 (ValueError: bad shape)"
