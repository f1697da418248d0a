"""``Cluster``: the public face of a cluster, and the list of the clusters this process started.

It composes the engine group (``kernel.engines``: engines, ranks, the process group) and the
trial session (``kernel.session``: runs, cells, the store). ``dtwork.start()`` and ``%dtrain``
see the same list, so a cluster started from Python is the one ``%%dtrain`` cells run on.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

import ipyparallel as ipp

from dtwork.config import ExperimentConfig, load_config
from dtwork.errors import DtworkError
from dtwork.kernel.engines import EngineGroup
from dtwork.kernel.replies import ClusterStatus, EngineReply
from dtwork.kernel.session import Session
from dtwork.kernel.spec import DEFAULT_TIMEOUT, ClusterSpec, ConfigSource
from dtwork.kernel.stacks import RankStacks
from dtwork.kernel.watcher import CellResult
from dtwork.launch import rendezvous
from dtwork.store.runs import store_path

__all__ = ["DEFAULT_TIMEOUT", "Cluster", "ClusterSpec", "attach", "clusters", "current", "start", "stop_all"]

T = TypeVar("T")
_started: list[Cluster] = []  # every cluster started in this process, oldest first


def clusters() -> list[Cluster]:
    """The clusters started in this process (running or not), oldest first."""
    return list(_started)


def current() -> Cluster:
    """The newest running cluster, or a one-line error saying how to start one."""
    live = [c for c in _started if c.refresh() == "running"]  # a stop from the sidebar is seen here
    if not live:
        raise DtworkError("no cluster is running: start one with %dtrain start (or dtwork.start())")
    return live[-1]


def stop_all() -> None:
    """Stop every cluster this process started."""
    for c in list(_started):
        c.stop()
    _started.clear()


def notebook_name() -> str | None:
    """The notebook this kernel serves (Jupyter names it in the kernel's environment), if any."""
    return os.environ.get("JPY_SESSION_NAME") or None


class Cluster:
    """A set of engines, one per rank, joined in a process group, with its trial session.

    Use ``dtwork.start(...)`` (or ``%dtrain start``); usable as a context manager.
    """

    def __init__(self, n: int | None = None, *, spec: ClusterSpec | None = None, **options: object) -> None:
        """``spec``, or its fields as keywords (``backend="gloo"``, ``launcher="slurm"``, ...)."""
        if spec is None:
            spec = ClusterSpec.of(n, **options)
        elif n is not None or options:
            raise TypeError("Cluster takes a spec or its options, not both")
        cfg = load_config(spec.config)
        if spec.keep is None and cfg.keep is not None:  # the config's keep time, unless --keep says
            spec = dataclasses.replace(spec, keep=cfg.keep)
        notebook = notebook_name()
        # Resolved once: a later change of the working folder must not move the run store.
        store_file = store_path(spec.store)
        self.engines = EngineGroup(spec, config=cfg, store_file=store_file, notebook=notebook)
        for note in cfg.notes:
            print(f"dtwork: {note}")
        self.session = Session(self.engines, store_file, notebook)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start the engines and join them in a process group (see ``EngineGroup.start``)."""
        if self.state == "running":
            return self
        from dtwork.widgets import dashboard_ready, warm_dashboard

        # The live view's modules (~1.5 s of CPU) load in the background: while the engines start
        # when this host has a core to spare for it, else once they are up (then the import would
        # only slow their start: engines importing torch fill every core).
        early = self.session.live and self.engines.spare_core()
        if early:
            warm_dashboard()
        try:
            self.engines.start()
        finally:
            if early:
                dashboard_ready(30.0)  # no import left running under the notebook's next cell
        if self.session.live and not early:
            warm_dashboard()  # done by the next training cell, which waits for it before it starts
        self._track()
        return self

    def _track(self) -> None:
        if self not in _started:
            _started.append(self)

    def stop(self) -> None:
        """End the session's run, stop every engine and the controller."""
        if self.state in ("stopped", "new", "detached"):  # a detached cluster is no longer this kernel's
            return
        self.session.close()
        self.engines.stop()

    def detach(self) -> None:
        """Let go of a kept cluster without stopping it, for another notebook's ``%dtrain attach``:
        its ranks, names and run stay; its keep time runs from now."""
        self.refresh()
        if self.session.background is not None:
            raise DtworkError("a background cell is running: %dtrain wait for it, then detach")
        self.engines.detach()  # refused, with nothing changed, unless the cluster is kept
        self.session.event("detach", f"the notebook let go (kernel pid {os.getpid()})")
        self.session.stores.close()

    def restart(self, force: bool = False) -> Cluster:
        """Stop and start again with the same ranks and settings (fresh engines and process group).

        The trial session (its run in the store) carries on across the restart.
        """
        self.session.restart(force=force)
        self._track()
        return self

    def refresh(self) -> str:
        """Notice a stop from outside this kernel (the sidebar's Stop): end the run and stop here too;
        return the state."""
        if self.engines.stopped_outside():
            print(f"dtwork: {self.cluster_id} was stopped outside this kernel (sidebar)", file=sys.stderr)
            self.stop()
        return self.state

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def on_change(self, fn: Callable[[Cluster], None]) -> None:
        """Call ``fn(cluster)`` on every change of state."""
        self.engines.on_change(lambda state: fn(self))

    def name_run(self, name: str | None, run: int | None = None) -> int:
        """Name the current run (the one the last cell trained in), or ``run``; returns its id."""
        target = self.session.run_id if run is None else run
        if target is None:
            raise DtworkError("no run to name yet: run a training cell first")
        self.session.store.set_run_name(target, name)
        return target

    def configure(self, config: ConfigSource) -> ExperimentConfig:
        """Load an experiment config (YAML path, text, dict) on every rank as ``ctx.config``.

        It is validated here first (nothing reaches the ranks if it is bad); the next cell
        starts a new run with it.
        """
        cfg = load_config(config)
        for note in cfg.notes:
            print(f"dtwork: {note}")
        self.refresh()
        self.engines.configure_ranks(cfg)
        self.session.new_run()
        return cfg

    # -- running code ------------------------------------------------------------------------

    @overload
    def run(
        self,
        source_or_fn: str,
        *,
        ranks: list[int] | None = None,
        rank0: bool = False,
        bg: bool = False,
        quiet: bool = False,
    ) -> CellResult: ...

    @overload
    def run(
        self,
        source_or_fn: Callable[..., T],
        *args: object,
        ranks: list[int] | None = None,
        rank0: bool = False,
        bg: bool = False,
        quiet: bool = False,
        **kwargs: object,
    ) -> list[T]: ...

    def run(
        self,
        source_or_fn: str | Callable[..., T],
        *args: object,  # a function's own arguments, passed through as they are
        ranks: list[int] | None = None,
        rank0: bool = False,
        bg: bool = False,
        quiet: bool = False,
        **kwargs: object,  # likewise
    ) -> list[T] | CellResult:
        """Run a cell's source (or call a function) on every rank (or those named).

        A function's return values come back as a list by rank. Source runs in each engine's
        persistent namespace, where ``ctx`` is defined; its output is shown grouped by rank,
        its metrics go to the run store and the live dashboard.
        """
        self.refresh()
        if callable(source_or_fn):
            return self.engines.call(source_or_fn, args, kwargs, ranks)
        self.engines.view()  # a one-line error when the cluster is not running
        return self.session.run_cell(source_or_fn, ranks=ranks, rank0=rank0, bg=bg, quiet=quiet)

    def run_script(
        self,
        path: str | os.PathLike[str],
        args: list[str] | None = None,
        *,
        bg: bool = False,
        quiet: bool = False,
    ) -> CellResult:
        """Run a torchrun-style script unchanged on every rank, as a cell (``bg``, ``quiet``: see ``run``).

        The cell is ``%run SCRIPT ARGS``, as a user would type it in ``%%dtrain``: each rank executes
        the script as ``__main__`` with ``sys.argv`` and torchrun's environment, in its working
        directory; ``init_process_group`` joins the warm group, ``destroy_process_group`` keeps it.
        The script's top-level names stay in the ranks' namespace.
        """
        line = shlex.join([os.fspath(path), *(str(a) for a in args or [])])
        return self.run(f"%run {line}", bg=bg, quiet=quiet)

    def push(self, namespace: dict[str, object], ranks: list[int] | None = None) -> None:
        """Send variables into every rank's namespace."""
        self.refresh()
        self.engines.push(namespace, ranks)

    def pull(self, name: str, ranks: list[int] | None = None) -> list[Any]:  # the user's values
        """Fetch a variable from every rank: a list by rank."""
        self.refresh()
        return self.engines.pull(name, ranks)

    def signal(self, signum: int, ranks: list[int] | None = None) -> None:
        """Send a signal to the ranks' engine processes (through ipyparallel)."""
        self.refresh()
        self.engines.signal(signum, ranks)

    def check_collectives(self, on: bool = True) -> None:
        """Check every collective across the ranks before it runs (torch's DETAIL debug level): a
        mismatched op or shape fails at once on every rank, naming each rank's op, shape and line.
        It slows each collective (docs/benchmarks.md): leave it off for long training."""
        self.refresh()
        self.engines.check_collectives(on)

    def debug(self, rank: int | None = None) -> None:
        """pdb on a rank's last cell error (the first failing rank of the last cell by default),
        its prompt read with ``input()``: ``p``, ``pp``, ``up``, ``down``, ``l``; ``q`` leaves."""
        from dtwork.kernel import postmortem

        self.refresh()
        if rank is None:
            last = self.session.last
            rank = postmortem.failed_first(last.errors if last is not None else {})
        self.engines.engine_ids([rank])  # an unknown rank fails here, naming the ranks there are
        postmortem.drive(self.engines, rank)

    @property
    def checks_collectives(self) -> bool:
        """Whether collectives are checked across the ranks before they run."""
        return self.engines.checks_collectives

    def stacks(self, ranks: list[int] | None = None) -> RankStacks:
        """Every rank's Python stacks now, ranks alike grouped; answers while ranks are blocked in
        a collective (``print`` it, or ``.summary()`` for one line)."""
        self.refresh()
        return self.engines.stacks(ranks)

    # -- facts (the engine group's, read through) ---------------------------------------------

    @property
    def state(self) -> str:
        return self.engines.state

    @property
    def cluster_id(self) -> str:
        return self.engines.cluster_id

    @property
    def n(self) -> int:
        return self.engines.n

    @property
    def world_size(self) -> int:
        return self.engines.world_size

    @property
    def backend(self) -> str:
        return self.engines.backend

    @property
    def config(self) -> ExperimentConfig:
        return self.engines.config

    @property
    def global_batch_size(self) -> int | None:
        return self.engines.global_batch_size

    @property
    def rank_info(self) -> list[EngineReply]:
        return self.engines.rank_info

    @property
    def ranks(self) -> list[rendezvous.RankPlan]:
        return self.engines.ranks

    @property
    def probes(self) -> Mapping[int, EngineReply]:
        return self.engines.probes

    @property
    def master_addr(self) -> str | None:
        return self.engines.master_addr

    @property
    def master_port(self) -> int | None:
        return self.engines.master_port

    @property
    def timeout(self) -> float:
        return self.engines.timeout

    @property
    def interface(self) -> str | None:
        return self.engines.interface

    @property
    def start_seconds(self) -> float | None:
        return self.engines.start_seconds

    @property
    def client(self) -> ipp.Client | None:
        return self.engines.client

    @property
    def log_file(self) -> Path | None:
        return self.engines.log_file

    @property
    def store_file(self) -> Path:
        """The run store's file, resolved when the cluster was made."""
        return self.session.store_file

    def status(self) -> ClusterStatus:
        return self.engines.status()

    # -- display -----------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<dtwork.Cluster {self.cluster_id} {self.state} ranks={self.world_size or self.n} backend={self.backend}>"

    def _repr_html_(self) -> str:
        from dtwork.widgets.cluster_view import cluster_html

        return cluster_html(self)


def start(n: int | None = None, **options: object) -> Cluster:  # ClusterSpec's fields, and the launcher's
    """Start a cluster of ``n`` ranks (GPUs present: one per GPU with NCCL; else 2 CPU ranks, gloo).

    ``launcher="slurm"|"mpi"|"ssh"`` starts engines elsewhere; its options (``partition``, ``time``,
    ``account``, ``gpus_per_node``, ``nodes``, ``hosts``) are keywords here too.
    """
    return Cluster(spec=ClusterSpec.of(n, **options)).start()


def attach(cluster_id: str | None = None) -> Cluster:
    """Drive a kept cluster (``start(keep=...)``) whose kernel is gone: its ranks' names, process
    group, ``ctx`` and run go on here. ``cluster_id``: which, when several wait on this host."""
    from dtwork.kernel import kept

    before, now = kept.claim(cluster_id, notebook_name())  # refused while another kernel drives it
    try:
        kept.wait_idle(now)
        cluster = Cluster(spec=kept.spec_of(now))
        held = cluster.engines.attach(now)
        cluster.session.resume(held.get("run_id"))
    except BaseException:
        kept.release(before)  # it stays kept, its time running on
        raise
    cluster._track()
    return cluster
