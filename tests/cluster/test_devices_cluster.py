"""Device choice from NVML facts and the environment: the pure rules, then real 2-engine starts
whose engines see a stand-in NVML (tests/fixtures/fake_nvml) with this machine's CPU-only torch.

Its tests that need engines (a cluster, a kernel, a process group across processes); the others are
in tests/unit/test_devices.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dtwork.errors import DtworkError, DtworkWarning
from dtwork.launch import rendezvous
from tests.unit import test_devices as unit_tests
from tests.unit.test_devices import mig, uuid, uuids

fake_nvml = unit_tests.fake_nvml  # a fixture, used by name


def _start(**kwargs: Any) -> Any:
    import dtwork

    return dtwork.start(timeout=60, **kwargs)


def _engine_env(c: Any) -> list[tuple[str | None, str | None]]:
    c.run(
        "import os; _env = (os.environ.get('CUDA_DEVICE_ORDER'), os.environ.get('TORCH_NCCL_ASYNC_ERROR_HANDLING'))",
        quiet=True,
    )
    return [tuple(e) for e in c.pull("_env")]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"CUDA_VISIBLE_DEVICES": f"{uuid(3)},{mig(2, 1)}"}, [uuid(3), mig(2, 1)]),
        ({"SLURM_STEP_GPUS": "1,3"}, [uuid(1), uuid(3)]),
    ],
    ids=["uuid+mig", "slurm"],
)
def test_cpu_torch_on_a_gpu_host_trains_with_gloo_and_says_so(
    fake_nvml: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: list[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.warns(
        DtworkWarning, match="NVML sees GPUs but torch has no CUDA on .*training on CPU with gloo"
    ):
        c = _start()  # -n from the GPUs the kernel may use: its own CUDA_VISIBLE_DEVICES / Slurm binding
    try:
        assert c.world_size == 2 and c.backend == "gloo"
        assert [r["device"] for r in c.rank_info] == ["cpu", "cpu"]
        probes = [c.probes[r["engine_id"]] for r in c.rank_info]
        assert [uuids(p["gpus"]) for p in probes] == [expected, expected]  # each engine's own view
        assert [p["torch_cuda"] for p in probes] == [False, False]
        # The pinning these engines get with a CUDA torch: one device each, by UUID.
        plans = rendezvous.assign_ranks(dict(c.probes), use_gpus=True)
        assert [p.gpu_uuid for p in plans] == expected
        assert _engine_env(c) == [("PCI_BUS_ID", "1")] * 2
    finally:
        c.stop()


def test_cpu_torch_on_a_gpu_host_refuses_nccl_in_one_line(
    fake_nvml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(DtworkError) as info:
        _start(backend="nccl")
    text = str(info.value)
    assert text.startswith("--backend nccl needs a CUDA build of torch, and torch has no CUDA on ")
    assert "use --backend gloo" in text and "\n" not in text
