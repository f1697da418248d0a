"""The MPI launcher: engines started by ``mpiexec -n N`` (Open MPI or MPICH)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

from traitlets.config import Config

from dtwork.errors import DtworkError
from dtwork.launch.base import ClusterKwargs, Launcher, controller_kwargs, host_names, this_host

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
        away = [h for h in host_names(self.options.hosts) if not this_host(h)]
        if away:
            return f"--hosts names {', '.join(away)}"
        nodes = os.environ.get("SLURM_JOB_NUM_NODES", "1")
        if nodes.isdigit() and int(nodes) > 1:  # mpiexec spreads over the allocation it runs in
            return f"mpiexec runs in a Slurm allocation of {nodes} nodes"
        return None

    def cluster_kwargs(self, interface: str | None) -> ClusterKwargs:
        env: dict[str, str] = {}
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # Open MPI refuses root unless told twice; a container's root user is the common case.
            env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        if interface is None and self.other_hosts() is None:
            env.update(_one_host_mca())
        cfg = Config({"MPIEngineSetLauncher": {"environment": env}})
        if self.options.hosts:
            cfg.MPIEngineSetLauncher.mpi_args = ["--host", self.options.hosts]
        return {"engine_launcher_class": "mpi", "config": cfg, **controller_kwargs(interface)}
