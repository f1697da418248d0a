"""GPU leases across clusters (issue 48, item 1): real registry files in a private DTWORK_HOME, real
processes as the kernels that hold them, and real concurrent starts racing for the lock.

The starts through ``dtwork.start`` with a stand-in NVML are in tests/cluster/test_devices_cluster.py.
"""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dtwork.errors import DtworkError
from dtwork.kernel import kept
from dtwork.launch import leases, registry
from tests.unit import test_devices

fake_nvml = test_devices.fake_nvml  # a fixture, used by name
HOST = registry.this_host()


def gpu(i: int, mig: int | None = None) -> dict[str, Any]:
    if mig is None:
        return {"index": i, "uuid": f"GPU-{i:08x}-aaaa-bbbb-cccc-000000000000", "mig": False}
    return {"index": i, "uuid": f"MIG-{i:08x}-{mig:04x}-bbbb-cccc-000000000000", "mig": True}


VISIBLE = [gpu(0), gpu(1), gpu(2, 0), gpu(2, 1), gpu(3)]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DTWORK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def hold(cid: str, kernel: dict[str, Any] | None, devices: list[dict[str, Any]], **more: Any) -> None:
    registry.write(
        cid,
        {"kernel": kernel, "n": len(devices), "backend": "nccl", "notebook": "sweep.ipynb"}
        | {"gpus": {"host": HOST, "uuids": [d["uuid"] for d in devices]}}
        | more,
    )


def test_a_live_cluster_holds_its_gpus_and_a_dead_kernels_are_free(
    home: Path, sleeper: subprocess.Popen[bytes], dead_kernel: dict[str, Any]
) -> None:
    hold("dtwork-1-lease1", registry.proc_record(sleeper.pid), [gpu(0), gpu(2, 1)])
    hold("dtwork-1-lease2", dead_kernel, [gpu(1)])  # its kernel died, nothing keeps it
    elsewhere = {"host": "elsewhere", "uuids": [gpu(3)["uuid"]]}  # another host's GPU 3: not this one
    hold("dtwork-1-lease3", registry.proc_record(sleeper.pid), [], kernel_host="elsewhere", gpus=elsewhere)
    registry.write("dtwork-1-lease4", {"kernel": registry.proc_record(sleeper.pid), "n": 2})  # on CPU
    assert leases.free(VISIBLE, HOST) == [gpu(1), gpu(2, 0), gpu(3)]
    assert leases.free(VISIBLE, HOST, exclude="dtwork-1-lease1") == VISIBLE  # its own restart
    line = kept.describe(next(e for e in registry.entries() if e["cluster_id"] == "dtwork-1-lease1"))
    assert line.startswith("dtwork-1-lease1: 2 ranks, nccl holding 2 GPU(s), driven by")


def test_a_kept_cluster_waiting_for_attach_keeps_its_gpus(
    home: Path, sleeper: subprocess.Popen[bytes], dead_kernel: dict[str, Any]
) -> None:
    reaper = registry.proc_record(sleeper.pid)  # a live reaper: the keep time runs
    hold("dtwork-1-lease5", dead_kernel, [gpu(0)], keep=600, orphaned_at=time.time(), reaper=reaper)
    assert leases.free(VISIBLE, HOST) == VISIBLE[1:]
    with pytest.raises(DtworkError) as err:
        leases.usable(VISIBLE[:1], HOST, None, "auto")
    assert "cluster dtwork-1-lease5 (notebook sweep.ipynb, kept for %dtrain attach) holds GPU 0" in str(
        err.value
    )


