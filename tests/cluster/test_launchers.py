"""Launchers against real schedulers: a single-node Slurm (sbatch) and Debian's Open MPI (mpiexec).

Every cluster here is real: engines start as the tasks of a Slurm job or of mpiexec, join a gloo
group, train, and leave nothing behind (no job in squeue, no process).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
from slurm_fixtures import openmpi, slurm, squeue_jobs, wait_for  # noqa: F401  (fixtures used by name)
from test_core import assert_equals_one_process, ddp_cell

import dtwork
from dtwork.errors import DtworkError
from dtwork.launch import launchers, registry
from dtwork.launch.launchers import LaunchOptions, SlurmLauncher

STEPS, GLOBAL_BATCH = 4, 16

DDP_CELL = ddp_cell(STEPS, GLOBAL_BATCH)


def _assert_equals_one_process(by_rank: list[list[torch.Tensor]]) -> None:
    assert_equals_one_process(by_rank, STEPS, GLOBAL_BATCH)


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _cluster_processes(cluster_id: str) -> list[int]:
    """Every process on this host whose command line names the cluster (engines, controller, srun)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if any(cluster_id in part for part in p.info["cmdline"] or []):
            out.append(p.pid)
    return out


def _started_here() -> set[int]:
    """Processes of the clusters this test process started (their id names its PID)."""
    mine = f"dtwork-{os.getpid()}-"
    out = set()
    for p in psutil.process_iter():
        try:
            if p.environ().get("IPP_CLUSTER_ID", "").startswith(mine):
                out.add(p.pid)
        except psutil.Error:
            continue
    return out


ENV_CELL = """import os
_env = {k: os.environ.get(k) for k in
        ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")}
"""


@pytest.fixture()
def shell(no_cluster: None) -> Iterator[object]:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "dtwork")
    yield ip
    ip.run_line_magic("dtrain", "stop")


def _train_and_stop(ip: object, launcher: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[dict]]:
    """Start through ``launcher``, train DDP in a %%dtrain cell, stop; return start output and envs."""
    from dtwork import magics

    ip.run_line_magic("dtrain", f"start --launcher {launcher} -n 2 --backend gloo --timeout 60")  # type: ignore[attr-defined]
    started = capsys.readouterr().out
    c = magics.current()
    c.run(ENV_CELL, quiet=True)
    envs = c.pull("_env")
    ip.run_cell_magic("dtrain", "--quiet", DDP_CELL)  # type: ignore[attr-defined]
    _assert_equals_one_process(c.pull("params"))
    assert [r["rank"] for r in c.rank_info] == [0, 1] and c.backend == "gloo"
    pids = [r["pid"] for r in c.rank_info] + _cluster_processes(c.cluster_id)
    ip.run_line_magic("dtrain", "stop")  # type: ignore[attr-defined]
    wait_for(lambda: not _alive(pids), 30, f"the cluster's processes to end: {_alive(pids)}")
    wait_for(lambda: not _cluster_processes(c.cluster_id), 30, "no process naming the cluster")
    return started, envs


# -- Slurm -------------------------------------------------------------------------------------


def test_slurm_batch_script_asks_for_whole_gpu_nodes() -> None:
    script = SlurmLauncher(
        LaunchOptions(gpus_per_node=4, nodes=2, partition="gpu", time="04:00:00", account="proj")
    ).batch_template()
    lines = script.splitlines()
    for line in (
        "#SBATCH --ntasks={n}",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --nodes=2",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=04:00:00",
        "#SBATCH --account=proj",
    ):
        assert line in lines
    assert lines[-1] == "srun {program_and_args}"
    with pytest.raises(
        DtworkError, match=r"-n 6 ranks are not whole nodes of --gpus-per-node 4: use a multiple of 4"
    ):
        SlurmLauncher(LaunchOptions(gpus_per_node=4)).check(6)
    with pytest.raises(DtworkError, match=r"--nodes 2 x --gpus-per-node 4 is 8 ranks, not -n 4: use -n 8"):
        SlurmLauncher(LaunchOptions(gpus_per_node=4, nodes=2)).check(4)
    with pytest.raises(DtworkError, match=r"has characters Slurm does not take"):
        SlurmLauncher(LaunchOptions(partition="gpu\n#SBATCH --x")).check(2)
    with pytest.raises(DtworkError, match="with --launcher or --profile, say how many ranks to start: -n N"):
        dtwork.Cluster(None, launcher="slurm")
    with pytest.raises(DtworkError, match="use --launcher or --profile, not both"):
        dtwork.Cluster(2, launcher="slurm", profile="x")
    with pytest.raises(DtworkError, match="unknown launcher 'pbs': use one of local, slurm, mpi, ssh"):
        dtwork.Cluster(2, launcher="pbs")


