"""Launchers: where the engines start (this machine, a Slurm allocation, mpiexec, SSH hosts).

Each launcher builds ipyparallel's launcher configuration for ``ipyparallel.Cluster`` (no
profile needed), checks the environment before anything starts with errors that say what to do,
and watches the start: a batch job's queue wait is shown with its job id and bounded, and a
launcher that fails (sbatch refused, mpiexec exited) fails the start at once with its reason.
``%dtrain start --profile NAME`` bypasses all of this for full control.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import ipyparallel as ipp
from ipyparallel.cluster.launcher import MPIEngineSetLauncher, SlurmEngineSetLauncher
from traitlets.config import Config

from dtwork.errors import DtworkError
from dtwork.launch.rendezvous import LOOPBACK, RankPlan, interface_address
from dtwork.shared import devices

NAMES = ("local", "slurm", "mpi", "ssh")
_SAFE = re.compile(r"[\w.:,+=@/-]+")  # values that go into a batch script line
PROGRESS_SECONDS = 15.0  # how often a queue wait is reported
# Pending reasons that no amount of waiting fixes (squeue's %r): fail at once with them.
HOPELESS = (
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionConfig",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "AccountNotAllowed",
    "QOSNotAllowed",
    "Nodes_required_for_job_are_DOWN",
    "JobHeldAdmin",
    "DependencyNeverSatisfied",
)
_MEANING = {
    "PartitionConfig": "the request exceeds what the partition's nodes have (CPUs, GPUs or memory per node)",
    "PartitionTimeLimit": "--time is longer than the partition allows",
    "PartitionNodeLimit": "--nodes is more than the partition allows",
    "InvalidAccount": "--account is not one you may charge",
}
_ENDED = {
    "FAILED",
    "CANCELLED",
    "COMPLETED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}


@dataclass(frozen=True)
class LaunchOptions:
    """What ``%dtrain start`` says about where engines run (scheduler options may stay unset)."""

    partition: str | None = None
    time: str | None = None
    account: str | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    hosts: str | None = None  # ssh: "host1:4,host2:4"


OPTION_NAMES = ("partition", "time", "account", "gpus_per_node", "nodes", "hosts")


class Launcher:
    """How one kind of launcher starts engines; subclasses fill in the environment and the config."""

    name: ClassVar[str] = "local"
    remote: ClassVar[bool] = False  # engines may run on other hosts: this host's GPUs say nothing

    def __init__(self, options: LaunchOptions | None = None) -> None:
        self.options = options or LaunchOptions()

    def check(self, n: int) -> None:
        """Raise a DtworkError saying what to do when this launcher cannot start ``n`` engines here."""

    def cluster_kwargs(self, interface: str | None) -> dict[str, Any]:
        """The keyword arguments for ``ipyparallel.Cluster`` beyond n, cluster_id and timeouts."""
        return {}

    def other_hosts(self) -> str | None:
        """Why engines may start on other hosts than this one (None: all start here)."""
        return None

    def check_reach(self, interface: str | None) -> None:
        """Refuse, before anything starts, engines on other hosts with no ``--interface``: the
        controller then listens on loopback only, where they could never register."""
        why = None if interface else self.other_hosts()
        if why:
            raise DtworkError(
                f"--launcher {self.name}: {why}, and the controller listens on loopback unless told "
                "otherwise: name the network interface those hosts reach this one on with --interface "
                "(e.g. --interface eth0; `ip -brief addr` lists them)"
            )

    def jobs(self, cluster: ipp.Cluster) -> list[str]:
        """The scheduler job ids this cluster holds (cancelled on stop and by the reaper)."""
        return []

    def failure(self, cluster: ipp.Cluster) -> str | None:
        """Why the engines will never come (the launcher ended or was refused), or None."""
        for es in cluster.engines.values():
            if es.state == "after" or _exited(getattr(es, "process", None)):
                out = _tail(es.get_output(remove=False)) if hasattr(es, "get_output") else ""
                said = f": {out.rstrip(':')}" if out else ""
                return (
                    f"{self.name} launcher exited{said}; ask for fewer ranks or change the launcher's options"
                )
        return None

    def progress(self, cluster: ipp.Cluster, waited: float) -> str | None:
        """A line for the user while engines are awaited (None: nothing to say)."""
        return None

    def connect(
        self, cluster: ipp.Cluster, n: int, timeout: float, submitted: Callable[[], None] = lambda: None
    ) -> ipp.Client:
        """Start the controller and engines, wait (bounded) for ``n`` to register; return a client.

        ``submitted`` runs once the launcher has started (so a job id is known before the wait).
        """
        if self.name == "local":
            return cluster.start_and_connect_sync()
        try:
            cluster.start_cluster_sync(n)
        except subprocess.CalledProcessError as exc:
            raise DtworkError(f"{self.name} launcher failed: {_tail(exc.output)}") from None
        submitted()
        client = cluster.connect_client_sync()
        t0 = time.monotonic()
        said = t0 - PROGRESS_SECONDS
        while len(client.ids) < n:
            why = self.failure(cluster)
            if why:
                raise DtworkError(f"the engines cannot start: {why}")
            waited = time.monotonic() - t0
            if waited > timeout:
                now = self.progress(cluster, waited)
                raise DtworkError(
                    f"only {len(client.ids)} of {n} engines registered within {timeout:.0f} s"
                    f"{f' ({now})' if now else ''}: ask for fewer ranks, or pass a longer engine_timeout"
                )
            if time.monotonic() - said >= PROGRESS_SECONDS:
                line = self.progress(cluster, waited)
                if line:
                    print(f"dtwork: {line}", flush=True)
                said = time.monotonic()
            try:
                client.wait_for_engines(n, timeout=1.0, block=True, interactive=False)
            except TimeoutError:
                pass
        return client

    def _controller(self, interface: str | None) -> dict[str, Any]:
        """Listen on the named interface, where engines on other hosts can reach the controller;
        else on loopback only (``check_reach`` refused a launch that needs other hosts)."""
        if interface:
            return {
                "controller_ip": interface_address(interface),
                "controller_location": interface_address(interface),
            }
        return {"controller_ip": LOOPBACK, "controller_location": LOOPBACK}


class LocalLauncher(Launcher):
    """Engines on this machine, controller on loopback (the default)."""


class SlurmLauncher(Launcher):
    """Engines as the tasks of one Slurm job: ``sbatch``, or ``srun`` inside an existing allocation."""

    name = "slurm"
    remote = True

    @property
    def in_allocation(self) -> bool:
        return bool(os.environ.get("SLURM_JOB_ID"))

    def check(self, n: int) -> None:
        tool = "srun" if self.in_allocation else "sbatch"
        if shutil.which(tool) is None:
            raise DtworkError(
                f"--launcher slurm needs Slurm's {tool} on PATH, and it is not here: run the notebook on a "
                "login node of a Slurm cluster, or use --launcher local"
            )
        for key, value in vars(self.options).items():
            if isinstance(value, str) and not _SAFE.fullmatch(value):
                raise DtworkError(f"--{key.replace('_', '-')} {value!r} has characters Slurm does not take")
        g, k = self.options.gpus_per_node, self.options.nodes
        if k is not None and (k < 1 or n % k):
            raise DtworkError(f"-n {n} ranks do not split evenly over --nodes {k}: use a multiple of {k}")
        if g is not None and (g < 1 or n % g):
            raise DtworkError(
                f"-n {n} ranks are not whole nodes of --gpus-per-node {g}: use a multiple of {g}"
            )
        if g is not None and k is not None and n != g * k:
            raise DtworkError(
                f"--nodes {k} x --gpus-per-node {g} is {g * k} ranks, not -n {n}: use -n {g * k}"
            )

    def other_hosts(self) -> str | None:
        if self.in_allocation:
            nodes = os.environ.get("SLURM_JOB_NODELIST", "")
            return None if _this_host(nodes) else f"the Slurm allocation holds {nodes or 'unnamed nodes'}"
        if (self.options.nodes or 1) > 1:
            return f"--nodes {self.options.nodes} starts engines on other hosts"
        away = [n for n in _slurm_nodes(self.options.partition) if not _this_host(n)]
        # sinfo naming no node (an unknown partition): sbatch's own refusal says more
        return f"sbatch may start the engines on {', '.join(away[:4])}" if away else None

    def cluster_kwargs(self, interface: str | None) -> dict[str, Any]:
        if self.in_allocation:
            return {"engine_launcher_class": SrunEngineSetLauncher, **self._controller(interface)}
        cfg = Config({"DtworkSlurmEngineSetLauncher": {"batch_template": self.batch_template()}})
        return {
            "engine_launcher_class": DtworkSlurmEngineSetLauncher,
            "config": cfg,
            **self._controller(interface),
        }

    def batch_template(self) -> str:
        """The sbatch script: one task per rank, ``srun`` starts the engines ({n} etc. filled in later)."""
        o = self.options
        lines = ["#!/bin/sh", "#SBATCH --job-name={cluster_id}", "#SBATCH --ntasks={n}"]
        lines += ["#SBATCH --output={output_file}", "#SBATCH --export=ALL"]
        nodes = o.nodes
        if o.gpus_per_node:
            lines.append(f"#SBATCH --gpus-per-node={o.gpus_per_node}")
            lines.append(f"#SBATCH --ntasks-per-node={o.gpus_per_node}")
        elif nodes:
            lines.append("#SBATCH --ntasks-per-node={n_per_node}")
        if nodes:
            lines.append(f"#SBATCH --nodes={nodes}")
        for flag, value in (("partition", o.partition), ("time", o.time), ("account", o.account)):
            if value:
                lines.append(f"#SBATCH --{flag}={value}")
        lines.append("srun {program_and_args}")
        return "\n".join(lines) + "\n"

    def jobs(self, cluster: ipp.Cluster) -> list[str]:
        return [str(es.job_id) for es in cluster.engines.values() if getattr(es, "job_id", "")]

    def failure(self, cluster: ipp.Cluster) -> str | None:
        if self.in_allocation:
            return super().failure(cluster)
        for job in self.jobs(cluster):
            state, reason = job_state(job)
            if state == "PENDING" and reason.startswith(HOPELESS):
                why = _MEANING.get(reason.split(",")[0], "the scheduler will not run it as asked")
                return f"Slurm job {job} cannot start: {reason} ({why}); it is cancelled: change the request"
            if state is None or state in _ENDED:
                out = _tail(next(iter(cluster.engines.values())).get_output(remove=False))
                return f"Slurm job {job} ended ({state or 'gone'}) before its engines registered: {out or 'no output'}"
        return None

    def progress(self, cluster: ipp.Cluster, waited: float) -> str | None:
        parts = []
        for job in self.jobs(cluster):
            state, reason = job_state(job)
            parts.append(
                f"Slurm job {job} {state or '?'}{f' ({reason})' if reason and reason != 'None' else ''}"
            )
        return f"{', '.join(parts)}; waited {waited:.0f} s for the engines" if parts else None


class DtworkSlurmEngineSetLauncher(SlurmEngineSetLauncher):  # type: ignore[misc]
    """ipyparallel's sbatch launcher that reports sbatch's own error and prints the job id."""

    def _run_command(self, command: list[str], **kwargs: Any) -> str:
        kwargs.pop("stdin", None)
        proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)
        if proc.returncode and command[0] != "sbatch":
            return proc.stdout + proc.stderr  # scancel of a job that already ended: nothing to do
        if proc.returncode:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            raise DtworkError(f"{command[0]} refused the job: {why[-1] if why else proc.returncode}")
        return proc.stdout

    def write_batch_script(self, n: int = 1) -> None:
        nodes = re.search(r"--nodes=(\d+)", self.batch_template)
        extra: dict[str, Any] = self.namespace  # type: ignore[has-type]
        self.namespace = {**extra, "n_per_node": n // int(nodes.group(1)) if nodes else n}
        # Beside the engine logs, not in the notebook's folder (the job itself still starts there).
        logs = os.path.dirname(self.output_file)
        if logs and not os.path.isabs(self.batch_file_name):  # type: ignore[has-type]
            self.batch_file_name = os.path.join(logs, f"{self.cluster_id}.sbatch")
            self.batch_file = self.batch_file_name
        super().write_batch_script(n)

    def stop(self) -> Any:
        if not self.job_id:  # sbatch refused: there is no job to cancel
            return self.notify_stop({"job_id": "", "output": ""})
        return super().stop()

    def start(self, n: int = 1) -> Any:
        job = super().start(n)
        print(
            f"dtwork: submitted Slurm job {job} ({n} tasks, sbatch); engine logs: {self.output_file}",
            flush=True,
        )
        return job


class SrunEngineSetLauncher(MPIEngineSetLauncher):  # type: ignore[misc]
    """Engines as one ``srun`` job step inside the allocation the notebook already runs in."""

    mpi_cmd = ["srun", "--export=ALL"]

    @property
    def program(self) -> list[str]:
        return list(self.engine_cmd)  # no --mpi: ranks come from SLURM_PROCID, not mpi4py


# Open MPI settings for engines that all run here (a value already in the environment wins).
_ONE_HOST_MCA = {
    # Shared memory only: the TCP transport listens on 0.0.0.0 and :: even between local ranks.
    "OMPI_MCA_btl": "self,vader",
    # mpiexec's out-of-band contact address: loopback only. Its listener still binds 0.0.0.0 and ::
    # (Open MPI 4.1 hard-codes the wildcard in create_listen; no parameter moves it).
    "OMPI_MCA_oob_tcp_if_include": "127.0.0.0/8",
}


def _one_host_mca() -> dict[str, str]:
    return {k: v for k, v in _ONE_HOST_MCA.items() if k not in os.environ}


class MPILauncher(Launcher):
    """Engines started by ``mpiexec -n N`` (Open MPI or MPICH); ranks from the MPI environment."""

    name = "mpi"
    remote = True

    def check(self, n: int) -> None:
        if shutil.which("mpiexec") is None:
            raise DtworkError(
                "--launcher mpi needs mpiexec on PATH: install an MPI (e.g. apt-get install openmpi-bin) "
                "or use --launcher local"
            )
        if importlib.util.find_spec("mpi4py") is None:
            raise DtworkError(
                f"--launcher mpi needs mpi4py in the engines' Python ({sys.executable}): pip install mpi4py"
            )

    def other_hosts(self) -> str | None:
        away = [h for h in _host_names(self.options.hosts) if not _this_host(h)]
        if away:
            return f"--hosts names {', '.join(away)}"
        nodes = os.environ.get("SLURM_JOB_NUM_NODES", "1")
        if nodes.isdigit() and int(nodes) > 1:  # mpiexec spreads over the allocation it runs in
            return f"mpiexec runs in a Slurm allocation of {nodes} nodes"
        return None

    def cluster_kwargs(self, interface: str | None) -> dict[str, Any]:
        env: dict[str, str] = {}
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # Open MPI refuses root unless told twice; a container's root user is the common case.
            env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        if interface is None and self.other_hosts() is None:
            env.update(_one_host_mca())
        cfg = Config({"MPIEngineSetLauncher": {"environment": env}})
        if self.options.hosts:
            cfg.MPIEngineSetLauncher.mpi_args = ["--host", self.options.hosts]
        return {"engine_launcher_class": "mpi", "config": cfg, **self._controller(interface)}


class SSHLauncher(Launcher):
    """Engines started over SSH on named hosts (``--hosts host1:4,host2:4``)."""

    name = "ssh"
    remote = True

    def hosts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for item in (self.options.hosts or "").split(","):
            host, _, count = item.strip().partition(":")
            if host:
                out[host] = int(count) if count.isdigit() else 1
        return out

    def check(self, n: int) -> None:
        hosts = self.hosts()
        if not hosts:
            raise DtworkError("--launcher ssh needs the hosts: --hosts host1:4,host2:4 (engines per host)")
        if sum(hosts.values()) < n:
            raise DtworkError(f"--hosts offers {sum(hosts.values())} engine slots, fewer than -n {n}")
        if shutil.which("ssh") is None:
            raise DtworkError("--launcher ssh needs the ssh client on PATH")

    def other_hosts(self) -> str | None:
        away = [h for h in self.hosts() if not _this_host(h)]
        return f"--hosts names {', '.join(away)}" if away else None

    def cluster_kwargs(self, interface: str | None) -> dict[str, Any]:
        cfg = Config({"SSHEngineSetLauncher": {"engines": self.hosts(), "remote_python": sys.executable}})
        return {"engine_launcher_class": "ssh", "config": cfg, **self._controller(interface)}


_LAUNCHERS: dict[str, type[Launcher]] = {
    "local": LocalLauncher,
    "slurm": SlurmLauncher,
    "mpi": MPILauncher,
    "ssh": SSHLauncher,
}


def get(name: str | None, options: LaunchOptions | None = None) -> Launcher:
    """The launcher called ``name`` (default: local), or a DtworkError naming the choices."""
    cls = _LAUNCHERS.get(name or "local")
    if cls is None:
        raise DtworkError(f"unknown launcher {name!r}: use one of {', '.join(NAMES)}")
    return cls(options)


# -- scheduler facts -----------------------------------------------------------------------------


def job_state(job: str) -> tuple[str | None, str]:
    """A Slurm job's state and reason from squeue; (None, "") once squeue no longer lists it."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T|%r"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "UNKNOWN", "squeue did not answer"
    if not out:
        return None, ""
    state, _, reason = out.splitlines()[0].partition("|")
    return state, reason


