"""The engine entry points: every function the kernel calls on the ranks, one name each.

The kernel ships these by reference (``DirectView.apply``; the engines import this module), so
each is module-level, small, and returns plain data. This module imports no torch at import
time: the kernel imports it to name the functions and must not initialise CUDA.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, cast

import psutil

from dtwork import runtime
from dtwork.runtime.core import heap
from dtwork.runtime.core.payloads import (
    ConfigApplied,
    EngineProbe,
    GpuFacts,
    ProcessId,
    RankJoined,
    RankSpec,
)

if TYPE_CHECKING:
    import torch.distributed as dist

# The kernel that drives this rank, and how long the rank outlives it (None: not at all).
_driver: dict[str, object] = {"kernel": None, "keep": None}
_watch_started = threading.Event()
KEEP_GRACE = 60.0  # past a kept cluster's time: its reaper ends it first; this is the backstop


def _watch_kernel(kernel: ProcessId, keep: float | None = None, poll: float = 1.0) -> None:
    """Exit this engine when the kernel that drives it dies (same host only); a kept cluster's
    rank waits ``keep`` seconds (and a grace) for another kernel to attach (``probe`` again) first."""
    _driver.update(kernel=kernel, keep=keep)
    if _watch_started.is_set():
        return
    _watch_started.set()

    def loop() -> None:
        proc: psutil.Process | None = None
        watched: object = None
        gone_since: float | None = None
        while True:
            time.sleep(poll)
            now = _driver["kernel"]
            if now is not watched:  # a kernel attached: watch it from now on
                watched, proc, gone_since = now, None, None
            if not isinstance(now, dict):
                continue
            if gone_since is None and not _alive(cast(ProcessId, now), proc):
                gone_since = time.monotonic()
            elif gone_since is None and proc is None:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(now["pid"])
            if gone_since is not None:
                keep = _driver["keep"]
                if not isinstance(keep, (int, float)) or time.monotonic() - gone_since > keep + KEEP_GRACE:
                    os._exit(3)

    threading.Thread(target=loop, name="dtwork-kernel-watch", daemon=True).start()


def _alive(kernel: ProcessId, proc: psutil.Process | None) -> bool:
    """Whether the kernel runs: once it is known to be the same process (not a reused PID), one
    /proc read a second instead of a new Process (boot time, create time) taking this rank's GIL;
    a dead kernel is a zombie until reaped, then gone."""
    try:
        if proc is None:
            proc = psutil.Process(kernel["pid"])
            if abs(proc.create_time() - kernel["create_time"]) > 0.01:
                return False
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def describe() -> dict[str, object]:
    """What the rank holds that an attaching kernel takes up: its config and batch, its run."""
    ctx = runtime.current()
    return {
        "config": ctx.config.to_dict(),
        "global_batch_size": ctx.global_batch_size,
        "run_id": ctx.run_id,
        "run_store": ctx.run_store,
    }


def probe(kernel: ProcessId | None, kernel_host: str, keep: float | None = None) -> EngineProbe:
    """Describe this engine: host, addresses, PIDs, visible GPUs (via NVML, not CUDA)."""
    from dtwork.shared import devices, telemetry

    host = socket.gethostname()
    if kernel is not None and host == kernel_host:
        _watch_kernel(kernel, keep)
    me = psutil.Process()
    gpus = devices.visible([g.to_dict() for g in telemetry.cuda_devices()])
    found: EngineProbe = {
        "hostname": host,
        "pid": me.pid,
        "create_time": me.create_time(),
        "parent": {"pid": me.ppid(), "create_time": psutil.Process(me.ppid()).create_time()},
        "addresses": devices.host_addresses(),
        "gpus": gpus,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "slurm_localid": devices.slurm_local_id(),
    }
    if gpus:
        _torch_cuda(found)
    return found


def _torch_cuda(found: EngineProbe) -> None:
    """Whether this engine's torch is a CUDA build (asked without starting CUDA: the rank's
    CUDA_VISIBLE_DEVICES is set later, and CUDA reads it once)."""
    import torch

    found["torch"], found["torch_cuda"] = torch.__version__, bool(torch.backends.cuda.is_built())


_listener: socket.socket | None = None  # rank 0's store socket, from reserve_port to the next join


def reserve_port(address: str, world_size: int) -> int:
    """Bind and listen on a port of ``address`` chosen by the OS, and keep it for this rank's store.

    The port stays held from here to the join (``_rendezvous_store`` takes the socket), so no
    other process on the host can take it in between, as it could with a port found free and let go.
    """
    global _listener
    if _listener is not None:
        _listener.close()
    _listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _listener.bind((address, 0))
    _listener.listen(max(16, world_size))
    return int(_listener.getsockname()[1])


def check_route(address: str, port: int, timeout: float = 5.0) -> str | None:
    """Try to reach ``address:port`` over TCP; return None on success, else the error text."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def listen_once(address: str, seconds: float) -> int:
    """Accept connections on a fresh port for ``seconds`` (for the route check); return the port."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((address, 0))
    srv.listen(16)
    srv.settimeout(seconds)

    def serve() -> None:
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                try:
                    conn, _ = srv.accept()
                    conn.close()
                except OSError:
                    break
        finally:
            srv.close()

    threading.Thread(target=serve, name="dtwork-route-check", daemon=True).start()
    return int(srv.getsockname()[1])


def init_rank(spec: RankSpec) -> RankJoined:
    """Pin the GPU, join the process group, and create this rank's ``ctx``.

    ``spec`` holds rank, world_size, local_rank, backend, master_addr, master_port,
    timeout (s), gpu (physical index or None), interface, global_batch_size, config (dict).
    Return what the rank ended up with (device, GPU name and UUID through NVML).
    """
    from dtwork.shared.devices import rank_environment

    # Before CUDA is initialised in this process: the rank sees exactly one device, named by
    # UUID so that CUDA's device order (fastest first) cannot differ from NVML's.
    os.environ.update(rank_environment(spec.get("gpu_uuid") if spec.get("gpu") is not None else None))
    interface = spec.get("interface")
    if interface:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        os.environ["NCCL_SOCKET_IFNAME"] = interface
    os.environ.update(
        MASTER_ADDR=spec["master_addr"],
        MASTER_PORT=str(spec["master_port"]),
        RANK=str(spec["rank"]),
        WORLD_SIZE=str(spec["world_size"]),
        LOCAL_RANK=str(spec["local_rank"]),
    )
    import torch
    import torch.distributed as dist

    from dtwork.runtime import cell_settings
    from dtwork.runtime.context import Context
    from dtwork.runtime.core import group
    from dtwork.runtime.debug import breakpoints, stacks
    from dtwork.runtime.scripts import torchrun_script as script

    if dist.is_initialized():
        dist.destroy_process_group()
    # Share the host's cores between its ranks (torchrun does the same with OMP_NUM_THREADS):
    # two ranks each running all-core kernels on 2 cores thrash and slow every collective.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, spec.get("local_world_size", 1))))
    if spec["backend"] == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"rank {spec['rank']}: torch.cuda.is_available() is False with CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')}: check the NVIDIA driver and torch's CUDA build, or use --backend gloo"
            )
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    else:
        device = torch.device("cpu")
    with _warnings_for_the_kernel() as notes:
        ctx = Context.from_spec(dict(spec), device)
    runtime.set_current(ctx)
    # The group's first all-reduce proves it works before the kernel reports "ready".
    group.join(_rendezvous_store(spec, timedelta(seconds=spec["timeout"])), spec, device)
    script.install(spec)  # torchrun's environment and %run for scripts run on this rank
    breakpoints.install(lambda data: runtime.current().state.publisher.send(data))
    stacks.answer_records(lambda after, most: runtime.current().state.publisher.journal.since(after, most))
    cell_settings.install()  # what each cell ran with, sent with the cell's own messages
    gpu = _gpu_facts(spec.get("gpu_uuid") if spec.get("gpu") is not None else None)
    threading.Thread(target=_warm_imports, name="dtwork-warm-imports", daemon=True).start()
    _user_namespace()["ctx"] = ctx  # ``ctx`` in the namespace where cells run
    heap.freeze_imports()  # torch and dtwork as imported: out of every later collection's way
    atexit.unregister(_exit_now)
    atexit.register(_exit_now)  # last registered, first run: before the interpreter's teardown
    return {
        "rank": ctx.rank,
        "device": str(device),
        "pid": os.getpid(),
        "global_batch_size": ctx.global_batch_size,
        "warnings": notes,
        "gpu_name": gpu["gpu_name"],
        "gpu_uuid": gpu["gpu_uuid"],
    }


@contextlib.contextmanager
def _warnings_for_the_kernel() -> Iterator[list[str]]:
    """Collect dtwork's warnings for the kernel to show (nobody sees an engine's stderr during
    a call); other warnings are shown here as usual."""
    from dtwork.errors import DtworkWarning

    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DtworkWarning)
        yield notes
    for w in caught:
        if issubclass(w.category, DtworkWarning):
            notes.append(str(w.message))
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _rendezvous_store(spec: RankSpec, timeout: timedelta) -> dist.TCPStore:
    """The process group's TCPStore, listening on the master address only (not every interface).

    ``init_method="tcp://..."`` would make rank 0 listen on all interfaces; here rank 0 binds
    the socket itself to ``master_addr`` (``reserve_port``, before the join) and hands it to the store.
    """
    import torch.distributed as dist

    addr, port, world = spec["master_addr"], int(spec["master_port"]), spec["world_size"]
    if spec["rank"] != 0:
        return dist.TCPStore(addr, port, world, False, timeout)
    if _listener is None or _listener.getsockname()[1] != port:
        raise RuntimeError(
            f"rank 0 holds no listening socket on {addr}:{port} (reserve_port reserves it before the join)"
        )
    return dist.TCPStore(addr, port, world, True, timeout, master_listen_fd=_listener.fileno())


def _warm_imports() -> None:
    """Import what the first DDP wrap would import (torch._dynamo: seconds of imports on a CPU).

    Done in the background while the researcher types the next cell, so that the first
    ``ctx.wrap`` costs milliseconds instead of seconds. A cell that needs the modules first
    simply waits on the import lock.
    """
    try:
        import torch._dynamo  # noqa: F401
        import torch.nn.parallel  # noqa: F401

        import dtwork.runtime.loop.steps  # noqa: F401
        import dtwork.runtime.parallel.ddp  # noqa: F401
    except Exception:
        pass
    heap.freeze_imports()  # the modules just imported too, unless a cell has begun meanwhile


def _gpu_facts(uuid: str | None) -> GpuFacts:
    if uuid is None:
        return {"gpu_name": None, "gpu_uuid": None}
    from dtwork.shared import telemetry

    for g in telemetry.cuda_devices():
        if g.uuid == uuid:
            return {"gpu_name": g.name, "gpu_uuid": g.uuid}
    return {"gpu_name": None, "gpu_uuid": None}


def set_config(config: dict[str, object] | None, global_batch_size: int | None) -> ConfigApplied:
    """Load a config (as a dict) into this rank's ctx; return the per-slot batch it implies."""
    ctx = runtime.current()
    with _warnings_for_the_kernel() as notes:
        ctx.configure(config, global_batch_size)
    return {
        "per_slot_batch_size": ctx.per_slot_batch_size,
        "global_batch_size": ctx.global_batch_size,
        "warnings": notes,
    }