def test_an_over_ask_is_refused_in_one_line_naming_the_holder_and_what_to_do(
    home: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    hold("dtwork-1-lease6", registry.proc_record(sleeper.pid), [gpu(0), gpu(1), gpu(2, 0)])
    t0 = time.monotonic()
    with pytest.raises(DtworkError) as err:
        leases.usable(VISIBLE, HOST, 4, "auto")
    assert time.monotonic() - t0 < 1.0
    text = str(err.value)
    assert "\n" not in text
    assert text == (
        "asked for 4 GPU ranks but 2 of this machine's 5 GPUs are free: cluster dtwork-1-lease6 "
        f"(notebook sweep.ipynb, kernel pid {sleeper.pid}) holds GPU 0, 1, 2 (MIG 00000002); "
        "use -n 2 or fewer, stop that cluster (dtwork clusters stop dtwork-1-lease6), "
        "or use --backend gloo for CPU ranks"
    )
    assert leases.usable(VISIBLE, HOST, 2, "auto") == 2  # what is free is granted
    assert leases.usable(VISIBLE, HOST, None, "auto") == 2  # -n left out: the free ones
    assert leases.usable(VISIBLE, HOST, 8, "gloo") == 2  # CPU ranks take no GPU: never refused


def test_no_free_gpu_refuses_a_gpu_start_rather_than_moving_it_to_cpu(
    home: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    hold("dtwork-1-lease7", registry.proc_record(sleeper.pid), VISIBLE)
    with pytest.raises(DtworkError, match="a start takes one rank per free GPU but 0 of this machine's 5"):
        leases.usable(VISIBLE, HOST, None, "auto")
    assert leases.usable([], HOST, None, "auto") == 0  # a machine without GPUs: CPU ranks as ever


def _take(cid: str, kernel: dict[str, Any], together: Any, out: Any) -> None:
    def write(lease: leases.Lease) -> None:
        time.sleep(0.2)  # a slow write: without the lock the others would read the same GPUs free
        hold(cid, kernel, [], gpus=lease)

    together.wait()  # every start reads the leases at once
    try:
        lease = leases.take(2, VISIBLE, HOST, cid, write)
        out.put((cid, lease["uuids"]))
    except DtworkError as exc:
        out.put((cid, str(exc)))


def test_starts_at_once_never_take_the_same_gpu(home: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """Five real processes reserve two GPUs each at once: two get disjoint pairs, the rest are refused."""
    registry.clusters_dir()
    ctx = mp.get_context("fork")  # the children share this import of dtwork: they start at once
    out, together = ctx.Queue(), ctx.Barrier(5)
    kernel = registry.proc_record(sleeper.pid)  # alive for the whole test: the leases hold
    procs = [ctx.Process(target=_take, args=(f"dtwork-1-race{i}", kernel, together, out)) for i in range(5)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    granted = [u for u in got.values() if isinstance(u, list)]
    refused = [t for t in got.values() if isinstance(t, str)]
    assert len(granted) == 2 and len(refused) == 3, got
    assert len({u for pair in granted for u in pair}) == 4  # no GPU given twice
    assert all("asked for 2 GPU ranks but 1 of this machine's 5 GPUs are free" in t for t in refused)
    assert sorted(leases.held(HOST)) == sorted(u for pair in granted for u in pair)


def test_pinning_sees_only_the_leased_devices_of_its_host() -> None:
    probes = {
        0: {"hostname": HOST, "gpus": VISIBLE},
        1: {"hostname": "other", "gpus": VISIBLE},
    }
    cut = leases.restrict(probes, {"host": HOST, "uuids": [gpu(3)["uuid"], gpu(1)["uuid"]]})
    assert cut[0]["gpus"] == [gpu(1), gpu(3)]  # NVML order kept
    assert cut[1]["gpus"] == VISIBLE  # another host's are its scheduler's
    assert probes[0]["gpus"] == VISIBLE  # the engines' own view is left as it was


def test_a_start_validates_against_the_free_gpus_before_anything_starts(
    home: Path, fake_nvml: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Through the real start path with a stand-in NVML (its five devices: VISIBLE): a second
    cluster's default size is the GPUs left, an over-ask fails at once naming the first."""
    from dtwork import Cluster

    hold("dtwork-1-lease8", registry.proc_record(sleeper.pid), [gpu(0), gpu(2, 0), gpu(2, 1)])
    assert Cluster().engines.n == 2  # one rank per free GPU
    t0 = time.monotonic()
    with pytest.raises(DtworkError, match="asked for 3 GPU ranks but 2 of this machine's 5 GPUs are free: "):
        Cluster(3).start()
    assert time.monotonic() - t0 < 1.0
    assert [e["cluster_id"] for e in registry.entries()] == ["dtwork-1-lease8"]  # nothing registered
    assert Cluster(3, backend="gloo").engines.n == 3  # CPU ranks
