"""Launchers against real schedulers: a single-node Slurm (sbatch) and Debian's Open MPI (mpiexec).

Its tests that need no engines; the others are in tests/cluster/test_launchers.py.
"""

from __future__ import annotations

import time

import pytest

import dtwork
from dtwork.errors import DtworkError
from dtwork.launch import launchers
from dtwork.launch.launchers import LaunchOptions, SlurmLauncher


def test_ranks_and_gpus_follow_the_schedulers_ranks_and_local_ranks() -> None:
    """Two nodes x 2 GPUs: engines registered out of order get SLURM_PROCID's ranks, and local
    rank L the L-th GPU the allocation shows the engine (its CUDA_VISIBLE_DEVICES, here 2 and 3)."""
    from dtwork.launch.rendezvous import assign_ranks

    gpus = [{"index": 2, "uuid": "GPU-a"}, {"index": 3, "uuid": "GPU-b"}]
    hosts = {0: "n2", 1: "n1", 2: "n2", 3: "n1"}
    probes = {e: {"hostname": h, "pid": 100 + e, "gpus": gpus, "addresses": {}} for e, h in hosts.items()}
    found = {0: (3, 1), 1: (0, 0), 2: (2, 0), 3: (1, 1)}  # (SLURM_PROCID, SLURM_LOCALID) by engine
    plans = launchers.scheduler_plans(assign_ranks(probes, use_gpus=True), found, probes, use_gpus=True)
    assert [(p.rank, p.engine_id, p.hostname, p.local_rank, p.gpu) for p in plans] == [
        (0, 1, "n1", 0, 2),
        (1, 3, "n1", 1, 3),
        (2, 2, "n2", 0, 2),
        (3, 0, "n2", 1, 3),
    ]
    assert [p.gpu_uuid for p in plans] == ["GPU-a", "GPU-b", "GPU-a", "GPU-b"]
    one_gpu = {e: {**p, "gpus": gpus[:1]} for e, p in probes.items()}
    with pytest.raises(DtworkError, match="host n1 runs 2 engines but they can use 1 GPU"):
        launchers.scheduler_plans(assign_ranks(one_gpu, use_gpus=False), found, one_gpu, use_gpus=True)


def test_a_launch_that_needs_other_hosts_without_an_interface_fails_at_once(monkeypatch) -> None:
    from dtwork.launch.launchers import MPILauncher, SSHLauncher

    away = "elsewhere.example:2"
    for launcher in (SSHLauncher(LaunchOptions(hosts=away)), MPILauncher(LaunchOptions(hosts=away))):
        with pytest.raises(DtworkError, match=r"--hosts names elsewhere\.example, .*loopback.*--interface"):
            launcher.check_reach(None)
        launcher.check_reach("lo")  # named: the controller listens there
    SSHLauncher(LaunchOptions(hosts="localhost:2")).check_reach(None)  # this host only: loopback will do
    with pytest.raises(DtworkError, match=r"--nodes 2 starts engines on other hosts.*--interface"):
        SlurmLauncher(LaunchOptions(nodes=2)).check_reach(None)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    with pytest.raises(DtworkError, match=r"mpiexec runs in a Slurm allocation of 3 nodes"):
        MPILauncher().check_reach(None)
    t0 = time.monotonic()
    with pytest.raises(DtworkError, match=r"--launcher ssh: --hosts names elsewhere\.example"):
        dtwork.Cluster(2, launcher="ssh", launch_options=LaunchOptions(hosts=away))
    assert time.monotonic() - t0 < 5  # refused before any process starts


@pytest.mark.parametrize("name", ["DtworkSlurmEngineSetLauncher", "SrunEngineSetLauncher"])
def test_a_kept_slurm_clusters_file_names_its_engine_launcher_so_attach_can_load_it(name: str) -> None:
    """A cluster file records the engines' launcher class as ipyparallel abbreviates it; attaching to a
    kept cluster (``Cluster.from_file``) sets that string back on a cluster, which must import it."""
    import ipyparallel as ipp
    from ipyparallel.cluster.launcher import abbreviate_launcher_class

    cls = getattr(launchers, name)
    written = abbreviate_launcher_class(cls)
    cluster = ipp.Cluster(shutdown_atexit=False)
    cluster.engine_launcher_class = written  # as from_dict does with the file's engines.class
    assert cluster.engine_launcher_class is cls