def call(fn: Callable[..., object], *args: object, **kwargs: object) -> list[object]:
    """Call ``fn`` on this rank (handing it ``ctx`` when it takes one) and return its value in a
    one-item list.

    ipyparallel sorts the keys of a dict it sends back at the top level, so a dict whose keys
    do not compare (``{0: ..., "total": ...}``) would fail to come back; inside a list it is
    pickled as it is.
    """
    from dtwork.runtime import call_with_ctx

    return [call_with_ctx(fn, args, kwargs)]


def optimizer_lrs() -> list[list[float]]:
    """The learning rate of each parameter group of each optimizer the trial uses, as it is now
    (after its schedule), oldest optimizer first."""
    return [[float(g["lr"]) for g in opt.param_groups] for opt in runtime.current().optimizers]


def set_auto_resume(on: bool | int) -> None:
    """Resume ``ctx.steps`` from the run's newest checkpoint (True, while the kernel replays a run),
    or from run ``on``'s newest (an ASHA search's promoted trial goes on from its shorter rung)."""
    runtime.current().auto_resume = on


def set_run_id(
    run_id: int,
    store: str | None = None,
    new_axis: bool = True,
    trained: bool = False,
    token: str | None = None,
    adopt: tuple[tuple[int, str], ...] = (),
    next_run: int | None = None,
) -> None:
    """Name the run the rank trains in, and its store (a run folder of checkpoints is theirs);
    ``new_axis``: the kernel began it (not a rank's training loop), so its steps start at 0;
    ``trained``: it had a loop; ``token``: names a pending folder (runtime/run_axis.py);
    ``adopt``: (run, pending folder) pairs of runs loops began mid-cell, renamed first;
    ``next_run``: the id a run a loop begins mid-cell gets (``ctx.run_id`` in that very cell)."""
    from dtwork.runtime.checkpoint import folders
    from dtwork.runtime.core import run_axis

    ctx = runtime.current()
    for run, folder in adopt:
        folders.adopt(ctx.state, folder, run)
    if new_axis and ctx.run_id != run_id:  # told again after a replay: its axis goes on
        run_axis.new_axis(ctx.state)
    ctx.run_id, ctx.run_store = run_id, store
    run_axis.told_run(ctx.state, trained, token)
    ctx.state.next_run = next_run


