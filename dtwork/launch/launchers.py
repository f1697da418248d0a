"""Launchers by name: where the engines start (this machine, a Slurm allocation, mpiexec, SSH hosts).

One module per launcher (:mod:`~dtwork.launch.local`, :mod:`~dtwork.launch.slurm`,
:mod:`~dtwork.launch.mpi`, :mod:`~dtwork.launch.ssh`) behind :class:`~dtwork.launch.base.Launcher`;
``get`` picks one by name. ``%dtrain start --profile NAME`` bypasses all of this for full control.
"""

from __future__ import annotations

from dtwork.errors import DtworkError
from dtwork.launch.base import OPTION_NAMES, PROGRESS_SECONDS, Launcher, LaunchOptions
from dtwork.launch.local import LocalLauncher
from dtwork.launch.mpi import MPILauncher
from dtwork.launch.ordering import order_ranks, scheduler_plans, scheduler_rank
from dtwork.launch.slurm import (
    HOPELESS,
    DtworkSlurmEngineSetLauncher,
    SlurmLauncher,
    SrunEngineSetLauncher,
    cancel,
    job_state,
)
from dtwork.launch.ssh import SSHLauncher

__all__ = [
    "HOPELESS",
    "NAMES",
    "OPTION_NAMES",
    "PROGRESS_SECONDS",
    "DtworkSlurmEngineSetLauncher",
    "LaunchOptions",
    "Launcher",
    "LocalLauncher",
    "MPILauncher",
    "SSHLauncher",
    "SlurmLauncher",
    "SrunEngineSetLauncher",
    "cancel",
    "get",
    "job_state",
    "order_ranks",
    "scheduler_plans",
    "scheduler_rank",
]

_LAUNCHERS: dict[str, type[Launcher]] = {
    cls.name: cls for cls in (LocalLauncher, SlurmLauncher, MPILauncher, SSHLauncher)
}
NAMES = tuple(_LAUNCHERS)  # ("local", "slurm", "mpi", "ssh")


def get(name: str | None, options: LaunchOptions | None = None) -> Launcher:
    """The launcher called ``name`` (default: local), or a DtworkError naming the choices."""
    cls = _LAUNCHERS.get(name or "local")
    if cls is None:
        raise DtworkError(f"unknown launcher {name!r}: use one of {', '.join(NAMES)}")
    return cls(options)
