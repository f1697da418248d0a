"""The engine group: ipyparallel engines, one per rank, joined in a torch.distributed process group.

Stands on ipyparallel: its ``Cluster`` starts a controller and engines (locally, or on other
hosts through a launcher: SSH, MPI, Slurm), its ``DirectView`` runs code on them. The group
decides ranks, joins them in a process group, keeps the registry entry and its reaper, and
calls, pushes, pulls and signals by rank. It knows nothing of sessions, runs or stores (the
store's file is only written into the registry entry, for the sidebar). It never imports
torch: the kernel must not initialise CUDA (engines own the GPUs).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import ipyparallel as ipp

from dtwork.config import ExperimentConfig, load_config
from dtwork.config.determined import check_slots
from dtwork.errors import DtworkError
from dtwork.kernel import calls
from dtwork.kernel import stacks as rank_stacks
from dtwork.kernel.health import RankHealth
from dtwork.kernel.joined import Joined
from dtwork.kernel.processes import EngineProcesses
from dtwork.kernel.replies import ClusterStatus, EngineReply
from dtwork.kernel.spec import ClusterSpec
from dtwork.kernel.stacks import RankStacks
from dtwork.launch import launchers, leases, registry, rendezvous
from dtwork.runtime import entry
from dtwork.shared import devices, telemetry

T = TypeVar("T")


class EngineGroup:
    """A set of engines, one per rank, joined in a process group (validated at construction)."""

    def __init__(
        self, spec: ClusterSpec, *, config: ExperimentConfig, store_file: Path, notebook: str | None = None
    ) -> None:
        self.spec = spec
        self.config = config
        global_batch_size = spec.global_batch_size
        if global_batch_size is None:
            global_batch_size = config.global_batch_size
        self.launcher = spec.launcher_plugin()
        remote = (
            spec.profile or self.launcher.remote
        )  # engines may be elsewhere: this host's GPUs say nothing
        visible = None if remote else devices.visible([g.to_dict() for g in telemetry.cuda_devices()])
        n = config.resources.slots_per_trial if spec.n is None else spec.n
        # The GPUs no other live cluster holds: the ones this start may have (leases).
        gpus = None if visible is None else leases.usable(visible, socket.gethostname(), n, spec.backend)
        if spec.n is None and gpus is not None:
            check_slots(n, global_batch_size, gpus, spec.backend, os.cpu_count() or 1)
        self.n, self.backend = rendezvous.validate_request(
            n, spec.backend, gpus, timeout=spec.timeout, global_batch_size=global_batch_size
        )
        self.launcher.check(self.n)
        if spec.interface and not spec.profile:  # an unknown name fails before anything starts
            rendezvous.interface_address(spec.interface)
        if not spec.profile:  # engines on other hosts cannot reach a controller on loopback
            self.launcher.check_reach(spec.interface)
        self.global_batch_size = global_batch_size
        self.store_file = store_file
        self.notebook = notebook
        self.state = "new"
        self.cluster_id = _new_id()
        self.joined = Joined()
        self.procs = EngineProcesses()
        self._reaper_rec: Mapping[str, Any] | None = None  # the reaper's process record, in the entry
        self._listeners: list[Callable[[str], None]] = []
        self.health = RankHealth(self)  # which ranks' engines are gone, and why
        self.checks_collectives = False  # kept across restarts: fresh engines check again
        self._reload_told: tuple[str | None, str] | None = None  # (folder, cluster_id) the ranks know

    @property
    def profile(self) -> str | None:
        return self.spec.profile

    @property
    def timeout(self) -> float:
        return float(self.spec.timeout)

    @property
    def interface(self) -> str | None:
        return self.spec.interface

    @property
    def ranks(self) -> list[rendezvous.RankPlan]:
        return self.joined.ranks

    @property
    def rank_info(self) -> list[EngineReply]:
        return self.joined.rank_info

    @property
    def master_addr(self) -> str | None:
        return self.joined.master_addr

    @property
    def master_port(self) -> int | None:
        return self.joined.master_port

    @property
    def start_seconds(self) -> float | None:
        return self.joined.start_seconds

    @property
    def client(self) -> ipp.Client | None:
        return self.procs.client

    @property
    def log_file(self) -> Path | None:
        return self.procs.log_file

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engines and join them in a process group; clean up on any failure."""
        if self.state == "running":
            return
        registry.clean_stale()
        t0 = time.perf_counter()
        self._set_state("starting")
        try:
            self._lease()
            self._start_engines()
            self._register()
            self._join_process_group()
        except BaseException:
            self._teardown(force=True)
            self._set_state("failed")
            raise
        self.joined.start_seconds = time.perf_counter() - t0
        self.joined.started_at = time.time()
        self._set_state("running")
        self._register()

    def spare_core(self) -> bool:
        """Whether this host has a core beyond one per local engine and one for the kernel."""
        local = 0 if self.profile else self.n  # a profile's engines may start elsewhere
        return (os.cpu_count() or 1) > local + 1

    def _lease(self) -> None:
        """Reserve this host's GPUs for the ranks and register them before anything launches."""
        if self.backend == "nccl" and not (self.profile or self.launcher.remote):
            visible = devices.visible([g.to_dict() for g in telemetry.cuda_devices()])
            leases.take(self.n, visible, socket.gethostname(), self.cluster_id, self._leased)

    def _leased(self, lease: leases.Lease) -> None:
        self.joined.lease = lease
        self._register()

    def _start_engines(self) -> None:
        kwargs: dict[str, object] = {
            "n": self.n,
            "cluster_id": self.cluster_id,
            "engine_timeout": self.spec.engine_timeout,
            "delay": 0.05,
            "log_level": logging.WARNING,
            # Engines finish registering on the controller's next heartbeat: 3 s by default.
            # A 0.5 s beat halves the start time and lets a dead engine be noticed sooner.
            "controller_args": ["--HeartMonitor.period=500"],
            # A kept cluster outlives this kernel's exit (its reaper ends it when its time is up).
            "shutdown_atexit": self.spec.keep is None,
        }
        if self.profile:
            kwargs["profile"] = self.profile
        else:
            kwargs["controller_ip"] = rendezvous.LOOPBACK
        if self.interface and not self.profile:  # that interface's address only, not every one
            kwargs["controller_ip"] = rendezvous.interface_address(self.interface)
        if not self.profile:
            kwargs.update(self.launcher.cluster_kwargs(self.interface))
        self.procs.start(
            self.launcher, kwargs, self.n, self.spec.engine_timeout, self._register, self.profile
        )

    def _join_process_group(self) -> None:
        client, joined = self.procs.client, self.joined
        assert client is not None
        ids = sorted(client.ids)[: self.n]
        host = socket.gethostname()
        probes = dict(zip(ids, self._probe(client, ids), strict=True))
        self.backend, note = devices.choose_backend(self.spec.backend, probes)  # from what torch can use
        if note:
            calls.show_warnings([note])
        if self.backend != "nccl":
            joined.lease = None  # ranks on CPU hold no GPU: the entry written next lets them go
        pinning = leases.restrict(probes, joined.lease) if joined.lease else probes
        joined.ranks = rendezvous.assign_ranks(pinning, use_gpus=self.backend == "nccl", first_host=host)
        if self.launcher.remote:
            joined.ranks = launchers.order_ranks(client, joined.ranks, probes, self.backend == "nccl")
        joined.probes = probes
        self._register()
        iface = rendezvous.choose_interface(probes, self.interface)
        rank0 = client[joined.ranks[0].engine_id]
        joined.master_addr = rendezvous.master_address(probes[joined.ranks[0].engine_id], iface)
        if len({p["hostname"] for p in probes.values()}) > 1 or iface:
            calls.check_routes(client, joined.ranks, joined.master_addr, iface)
        joined.master_port = rank0.apply_sync(entry.reserve_port, joined.master_addr, len(joined.ranks))
        shared = {
            "backend": self.backend,
            "master_addr": joined.master_addr,
            "master_port": joined.master_port,
            "timeout": self.timeout,
            "run_id": self.cluster_id,
            "global_batch_size": self.global_batch_size,
            "config": self.config.to_dict(),
        }
        specs = calls.rank_specs(joined.ranks, probes, iface, shared)
        infos = calls.init_ranks(client, specs, min(self.timeout, 120.0) + 30.0)
        notes = calls.take_rank0_warnings([infos[p.engine_id] for p in joined.ranks])
        joined.rank_info = [
            {**p.to_dict(), **infos[p.engine_id], "backend": self.backend} for p in joined.ranks
        ]
        self.global_batch_size = joined.rank_info[0].get("global_batch_size")  # the batch used
        joined.stacks = rank_stacks.arm(client, joined.rank_info, probes, iface)
        if self.checks_collectives:
            self.check_collectives(True)
        calls.show_warnings(notes)

    def _probe(self, client: ipp.Client, ids: list[int]) -> list[EngineReply]:
        """Ask the engines what they are; they follow this kernel (and the keep time) from now on."""
        return calls.probe_engines(
            client, ids, calls.kernel_record(), socket.gethostname(), self.spec.keep_seconds
        )

    def attach(self, kept: Mapping[str, Any]) -> dict[str, Any]:
        """Take up a kept cluster whose kernel is gone (this kernel claimed its entry, ``kept.claim``):
        its engines, ranks and process group as they are. Return what its rank 0 holds
        (``entry.describe``: config, batch, run)."""
        self.cluster_id, t0 = str(kept["cluster_id"]), time.perf_counter()
        self._reaper_rec = kept.get("reaper")  # it watches on, now for this kernel
        self._set_state("starting")
        try:
            files = kept.get("files") or []
            if not files or not os.path.exists(files[0]):
                raise DtworkError(
                    f"{self.cluster_id}'s connection file is gone: dtwork clusters stop {self.cluster_id}, then start one"
                )
            client = self.procs.attach(self.cluster_id, files[0], self.n, self.spec.engine_timeout)
            self.joined = joined = Joined.of_entry(kept)
            ids = [p.engine_id for p in joined.ranks]
            joined.probes = dict(zip(ids, self._probe(client, ids), strict=True))
            iface = rendezvous.choose_interface(joined.probes, self.interface)
            joined.stacks = rank_stacks.arm(client, joined.rank_info, joined.probes, iface)
            held: dict[str, Any] = client[ids[0]].apply_sync(entry.describe)
            self.config, self.global_batch_size = load_config(held["config"]), held["global_batch_size"]
        except BaseException:
            self.procs.detach()
            self._set_state("failed")
            raise
        joined.start_seconds = time.perf_counter() - t0
        self._set_state("running")
        self._register()
        return held

    def _register(self) -> None:
        """Write (or refresh) this group's registry entry and make sure a reaper watches it."""
        procs = self._process_records()
        joined = self.joined
        path = registry.write(
            self.cluster_id,
            {
                "kernel": calls.kernel_record(),
                "kernel_host": socket.gethostname(),
                "state": self.state,
                "n": self.n,
                "backend": self.backend,
                "profile": self.profile,
                "launcher": None if self.profile else self.launcher.name,  # a profile's may be any
                "master": f"{joined.master_addr}:{joined.master_port}" if joined.master_port else None,
                "ranks": joined.rank_info or [p.to_dict() for p in joined.ranks],
                "processes": procs,
                "jobs": self.procs.jobs(self.launcher),
                "files": self.procs.files(),
                "started_at": joined.started_at,
                "cwd": os.getcwd(),
                "store": str(self.store_file),
                "notebook": self.notebook,
                "keep": self.spec.keep_seconds,
                "timeout": self.timeout,
                "interface": self.interface,
                "engine_timeout": self.spec.engine_timeout,
                "reaper": self._reaper_rec,
                "stacks": joined.stacks.to_entry() if joined.stacks.where else None,
                "gpus": joined.lease,
            },
        )
        if self._reaper_rec is None or not registry.alive(self._reaper_rec):
            reaper = subprocess.Popen(
                [sys.executable, "-m", "dtwork.launch.reaper", str(path)],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._reaper_rec = registry.proc_record(reaper.pid)
            self._register()  # with the reaper's record: a kernel that attaches later keeps it

    def _process_records(self) -> list[dict[str, float]]:
        """Every process this group owns that can be seen from here: controller, launchers, engines."""
        procs = [registry.proc_record(pid) for pid in self.procs.pids()]
        procs += [{"pid": p["pid"], "create_time": p["create_time"]} for p in self.joined.probes.values()]
        return [p for p in procs if p]

    def stop(self) -> None:
        """Stop every engine and the controller; the group leaves the registry."""
        if self.state in ("stopped", "new"):
            return
        self._teardown()
        self._set_state("stopped")

    def _teardown(self, force: bool = False) -> None:
        entry_ = registry.read(registry.entry_path(self.cluster_id)) or {}
        procs = entry_.get("processes", []) + self._process_records()
        if force:
            # Engines stuck in a collective ignore a polite stop: signal them all ourselves first.
            registry.kill_processes(procs, grace=2.0)
        self.procs.stop(self.launcher)
        registry.kill_processes(procs, grace=2.0)  # whatever is left
        if force:  # a start stopped midway: what it launched may be listed nowhere yet
            registry.end_marked(self.cluster_id, grace=2.0)
        registry.remove(self.cluster_id)
        registry.await_exit(self._reaper_rec)  # its entry gone, it ends by itself
        self._reaper_rec = None

    def detach(self) -> None:
        """Let go of a kept cluster without stopping it: it waits for a notebook to attach, its keep
        time running from now, as if this kernel had ended."""
        if not self.spec.keep_seconds:
            raise DtworkError("only a kept cluster can be detached: start it with --keep (e.g. --keep 2h)")
        registry.let_go(self.cluster_id)
        self.procs.detach()
        self._reaper_rec = None
        self._set_state("detached")

    def restart(self, force: bool = False) -> None:
        """Stop and start again with the same ranks and settings (fresh engines and process group)."""
        if self.state not in ("stopped", "new"):
            self._teardown(force=force)
            self._set_state("stopped")
        self.cluster_id = _new_id()
        self.joined = Joined()
        self.health.reset()
        self.start()

    def _set_state(self, state: str) -> None:
        self.state = state
        for fn in list(self._listeners):
            fn(state)

    def on_change(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(state)`` on every change of state (starting, running, stopped, failed)."""
        self._listeners.append(fn)

    def stopped_outside(self) -> bool:
        """Whether the group runs here but its registry entry is gone (the sidebar's Stop removes it)."""
        return self.state == "running" and not registry.entry_path(self.cluster_id).exists()

    def configure_ranks(self, config: ExperimentConfig) -> None:
        """Load ``config`` on every rank as ``ctx.config``; the global batch follows it."""
        gbs = config.global_batch_size or self.global_batch_size
        if gbs is not None and gbs < self.world_size:
            raise DtworkError(
                f"global_batch_size {gbs} is smaller than the {self.world_size} slots: use at least {self.world_size}"
            )
        out = self.call(entry.set_config, (config.to_dict(), gbs), {})
        notes = calls.take_rank0_warnings(out)
        self.config, self.global_batch_size = config, out[0]["global_batch_size"]
        calls.show_warnings(notes)

    # -- facts -------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def probes(self) -> Mapping[int, EngineReply]:
        """What each engine reported when it was first asked (pid, host, GPUs), by engine id."""
        return self.joined.probes

    def engine_exit_code(self, pid: int) -> int | None:
        """The exit code of an engine process its launcher has seen end (negative: a signal)."""
        return self.procs.exit_code(pid)

    def registered_ids(self) -> set[int] | None:
        """The engine ids the controller knows now (None when it cannot be asked)."""
        return self.procs.registered_ids()

    def dead_ranks(self, ranks: list[int]) -> dict[int, str]:
        """Ranks whose engine is gone, with why (by PID on this host, by heartbeat elsewhere)."""
        return self.health.dead_ranks(ranks)

    def environment(self) -> dict[str, object]:
        """Versions, hosts, devices and seeds of what the ranks run (no secrets)."""
        return calls.environment(self.backend, self.rank_info, self.config.seed)

    def status(self) -> ClusterStatus:
        return {
            "cluster_id": self.cluster_id,
            "state": self.state,
            "world_size": self.world_size,
            "backend": self.backend,
            "master": f"{self.master_addr}:{self.master_port}" if self.master_port else None,
            "start_seconds": self.start_seconds,
            "ranks": self.rank_info,
            "global_batch_size": self.global_batch_size,
        }

    # -- calling the ranks -------------------------------------------------------------------

    def _require_running(self) -> ipp.Client:
        if self.state != "running" or self.procs.client is None:
            raise DtworkError(
                f"the cluster is {self.state}: start one with %dtrain start (or dtwork.start())"
            )
        return self.procs.client

    def engine_ids(self, ranks: list[int] | None = None) -> list[int]:
        """Return engine ids in rank order (all ranks, or those named)."""
        self._require_running()
        if ranks is None:
            return [p.engine_id for p in self.ranks]
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise DtworkError(f"no rank {bad[0]}: this cluster has ranks 0-{self.world_size - 1}")
        return [self.ranks[r].engine_id for r in ranks]

    def view(self, ranks: list[int] | None = None) -> ipp.DirectView:
        """A DirectView on these ranks' engines (made once per client and set of ranks)."""
        client = self._require_running()
        return self.procs.view(client, tuple(self.engine_ids(ranks)))

    def settle(self, ranks: list[int], tries: int = 40) -> None:
        """Wait until ranks that raised stop aborting requests (see ``calls.settle``)."""
        if ranks and self.state == "running":
            calls.settle(self.view(ranks), tries)

    def call(
        self,
        fn: Callable[..., T],
        args: tuple[object, ...],  # the caller's arguments for fn, passed through as they are
        kwargs: Mapping[str, object],
        ranks: list[int] | None = None,
    ) -> list[T]:
        """Call ``fn(*args, **kwargs)`` on the ranks (handing it ``ctx`` when it takes one); by rank."""
        return calls.call_on_ranks(self.view(ranks), fn, args, kwargs)

    def push(self, namespace: dict[str, object], ranks: list[int] | None = None) -> None:
        """Send variables into every rank's namespace."""
        if not isinstance(namespace, dict):
            raise DtworkError(f"push takes a dict of names to values, got {type(namespace).__name__}")
        self.view(ranks).push(namespace, block=True)

    def pull(self, name: str, ranks: list[int] | None = None) -> list[object]:
        """Fetch a variable from every rank: a list by rank."""
        return calls.pull_by_rank(self.view(ranks), name)

    def tell_reload(self, folder: str | None) -> None:
        """Have every rank reload ``folder``'s edited modules as each cell starts (None: not), sent
        only when it changed or the engines are new (``entry.set_autoreload``), queued, not waited for."""
        told = (folder, self.cluster_id)
        if told != self._reload_told:
            self.view().apply_async(entry.set_autoreload, folder)
            self._reload_told = told

    def check_collectives(self, on: bool) -> None:
        """Have every rank compare each collective's op and shapes with the others' before it runs."""
        self.checks_collectives = on
        self.view().apply_sync(entry.check_collectives, on)

    def stacks(self, ranks: list[int] | None = None) -> RankStacks:
        """Every rank's Python stacks, asked on a side channel (answers while a rank is blocked)."""
        self._require_running()
        return rank_stacks.ask(self.joined.stacks, list(range(self.world_size)) if ranks is None else ranks)

    def pdb_command(self, rank: int, line: str) -> tuple[str, bool]:
        """One command for the pdb ``rank`` is stopped in at ``breakpoint()`` (see ``stacks.pdb_command``)."""
        return rank_stacks.pdb_command(self.joined.stacks, rank, line)

    def signal(self, signum: int, ranks: list[int] | None = None) -> None:
        """Send a signal to the ranks' engine processes (through ipyparallel)."""
        self._require_running().send_signal(signum, targets=self.engine_ids(ranks), block=True)


def _new_id() -> str:
    return f"dtwork-{os.getpid()}-{uuid.uuid4().hex[:6]}"