def repair_group() -> str | None:
    """Join a new process group after a failed cell, keeping the engine and its namespace."""
    from dtwork.runtime.core import group

    return group.repair()


def set_cell_ranks(ranks: list[int]) -> None:
    """The ranks the next cell runs on (``%%dtrain --ranks``), so that ctx refuses collectives."""
    from dtwork.runtime.core import control

    control.set_next_cell_ranks(ranks)


def check_collectives(on: bool) -> None:
    """Compare every collective's op and shapes across the ranks before it runs (``on``), or not."""
    from dtwork.runtime.core import group

    group.check_collectives(on)


def debug_start() -> str | None:
    """Open a post-mortem debugger on this rank's last cell error; its first words, or None."""
    from dtwork.runtime.debug import postmortem

    return postmortem.start()


def debug_command(line: str) -> tuple[str, bool]:
    """One pdb command in the open debugger: its output, and whether the debugger ended."""
    from dtwork.runtime.debug import postmortem

    return postmortem.command(line)


def serve_stacks(token: str, address: str) -> int:
    """Answer the kernel's stack requests on ``address`` from a thread of this rank; the port."""
    from dtwork.runtime.debug import stacks

    stacks.answer_driver(lambda kernel: _driver.update(kernel=kernel))  # attached while a cell ran
    return stacks.serve(token, address)