@pytest.mark.usefixtures("slurm")
def test_slurm_start_trains_ddp_and_stop_leaves_no_job(shell: object, capsys) -> None:
    started, envs = _train_and_stop(shell, "slurm", capsys)
    job = re.search(r"submitted Slurm job (\d+) \(2 tasks, sbatch\)", started)
    assert job, started
    with capsys.disabled():
        print(f"\n[slurm] {started.strip().splitlines()[0]}")
    assert {e["SLURM_JOB_ID"] for e in envs} == {job.group(1)}
    assert sorted(e["SLURM_PROCID"] for e in envs) == ["0", "1"]  # ranks are the job's tasks
    wait_for(lambda: not squeue_jobs(), 30, "squeue to list no job")


@pytest.mark.usefixtures("slurm")
def test_slurm_queue_wait_is_shown_with_the_job_id_and_bounded(shell: object, capsys) -> None:
    hold = subprocess.run(
        ["sbatch", "--parsable", "-n", str(os.cpu_count()), "--output=/dev/null", "--wrap", "sleep 600"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        wait_for(lambda: launchers.job_state(hold)[0] == "RUNNING", 30, "the job holding every CPU to run")
        t0 = time.monotonic()
        with pytest.raises(
            DtworkError,
            match=r"only 0 of 2 engines registered within 5 s \(Slurm job \d+ PENDING \(Resources\)",
        ):
            shell.run_line_magic("dtrain", "start --launcher slurm -n 2 --backend gloo --engine-timeout 5")  # type: ignore[attr-defined]
        assert time.monotonic() - t0 < 60
        out = capsys.readouterr().out
        assert re.search(r"Slurm job \d+ PENDING.*; waited \d+ s for the engines", out), out
        wait_for(lambda: squeue_jobs() == [hold], 30, "the waiting job to be cancelled")
    finally:
        subprocess.run(["scancel", hold], check=False)
    wait_for(lambda: not squeue_jobs(), 30, "squeue to list no job")


@pytest.mark.usefixtures("slurm")
@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (
            {"n": 4 * (os.cpu_count() or 1)},
            r"Slurm job \d+ cannot start: PartitionConfig \(the request exceeds",
        ),
        ({"n": 2, "partition": "nosuch"}, r"sbatch refused the job: .*invalid partition name specified"),
    ],
)
def test_slurm_request_the_queue_cannot_satisfy_fails_at_once_with_its_reason(
    options: dict, reason: str
) -> None:
    before = _started_here()
    t0 = time.monotonic()
    with pytest.raises(DtworkError, match=f"(?i){reason}"):
        dtwork.start(launcher="slurm", backend="gloo", **options)
    assert time.monotonic() - t0 < 30  # the scheduler's answer, not a timeout
    assert not squeue_jobs()
    left = lambda: _alive(sorted(_started_here() - before))  # noqa: E731
    wait_for(lambda: not left(), 30, "the refused start's processes (its controller, once) to end")


ALLOCATION_KERNEL = """
import json, os, dtwork
with dtwork.start(n=2, backend="gloo", launcher="slurm") as c:
    c.run("import os, torch, torch.distributed as dist; t = torch.ones(1); dist.all_reduce(t)", quiet=True)
    c.run("step = (os.environ.get('SLURM_JOB_ID'), os.environ.get('SLURM_STEP_ID'))", quiet=True)
    result = {"sums": [t.item() for t in c.pull("t")], "steps": c.pull("step")}
# after the stop: this job (the notebook's allocation) still runs, only the engines' step ended
print(json.dumps(result), flush=True)
"""


