"""benchmarks/gpu/drive.py's plumbing with no engines: each check recorded as it ends, whatever befalls it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu import drive


def test_each_check_is_recorded_ok_skipped_failed_or_past_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(drive, "BUDGETS", {"slow": 0.05})  # x3 in a dry run
    d = drive.Drive(tmp_path, dry=True, budget=60)
    release = threading.Event()

    def slow(d: drive.Drive) -> dict[str, Any]:
        release.wait(5)
        return {}

    def fine(d: drive.Drive) -> dict[str, Any]:
        return {"steps_per_s": 12.5}

    def below(d: drive.Drive) -> dict[str, Any]:
        return {"ok": False, "ratio": 0.5}

    def broken(d: drive.Drive) -> dict[str, Any]:
        raise ValueError("bad shape")

    t0 = time.monotonic()
    for name, fn in [("fine", fine), ("below", below), ("broken", broken), ("slow", slow)]:
        d.run(name, fn)
    d.run("gpu_only", drive.kernel_no_cuda_context)  # a dry run has no GPU: skipped with the reason
    d.run("cluster", drive.fsdp_amp)  # no cluster was started
    release.set()
    assert time.monotonic() - t0 < 2
    doc = json.loads((tmp_path / "gpu.json").read_text())
    checks = doc["checks"]
    assert checks["fine"]["ok"] and checks["fine"]["numbers"] == {"steps_per_s": 12.5}
    assert not checks["below"]["ok"] and checks["below"]["numbers"] == {"ratio": 0.5}
    assert checks["broken"]["error"] == "ValueError: bad shape" and not checks["broken"]["ok"]
    assert checks["slow"]["error"].startswith("ran past its budget") and not checks["slow"]["ok"]
    assert checks["gpu_only"]["skipped"].startswith("dry run") and checks["cluster"]["skipped"].startswith(
        "no cluster"
    )
    assert doc["summary"] == {
        "failed": ["below", "broken", "slow"],
        "passed": ["fine"],
        "skipped": ["gpu_only", "cluster"],
    }
    assert doc["meta"]["dry_run"] is True