def cancel(jobs: list[str]) -> None:
    """``scancel`` these Slurm jobs (ids checked to be numbers first); silent when Slurm is gone."""
    ids = [j for j in jobs if re.fullmatch(r"\d+(_\d+)?", str(j))]
    if ids and shutil.which("scancel"):
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)


def scheduler_rank() -> tuple[int, int] | None:
    """(global rank, local rank) from the scheduler's environment on an engine, if it set them."""
    env = os.environ
    for rank, local in (
        ("SLURM_PROCID", "SLURM_LOCALID"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("PMI_RANK", "MPI_LOCALRANKID"),
    ):
        if rank in env and local in env:
            return int(env[rank]), int(env[local])
    return None


def order_ranks(
    client: ipp.Client, plans: list[RankPlan], probes: dict[int, dict[str, Any]], use_gpus: bool
) -> list[RankPlan]:
    """Follow the scheduler's ranks and local ranks (Slurm, MPI) when every engine has them."""
    ids = [p.engine_id for p in plans]
    found = dict(zip(ids, client[ids].apply_sync(scheduler_rank), strict=True))
    if any(v is None for v in found.values()):
        return plans
    return scheduler_plans(plans, found, probes, use_gpus)


def scheduler_plans(
    plans: list[RankPlan],
    found: dict[int, tuple[int, int]],
    probes: dict[int, dict[str, Any]],
    use_gpus: bool,
) -> list[RankPlan]:
    """Ranks in the scheduler's order (``found``: engine id -> (rank, local rank)); GPUs by local rank."""
    ordered = sorted(plans, key=lambda p: found[p.engine_id])
    pinned: dict[int, dict[str, Any]] = {}
    for host in dict.fromkeys(p.hostname for p in ordered) if use_gpus else []:
        mine = sorted((p for p in ordered if p.hostname == host), key=lambda p: found[p.engine_id][1])
        lists = [probes[p.engine_id].get("gpus", []) for p in mine]
        got = devices.pin(host, lists, [found[p.engine_id][1] for p in mine])  # each task's own binding
        pinned.update((p.engine_id, d) for p, d in zip(mine, got, strict=True))
    out = []
    for rank, p in enumerate(ordered):
        dev = pinned.get(p.engine_id)
        gpu, uuid = (dev["index"], dev.get("uuid")) if dev else (None, None)
        out.append(replace(p, rank=rank, local_rank=found[p.engine_id][1], gpu=gpu, gpu_uuid=uuid))
    return out


def _host_names(hosts: str | None) -> list[str]:
    """The host names of a ``host1:4,host2`` list."""
    return [h for item in (hosts or "").split(",") if (h := item.strip().partition(":")[0])]


def _this_host(name: str) -> bool:
    """Whether a host name (or address) is this machine."""
    here = socket.gethostname()
    return name in ("localhost", "127.0.0.1", "::1", here) or name.split(".")[0] == here.split(".")[0]


def _slurm_nodes(partition: str | None) -> list[str]:
    """The node names sbatch may place a job on ([] when sinfo cannot say)."""
    cmd = ["sinfo", "-h", "-N", "-o", "%N"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def _exited(proc: Any) -> bool:
    """Whether a launcher's local process (a psutil.Process) has ended; no event loop needed."""
    if proc is None:
        return False
    try:
        return bool(proc.status() == "zombie")
    except Exception:  # psutil.NoSuchProcess: reaped already
        return True


def _tail(text: Any, lines: int = 3) -> str:
    """The message of a tool's output: the first paragraph of an MPI-style ``-----`` block, else the last lines."""
    if isinstance(text, bytes):
        text = text.decode("utf8", "replace")
    rows = str(text or "").strip().splitlines()
    starts = [i for i, r in enumerate(rows) if r.startswith("-----")]
    if starts:
        para = []
        for r in rows[starts[0] + 1 :]:
            if not r.strip():
                break
            para.append(r.strip())
        if para:
            return " ".join(para)
    rows = [r for r in rows if r.strip()]
    return " | ".join(rows[-lines:])