@pytest.mark.usefixtures("slurm")
def test_slurm_inside_an_allocation_starts_the_engines_as_an_srun_step(tmp_path: Path) -> None:
    script, out = tmp_path / "kernel.py", tmp_path / "out.txt"
    script.write_text(ALLOCATION_KERNEL)
    job = subprocess.run(
        ["sbatch", "--parsable", "-n", "2", f"--output={out}", "--wrap", f"{sys.executable} {script}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    wait_for(lambda: job not in squeue_jobs(), 180, f"the batch job {job} to finish")
    lines = [line for line in out.read_text().splitlines() if line.startswith("{")]
    assert lines, out.read_text()[-2000:]
    result = json.loads(lines[-1])
    assert result["sums"] == [2.0, 2.0]
    assert {tuple(s) for s in result["steps"]} == {(job, "0")}  # one srun step of the notebook's own job


KERNEL = """
import json, sys, dtwork
c = dtwork.start(n=2, backend="gloo", launcher=sys.argv[1], keep=sys.argv[2] if sys.argv[2:] else None)
c.run("import torch.distributed as dist; t = __import__('torch').ones(1); dist.all_reduce(t)", quiet=True)
entry = json.load(open(dtwork.launch.registry.entry_path(c.cluster_id)))
print(json.dumps({"cluster": c.cluster_id, "jobs": entry["jobs"], "pids": [p["pid"] for p in entry["processes"]]}), flush=True)
import time
time.sleep(600)
"""


def _kill_kernel_mid_run(tmp_path: Path, launcher: str, keep: str | None = None) -> dict:
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    proc = subprocess.Popen(
        [sys.executable, str(script), launcher, *([keep] if keep else [])],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        line = ""
        while not line.startswith("{"):  # the start prints its own lines first
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, "the kernel exited before its cluster started"
        info = json.loads(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    if keep:  # the cluster outlives its kernel, job and all, until its keep time is up
        entry = registry.entry_path(info["cluster"])
        wait_for(
            lambda: "orphaned_at" in json.loads(entry.read_text()), 30, "the reaper to see the kernel gone"
        )
        assert _alive(info["pids"]) and squeue_jobs() == info["jobs"], "kept: engines and job are there"
        wait_for(lambda: not entry.exists(), 120, "the reaper to end the cluster when its time is up")
    wait_for(lambda: not _alive(info["pids"]), 30, f"the reaper to end {_alive(info['pids'])}")
    wait_for(lambda: not _cluster_processes(info["cluster"]), 30, "no process naming the cluster")
    return info


@pytest.mark.usefixtures("slurm")
def test_slurm_kernel_killed_mid_run_gets_its_job_cancelled(tmp_path: Path) -> None:
    info = _kill_kernel_mid_run(tmp_path, "slurm")
    assert len(info["jobs"]) == 1
    wait_for(lambda: not squeue_jobs(), 30, f"the reaper to scancel job {info['jobs']}")


@pytest.mark.usefixtures("slurm")
def test_a_kept_slurm_cluster_keeps_its_job_after_a_kernel_kill_until_its_time_is_up(tmp_path: Path) -> None:
    info = _kill_kernel_mid_run(tmp_path, "slurm", keep="5s")
    wait_for(lambda: not squeue_jobs(), 30, f"the reaper to scancel job {info['jobs']}")


@pytest.mark.usefixtures("slurm")
def test_a_stale_clusters_slurm_job_is_cancelled_by_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel and its reaper both gone (a node rebooted, the reaper killed): the registry entry
    still names the job, and the clean-up every start runs cancels it."""
    monkeypatch.setenv("DTWORK_HOME", str(tmp_path / "home"))
    out = subprocess.run(
        ["sbatch", "--parsable", "-J", "dtwork-stale", "-o", os.devnull, "--wrap", "sleep 600"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    job = out.strip().split(";")[0]
    wait_for(lambda: job in squeue_jobs("dtwork-stale"), 30, f"job {job} in squeue")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    kernel = registry.proc_record(gone.pid)
    gone.wait()
    registry.write("dtwork-7-stale1", {"kernel": kernel, "processes": [], "files": [], "jobs": [job]})
    assert registry.clean_stale() == ["dtwork-7-stale1"]
    wait_for(lambda: job not in squeue_jobs(), 30, f"clean_stale to scancel job {job}")


# -- MPI ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("openmpi")
def test_mpi_start_trains_ddp_and_stop_leaves_no_process(shell: object, capsys) -> None:
    _, envs = _train_and_stop(shell, "mpi", capsys)
    assert sorted(e["OMPI_COMM_WORLD_RANK"] for e in envs) == ["0", "1"]
    assert sorted(e["OMPI_COMM_WORLD_LOCAL_RANK"] for e in envs) == ["0", "1"]


@pytest.mark.usefixtures("openmpi")
def test_mpi_more_ranks_than_slots_fails_at_once_with_mpiexecs_reason() -> None:
    t0 = time.monotonic()
    with pytest.raises(
        DtworkError,
        match=r"the engines cannot start: mpi launcher exited: There are not enough slots available in the system "
        r"to satisfy the \d+ slots that were requested by the application; ask for fewer ranks",
    ):
        dtwork.start(n=4 * (os.cpu_count() or 1), launcher="mpi", backend="gloo")
    assert time.monotonic() - t0 < 30


@pytest.mark.usefixtures("openmpi")
def test_mpi_kernel_killed_mid_run_leaves_no_process(tmp_path: Path) -> None:
    info = _kill_kernel_mid_run(tmp_path, "mpi")
    assert info["jobs"] == []


def _listening(pid: int) -> list[str]:
    """The addresses a process and its children listen on (TCP)."""
    return [ip for _, ip in _listeners(pid)]


def _listeners(pid: int) -> list[tuple[str, str]]:
    """(process name, address) of every TCP socket a process and its children listen on."""
    proc = psutil.Process(pid)
    out = []
    for p in [proc, *proc.children(recursive=True)]:
        out += [
            (p.name(), c.laddr.ip) for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
        ]
    return out


LOOPBACK_IPS = {"127.0.0.1", "::1"}


@pytest.mark.usefixtures("openmpi")
def test_mpi_cluster_listens_on_loopback_only(no_cluster: None) -> None:
    with dtwork.start(n=2, launcher="mpi", backend="gloo") as c:
        entry = json.loads(registry.entry_path(c.cluster_id).read_text())
        controllers = [
            r["pid"]
            for r in entry["processes"]
            if "ipyparallel.controller" in " ".join(psutil.Process(r["pid"]).cmdline())
        ]
        assert len(controllers) == 1, entry["processes"]
        addresses = _listening(controllers[0])  # the hub and its schedulers: a dozen sockets
        assert len(addresses) >= 4 and set(addresses) == {"127.0.0.1"}, addresses

        # mpiexec, the engines it started (MPI's TCP transport would listen there) and their nannies.
        (mpiexec,) = {psutil.Process(r["pid"]).ppid() for r in c.rank_info}
        assert psutil.Process(mpiexec).name() == "mpiexec"
        found = _listeners(mpiexec)
        engines = [ip for name, ip in found if name != "mpiexec"]
        assert len(engines) >= 4 and set(engines) <= LOOPBACK_IPS, found
        # mpiexec's out-of-band listener binds the wildcard whatever it is told (Open MPI 4.1
        # hard-codes INADDR_ANY/in6addr_any): only that pair may be wider, and it hands the
        # engines a loopback contact address only.
        wide = sorted(ip for name, ip in found if name == "mpiexec" and ip not in LOOPBACK_IPS)
        assert wide in ([], ["0.0.0.0"], ["0.0.0.0", "::"]), found
        uri = psutil.Process(c.rank_info[0]["pid"]).environ().get("OMPI_MCA_orte_hnp_uri", "")
        contacts = {
            ip for hosts in re.findall(r"tcp6?://\[?(.+?)\]?:\d+(?:;|$)", uri) for ip in hosts.split(",")
        }
        assert contacts and contacts <= LOOPBACK_IPS, uri
