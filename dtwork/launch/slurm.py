"""The Slurm launcher: engines as the tasks of one job, by ``sbatch`` or by ``srun`` inside an allocation.

Also what Slurm says about a job (``job_state``) and how it is cancelled (``cancel``), for the
launcher's wait and for the reaper.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from typing import Any

import ipyparallel as ipp
from ipyparallel.cluster.launcher import MPIEngineSetLauncher, SlurmEngineSetLauncher
from traitlets.config import Config

from dtwork.errors import DtworkError
from dtwork.launch.base import ClusterKwargs, Launcher, controller_kwargs, tail, this_host

_SAFE = re.compile(r"[\w.:,+=@/-]+")  # values that go into a batch script line
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
            return None if this_host(nodes) else f"the Slurm allocation holds {nodes or 'unnamed nodes'}"
        if (self.options.nodes or 1) > 1:
            return f"--nodes {self.options.nodes} starts engines on other hosts"
        away = [n for n in _slurm_nodes(self.options.partition) if not this_host(n)]
        # sinfo naming no node (an unknown partition): sbatch's own refusal says more
        return f"sbatch may start the engines on {', '.join(away[:4])}" if away else None

    def cluster_kwargs(self, interface: str | None) -> ClusterKwargs:
        if self.in_allocation:
            return {"engine_launcher_class": SrunEngineSetLauncher, **controller_kwargs(interface)}
        cfg = Config({"DtworkSlurmEngineSetLauncher": {"batch_template": self.batch_template()}})
        return {
            "engine_launcher_class": DtworkSlurmEngineSetLauncher,
            "config": cfg,
            **controller_kwargs(interface),
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
                out = tail(next(iter(cluster.engines.values())).get_output(remove=False))
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

    # How a cluster file names this class: ipyparallel writes "module:Class" for a class without an
    # entry point, which its own loader cannot import back (attach to a kept cluster failed).
    entrypoint_name = "dtwork.launch.slurm.DtworkSlurmEngineSetLauncher"

    def _run_command(self, command: list[str], **kwargs: Any) -> str:  # ipyparallel's subprocess options
        kwargs.pop("stdin", None)
        proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)
        if proc.returncode and command[0] != "sbatch":
            return str(proc.stdout + proc.stderr)  # scancel of a job that already ended: nothing to do
        if proc.returncode:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            raise DtworkError(f"{command[0]} refused the job: {why[-1] if why else proc.returncode}")
        return str(proc.stdout)

    def write_batch_script(self, n: int = 1) -> None:
        nodes = re.search(r"--nodes=(\d+)", self.batch_template)
        extra: dict[str, object] = self.namespace  # type: ignore[has-type]
        self.namespace = {**extra, "n_per_node": n // int(nodes.group(1)) if nodes else n}
        # Beside the engine logs, not in the notebook's folder (the job itself still starts there).
        logs = os.path.dirname(self.output_file)
        if logs and not os.path.isabs(self.batch_file_name):  # type: ignore[has-type]
            self.batch_file_name = os.path.join(logs, f"{self.cluster_id}.sbatch")
            self.batch_file = self.batch_file_name
        super().write_batch_script(n)

    def stop(self) -> object:
        if not self.job_id:  # sbatch refused: there is no job to cancel
            return self.notify_stop({"job_id": "", "output": ""})
        return super().stop()

    def start(self, n: int = 1) -> object:
        job = super().start(n)
        print(
            f"dtwork: submitted Slurm job {job} ({n} tasks, sbatch); engine logs: {self.output_file}",
            flush=True,
        )
        return job


class SrunEngineSetLauncher(MPIEngineSetLauncher):  # type: ignore[misc]
    """Engines as one ``srun`` job step inside the allocation the notebook already runs in."""

    entrypoint_name = "dtwork.launch.slurm.SrunEngineSetLauncher"  # as DtworkSlurmEngineSetLauncher's
    mpi_cmd = ["srun", "--export=ALL"]

    @property
    def program(self) -> list[str]:
        return list(self.engine_cmd)  # no --mpi: ranks come from SLURM_PROCID, not mpi4py


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


def cancel(jobs: list[str], name: str | None = None) -> None:
    """``scancel`` these Slurm jobs (ids checked to be numbers first), and this user's jobs called
    ``name`` (a cluster's id: its sbatch job is named so); silent when Slurm is gone."""
    ids = [j for j in jobs if re.fullmatch(r"\d+(_\d+)?", str(j))]
    if not shutil.which("scancel"):
        return
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)
    if name and _SAFE.fullmatch(name):
        user = pwd.getpwuid(os.getuid()).pw_name
        subprocess.run(
            ["scancel", "--name", name, "--user", user], capture_output=True, timeout=60, check=False
        )


def _slurm_nodes(partition: str | None) -> list[str]:
    """The node names sbatch may place a job on ([] when sinfo cannot say)."""
    cmd = ["sinfo", "-h", "-N", "-o", "%N"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({line.strip() for line in out.splitlines() if line.strip()})
