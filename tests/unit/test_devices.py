"""Device choice from NVML facts and the environment: the pure rules, then real 2-engine starts
whose engines see a stand-in NVML (tests/fixtures/fake_nvml) with this machine's CPU-only torch."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from dtwork.errors import DtworkError
from dtwork.launch import rendezvous
from dtwork.shared import devices, telemetry

FAKE = Path(__file__).parents[1] / "fixtures" / "fake_nvml"


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-aaaa-bbbb-cccc-000000000000"


def mig(i: int, k: int) -> str:
    return f"MIG-{i:08x}-{k:04x}-bbbb-cccc-000000000000"


# Four GPUs in PCI order; GPU 2 runs MIG with two instances.
FACTS: dict[str, Any] = {
    "driver": "550.54.15",
    "gpus": [
        {"name": "NVIDIA H100 80GB HBM3", "uuid": uuid(0), "memory_mb": 81559},
        {"name": "NVIDIA H100 80GB HBM3", "uuid": uuid(1), "memory_mb": 81559},
        {
            "name": "NVIDIA A100-SXM4-40GB",
            "uuid": uuid(2),
            "memory_mb": 40960,
            "mig": [
                {"name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "uuid": mig(2, 0), "memory_mb": 19968},
                {"name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "uuid": mig(2, 1), "memory_mb": 19968},
            ],
        },
        {"name": "NVIDIA H100 80GB HBM3", "uuid": uuid(3), "memory_mb": 81559},
    ],
}


def dev(index: int, u: str, is_mig: bool = False) -> dict[str, Any]:
    return {"index": index, "name": "x", "uuid": u, "memory_total_mb": 1.0, "driver": "d", "mig": is_mig}


DEVICES = [
    dev(0, uuid(0)),
    dev(1, uuid(1)),
    dev(2, mig(2, 0), True),
    dev(2, mig(2, 1), True),
    dev(3, uuid(3)),
]


def uuids(ds: list[dict[str, Any]]) -> list[str]:
    return [d["uuid"] for d in ds]


# -- the pure rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, [uuid(0), uuid(1), mig(2, 0), mig(2, 1), uuid(3)]),
        ({"CUDA_VISIBLE_DEVICES": "3,1"}, [uuid(3), uuid(1)]),  # integers: PCI order, the given order kept
        ({"CUDA_VISIBLE_DEVICES": "1,7,0"}, [uuid(1)]),  # CUDA stops at the first bad entry
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": f"{uuid(3)},{uuid(0)[:12]}"}, [uuid(3), uuid(0)]),  # UUIDs, prefixes
        ({"CUDA_VISIBLE_DEVICES": mig(2, 1)}, [mig(2, 1)]),  # a MIG instance by its UUID
        ({"CUDA_VISIBLE_DEVICES": "2"}, [mig(2, 0)]),  # a MIG GPU by index: its first instance
        ({"SLURM_STEP_GPUS": "1,3"}, [uuid(1), uuid(3)]),
        ({"SLURM_JOB_GPUS": "0-1"}, [uuid(0), uuid(1)]),
        ({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"}, [uuid(1), uuid(3)]),  # cgroup-relative
        ({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "3"}, [uuid(3)]),  # physical, one per task
    ],
)
def test_visible_devices_follow_cuda_and_slurm(env: dict[str, str], expected: list[str]) -> None:
    assert uuids(devices.visible(DEVICES, env)) == expected


def test_each_engine_is_pinned_from_its_own_list() -> None:
    shared = [DEVICES[0], DEVICES[1]]
    assert uuids(devices.pin("h", [shared, shared], [None, None])) == [uuid(0), uuid(1)]
    # Per-task binding: each engine sees only its own GPU (the first engine's list is not the host's).
    assert uuids(devices.pin("h", [[DEVICES[4]], [DEVICES[1]]], [0, 1])) == [uuid(3), uuid(1)]
    # Slurm's local ids decide who gets which entry of a shared list.
    assert uuids(devices.pin("h", [shared, shared], [1, 0])) == [uuid(1), uuid(0)]
    with pytest.raises(DtworkError, match="host h runs 2 engines but they can use 1 GPU"):
        devices.pin("h", [[DEVICES[0]], [DEVICES[0]]], [None, None])


def test_assign_ranks_pins_by_uuid_per_engine() -> None:
    probes = {
        1: {"hostname": "a", "pid": 10, "gpus": [DEVICES[3]], "slurm_localid": None},
        2: {"hostname": "a", "pid": 11, "gpus": [DEVICES[2]], "slurm_localid": None},
    }
    plans = rendezvous.assign_ranks(probes, use_gpus=True)
    assert [(p.gpu, p.gpu_uuid) for p in plans] == [(2, mig(2, 1)), (2, mig(2, 0))]


@pytest.mark.parametrize(
    ("requested", "torch_cuda", "outcome"),
    [
        ("auto", True, ("nccl", None)),
        ("auto", False, ("gloo", "NVML sees GPUs but torch has no CUDA on a (torch 2.x+cpu)")),
        ("gloo", True, ("gloo", None)),
        ("nccl", True, ("nccl", None)),
        ("nccl", False, "--backend nccl needs a CUDA build of torch, and torch has no CUDA on a"),
    ],
)
def test_backend_needs_cuda_torch_on_every_engine(requested: str, torch_cuda: bool, outcome: Any) -> None:
    probes = {
        i: {"hostname": "a", "gpus": DEVICES[:1], "torch": "2.x+cpu", "torch_cuda": torch_cuda}
        for i in (1, 2)
    }
    if isinstance(outcome, str):
        with pytest.raises(DtworkError) as info:
            devices.choose_backend(requested, probes)
        assert str(info.value).startswith(outcome) and "\n" not in str(info.value)
        return
    backend, note = devices.choose_backend(requested, probes)
    assert backend == outcome[0]
    assert (note is None) if outcome[1] is None else note.startswith(outcome[1])


def test_cpu_hosts_choose_gloo_quietly_and_refuse_nccl() -> None:
    probes = {1: {"hostname": "a", "gpus": []}}
    assert devices.choose_backend("auto", probes) == ("gloo", None)
    with pytest.raises(DtworkError, match="NVML sees none for the engines on a: use --backend gloo"):
        devices.choose_backend("nccl", probes)


def test_rank_environment() -> None:
    env = devices.rank_environment(mig(2, 1))
    assert env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "CUDA_VISIBLE_DEVICES": mig(2, 1),
    }


# -- a stand-in NVML, for the kernel and its engines ----------------------------------------------


@pytest.fixture()
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(FACTS))
    monkeypatch.setenv("DTWORK_FAKE_NVML", str(path))
    # A registry of its own: the stand-in GPUs are every test's, and a lease that a test on another
    # xdist worker holds on them for a moment would change this test's GPUs (launch.leases).
    monkeypatch.setenv("DTWORK_HOME", str(tmp_path / "dtwork-home"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")]))
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(telemetry, "_state", {"tried": False, "ok": False})
    return path


def test_telemetry_lists_mig_instances_in_place_of_their_gpu(fake_nvml: Path) -> None:
    assert [g.index for g in telemetry.gpu_inventory()] == [0, 1, 2, 3]
    found = telemetry.cuda_devices()
    assert [(g.index, g.uuid, g.mig) for g in found] == [
        (0, uuid(0), False),
        (1, uuid(1), False),
        (2, mig(2, 0), True),
        (2, mig(2, 1), True),
        (3, uuid(3), False),
    ]
    assert found[2].name.endswith("MIG 3g.20gb") and found[2].driver == "550.54.15"


def test_host_addresses_are_this_hosts_ipv4_addresses_by_interface() -> None:
    """One lookup for the kernel (rendezvous.interface_address) and the engines (entry.probe)."""
    found = devices.host_addresses()
    assert any("127.0.0.1" in ips for ips in found.values()), found
    assert all(isinstance(ip, str) and ip.count(".") == 3 for ips in found.values() for ip in ips)
    loopback = next(name for name, ips in found.items() if "127.0.0.1" in ips)
    assert rendezvous.interface_address(loopback) == "127.0.0.1"
