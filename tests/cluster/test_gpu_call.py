"""The prepared GPU call (benchmarks/gpu): its CPU dry run works end to end, and the real preparation
step yields a complete set of wheels for the GPU machine, small enough to travel with one call."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import background
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = [
    "environment",
    "start",
    "turns",
    "gpu_rows",
    "kernel_no_cuda_context",
    "gpu_lease",
    "mlp_profile",
    "fsdp_amp",
    "stop",
    "hooks",
    "doctor",
    "pytest_gpu",
]
GPU_ONLY = ["gpu_rows", "kernel_no_cuda_context", "gpu_lease", "hooks", "doctor", "pytest_gpu"]
LACKING = [
    "ipyparallel",
    "pyzmq",
    "ipykernel",
    "jupyter_client",
    "ipywidgets",
    "plotly",
    "nbformat",
    "dtwork",
]
IN_THE_IMAGE = ["torch", "numpy", "psutil", "pyyaml", "nvidia_ml_py", "pytest", "hypothesis"]


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run in its own process group, so that a hang is ended with the engines it started."""
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = background.wait(proc, timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def test_the_dry_run_records_every_check_and_skips_the_gpu_ones_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHONPATH": str(ROOT)}
    env |= {"DTWORK_HOME": str(tmp_path / "home"), "DTWORK_STORE": str(tmp_path / "runs.sqlite")}
    proc = _run(["bash", "benchmarks/gpu/run.sh", "--dry-run"], env, timeout=540)  # a hang guard
    assert proc.returncode == 0, proc.stdout[-4000:]
    doc = json.loads((tmp_path / "out" / "gpu.json").read_text())
    assert list(doc["checks"]) == CHECKS and doc["meta"]["dry_run"] is True
    assert doc["summary"]["failed"] == [] and doc["summary"]["skipped"] == GPU_ONLY
    for name in GPU_ONLY:
        assert doc["checks"][name]["skipped"].startswith("dry run"), doc["checks"][name]
    turns = doc["checks"]["turns"]["numbers"]
    assert turns["mlp"]["ratio"] > 0 and turns["mlp"]["cycles"] == 2, turns
    assert all(v > 0 for v in turns["gpt"]["tokens_per_s"].values()) and turns["gpt"]["params"] > 0, turns
    assert {"none", "bf16"} <= set(doc["checks"]["fsdp_amp"]["numbers"])
    log = (tmp_path / "out" / "gpu.log").read_text()
    assert "run.sh: exit 0" in log and "turns: ok" in log


def _index_unreachable() -> str | None:
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/") + "/pip/"
    try:
        urllib.request.urlopen(url, timeout=10).close()
    except OSError as exc:
        return f"the package index is unreachable ({url}: {exc}): prepare.sh needs it"
    return None


@pytest.mark.skipif(bool(_index_unreachable()), reason=_index_unreachable() or "")
def test_prepare_fetches_a_complete_set_of_what_the_gpu_machine_lacks() -> None:
    code, out, folder = background.result(
        "test_prepare_fetches_a_complete_set_of_what_the_gpu_machine_lacks", timeout=400
    )  # begun at collection (tests/conftest.py)
    assert code == 0, out[-4000:]
    assert "complete.py: " in out and ": complete" in out, out[-2000:]
    names = {p.name.split("-")[0].lower() for p in folder.glob("*.whl")}
    assert set(LACKING) <= names, sorted(names)
    assert not set(IN_THE_IMAGE) & names, sorted(names)
    assert [p.name for p in folder.glob("dtwork-*.whl")] == ["dtwork-0.1.0-py3-none-any.whl"]  # pure Python
    assert sum(p.stat().st_size for p in folder.glob("*.whl")) < 60 * 2**20
