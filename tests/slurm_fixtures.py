"""A real single-node Slurm (munged, slurmctld, slurmd on this machine) and Open MPI for the tests.

The Debian packages (slurm-wlm, munge, openmpi-bin) are installed by .ci/run. Without them, or
without root, the tests skip with the reason; with DTWORK_REQUIRE_SLURM=1 (set in CI) they fail
instead, so CI never passes by skipping. The daemons read a generated slurm.conf through
SLURM_CONF (the system's /etc/slurm is left alone) and are killed at the end with every job.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def _unavailable(reason: str) -> None:
    if os.environ.get("DTWORK_REQUIRE_SLURM") == "1":
        pytest.fail(f"{reason} (DTWORK_REQUIRE_SLURM=1: CI must run these tests)")
    pytest.skip(reason)


def wait_for(predicate: object, timeout: float, what: str) -> None:
    """Poll ``predicate()`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _munge_works() -> bool:
    enc = subprocess.run(["munge", "-n"], capture_output=True)
    if enc.returncode:
        return False
    return subprocess.run(["unmunge"], input=enc.stdout, capture_output=True).returncode == 0


def _start_munge() -> subprocess.Popen[bytes] | None:
    """Start munged unless one already answers; return the process we started."""
    if _munge_works():
        return None
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
    for d in ("/etc/munge", "/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    subprocess.run(["chown", "-R", "munge:munge", "/etc/munge"], check=True)
    proc = subprocess.Popen(
        ["munged", "--foreground", "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wait_for(lambda: _munge_works() or proc.poll() is not None, 30, "munged to answer")
    if proc.poll() is not None:
        pytest.fail(f"munged exited: {proc.stderr.read().decode() if proc.stderr else ''}")
    return proc


def write_conf(root: Path, host: str, cpus: int) -> Path:
    """A slurm.conf naming this machine as the one node, with its CPUs, in one default partition."""
    for d in ("state", "spool", "log"):
        (root / d).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=dtworktest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
    )
    return conf


def squeue_jobs(name: str | None = None) -> list[str]:
    """The ids of the jobs squeue lists (all states), optionally only those named ``name``."""
    args = ["squeue", "-h", "-o", "%i %j"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    rows = [line.split(maxsplit=1) for line in out.splitlines() if line.strip()]
    return [r[0] for r in rows if name is None or (len(r) > 1 and r[1] == name)]


@pytest.fixture(scope="session")
def slurm() -> Iterator[Path]:
    """A running single-node Slurm; yields its slurm.conf (SLURM_CONF is set for the session)."""
    missing = [t for t in SLURM_TOOLS if shutil.which(t) is None]
    if missing:
        _unavailable(f"Slurm not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        _unavailable("starting slurmctld/slurmd/munged needs root")
    root = Path(tempfile.mkdtemp(prefix="dtwork-slurm-"))
    conf = write_conf(root, socket.gethostname().split(".")[0], os.cpu_count() or 1)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    started: list[subprocess.Popen[bytes]] = []
    try:
        munged = _start_munge()
        if munged is not None:
            started.append(munged)
        for daemon in ("slurmctld", "slurmd"):
            started.append(
                subprocess.Popen(
                    [daemon, "-D", "-f", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )

        def idle() -> bool:
            dead = [p for p in started if p.poll() is not None]
            if dead:
                logs = "\n".join(f.read_text()[-2000:] for f in (root / "log").glob("*.log"))
                pytest.fail(f"{dead[0].args[0]} exited {dead[0].returncode}:\n{logs}")
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
            return out.stdout.strip() == "idle"

        wait_for(idle, 60, "the Slurm node to be idle")
        yield conf
    finally:
        if shutil.which("scancel"):
            subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, check=False)
        for proc in reversed(started):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def openmpi() -> str:
    """Debian's Open MPI and mpi4py in this Python; returns mpiexec's path."""
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        _unavailable("Open MPI not installed (no mpiexec): apt-get install openmpi-bin libopenmpi-dev")
    # In a child: importing mpi4py.MPI initialises MPI, which this test process must not do.
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    probe = subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI"], capture_output=True, text=True, env=env
    )
    if probe.returncode:
        _unavailable(
            f"mpi4py cannot load MPI in this Python (pip install mpi4py): {probe.stderr.strip()[-200:]}"
        )
    return str(mpiexec)