_reload_from: list[str | None] = [None]  # the notebook's folder while cells reload its edited modules


def set_autoreload(folder: str | None) -> None:
    """Before each cell, reload the modules from the notebook's ``folder`` edited since they were
    loaded (None: reload nothing). Sent once per change, not per cell: the check runs in IPython's
    ``pre_run_cell`` event, so a cell costs no message of its own for it."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None and not getattr(shell, "_dtwork_autoreload", False):
        shell.events.register("pre_run_cell", _reload_before_cell)
        shell._dtwork_autoreload = True
    _reload_from[0] = folder


def _reload_before_cell(info: object = None) -> None:
    folder = _reload_from[0]
    if folder is None:
        return
    from dtwork.runtime.core import control
    from dtwork.runtime.scripts import autoreload

    names = autoreload.reload_changed(folder)
    ranks = control.cell_ranks()
    if names and runtime.current().rank == (min(ranks) if ranks else 0):  # one line for the cell
        print(f"dtwork: reloaded {', '.join(names)} (changed on disk; %dtrain autoreload off to keep them)")


def _user_namespace() -> dict[str, object]:
    """The engine's interactive namespace, where cells run."""
    from IPython import get_ipython

    return get_ipython().user_ns  # type: ignore[no-any-return]


def _exit_now() -> None:
    """End a stopping engine at once, exit code 0: the interpreter's own teardown of torch's objects
    takes seconds and ipyparallel reports the signal that stops an engine as a failure."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)
