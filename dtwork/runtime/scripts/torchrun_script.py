"""Run an unchanged torchrun-style script on a warm rank, and build ``ctx`` under torchrun.

``run_script`` executes a file as ``__main__`` with ``sys.argv`` set and torchrun's environment;
while it runs, ``torch.distributed.init_process_group`` joins the rank's warm group (when the
request is compatible) and ``destroy_process_group`` leaves it alive. Everything is undone the
moment the script ends, and ``fresh_process.launch`` makes each run a fresh launch (its own modules
imported afresh, torch's settings, atexit, singletons). ``context_from_env`` is the other direction: a script exported from a
notebook builds the same ``ctx`` from the environment torchrun gives it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import torch
import torch.distributed as dist

from dtwork.errors import DtworkError
from dtwork.runtime.core import heap
from dtwork.runtime.scripts import autoreload, fresh_process

if TYPE_CHECKING:
    from dtwork.config import ExperimentConfig
    from dtwork.runtime.context import Context
    from dtwork.runtime.core.payloads import RankSpec

_facts: dict[str, str] = {}  # what torchrun would have said about this rank, set at init_rank


class ScriptExit(DtworkError):
    """A script ended with a non-zero ``sys.exit``: the cell fails, the engine stays up."""


def install(spec: RankSpec) -> None:
    """Remember this rank's torchrun facts and route ``%run`` through ``run_script`` (at init_rank)."""
    # A rank pinned to one GPU sees it as cuda:0, so the device index a script derives from
    # LOCAL_RANK must be 0 there.
    local_rank = 0 if spec.get("gpu") is not None else spec["local_rank"]
    _facts.update(
        RANK=str(spec["rank"]),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(spec["world_size"]),
        LOCAL_WORLD_SIZE=str(spec.get("local_world_size", 1)),
        GROUP_RANK=str(spec.get("group_rank", 0)),
        GROUP_WORLD_SIZE=str(spec.get("group_world_size", 1)),
        ROLE_RANK=str(spec["rank"]),
        ROLE_WORLD_SIZE=str(spec["world_size"]),
        ROLE_NAME="default",
        MASTER_ADDR=str(spec["master_addr"]),
        MASTER_PORT=str(spec["master_port"]),
        TORCHELASTIC_RUN_ID=str(spec.get("run_id", "dtwork")),
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
    )
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun's default for its workers, unless the user set it
        _facts["OMP_NUM_THREADS"] = "1"
    _facts["_backend"] = str(spec["backend"])
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None:
        # IPython's own %run prints a script's error where the kernel never sees it.
        shell.register_magic_function(run_magic, "line", "run")
        if not getattr(shell, "_dtwork_rank_cells", False):
            shell.events.register("pre_execute", _cell_starts)
            shell.events.register("post_execute", _cell_ends)
            shell.events.register("post_run_cell", _cell_ran)
            shell._dtwork_rank_cells = True


_cell_state = contextlib.ExitStack()


def _cell_starts() -> None:
    """A cell sees what a torchrun script sees (Accelerate, Fabric and plain DDP code in a cell)."""
    heap.cell_begins()  # before the cell makes anything: nothing of it may be frozen
    _cell_state.close()
    _cell_state.enter_context(_rank_process())
    from dtwork import runtime

    if runtime.joined():
        state = runtime.current().state
        state.cell += 1  # what this cell uses is told apart from earlier cells'
        state.publisher.new_cell()


def _cell_ran(result: object) -> None:
    """The cell's end in the rank's journal (``runtime/core/journal.py``), with its last records."""
    from dtwork import runtime

    if runtime.joined():
        runtime.current().state.publisher.end_cell(getattr(result, "error_in_exec", None))


def _cell_ends() -> None:
    _cell_state.close()
    autoreload.remember()  # what the cell imported, as loaded: reloaded before a later cell if edited


def torchrun_environment() -> dict[str, str]:
    """The environment variables torchrun would give this rank (none to add under torchrun itself)."""
    if not _facts and not dist.is_initialized():
        raise DtworkError("this process has not joined a process group: run %dtrain start first")
    return {k: v for k, v in _facts.items() if not k.startswith("_")}


def _identity() -> tuple[str, int, int]:
    """(backend, world size, rank) of the group a script's init_process_group joins."""
    if _facts:
        return _facts["_backend"], int(_facts["WORLD_SIZE"]), int(_facts["RANK"])
    return str(dist.get_backend()), dist.get_world_size(), dist.get_rank()


def run_magic(line: str) -> None:
    """``%run SCRIPT.py [ARGS...]`` inside ``%%dtrain``: ``run_script`` into the cell's namespace."""
    from IPython import get_ipython

    argv = shlex.split(line)
    if not argv or argv[0].startswith("-"):
        raise DtworkError(
            f"%run {line.strip()}: on dtwork's ranks %run takes SCRIPT.py [ARGS...] (no IPython options)"
        )
    run_script(argv[0], argv[1:], namespace=get_ipython().user_ns)


def run_script(path: str, args: Sequence[str] = (), namespace: dict[str, object] | None = None) -> None:
    """Execute ``path`` as ``__main__`` like ``torchrun`` would on this rank.

    The script's top-level names land in ``namespace`` afterwards (as ``%run`` does), except
    ``ctx`` and dunder names. ``sys.exit(0)`` ends the script; any other code raises ``ScriptExit``.
    """
    __tracebackhide__ = True  # IPython shows the script's frames, not this one
    file = Path(path).expanduser()
    if not file.is_file():
        raise DtworkError(f"no script at {path} (the rank's working directory is {os.getcwd()})")
    code = compile(file.read_bytes(), str(file), "exec")
    module = types.ModuleType("__main__")
    module.__file__ = str(file)
    module.__dict__["__builtins__"] = __builtins__
    with _torchrun_state(file, [str(path), *map(str, args)], module):
        try:
            exec(code, module.__dict__)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise ScriptExit(f"{file.name} called sys.exit({exc.code!r})") from None
    if namespace is not None:
        keep = {k: v for k, v in module.__dict__.items() if not k.startswith("__") and k != "ctx"}
        namespace.update(keep)


@contextlib.contextmanager
def _torchrun_state(file: Path, argv: list[str], module: types.ModuleType) -> Iterator[None]:
    """torchrun's view of the process (environment, argv, __main__, sys.path, cwd), then undone."""
    saved = (sys.argv, sys.modules.get("__main__"), list(sys.path), os.getcwd())
    sys.argv = argv
    sys.modules["__main__"] = module
    sys.path.insert(0, str(file.resolve().parent))
    here = os.getcwd()

    def folders() -> tuple[str, ...]:  # where a new process would import the user's modules from
        return tuple(str(Path(p or here).resolve()) for p in [str(file.resolve().parent), here, *sys.path])

    try:
        with _rank_process(), fresh_process.launch(file.name, folders):
            yield
    finally:
        sys.argv, main, sys.path[:], cwd = saved[0], saved[1], saved[2], saved[3]
        if main is not None:
            sys.modules["__main__"] = main
        os.chdir(cwd)


@contextlib.contextmanager
def _rank_process() -> Iterator[None]:
    """torchrun's environment, the warm group behind init/destroy, and no interactive prompt.

    Libraries that refuse DDP "in an interactive environment" (Lightning) look for ``sys.ps1``:
    a rank is a process of its own, as under torchrun, so it is hidden while code runs.
    """
    env = torchrun_environment()
    saved_env = {k: os.environ.get(k) for k in env}
    prompts = {k: getattr(sys, k) for k in ("ps1", "ps2") if hasattr(sys, k)}
    os.environ.update(env)
    for k in prompts:
        delattr(sys, k)
    try:
        with _warm_group(), _no_worker_processes():
            yield
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k, v in prompts.items():
            setattr(sys, k, v)


def _backend_family(backend: object, warm: str) -> bool:
    """Whether a requested backend can use the warm group (None, the same name, or a device map naming it)."""
    if backend is None:
        return True
    names = {part.split(":")[-1].strip().lower() for part in str(backend).split(",")}
    return warm in names


@contextlib.contextmanager
def _warm_group() -> Iterator[None]:
    """Make ``init_process_group`` join the warm group and ``destroy_process_group`` keep it."""
    c10d = dist.distributed_c10d
    real_destroy = c10d.destroy_process_group
    warm, world, rank = _identity()

    def init_process_group(backend: object = None, *args: object, **kwargs: object) -> None:
        if not _backend_family(backend, warm):
            raise DtworkError(
                f"the script asks for the {backend} backend, but dtwork's warm group uses {warm}: "
                f"use {warm} (or no backend), or start the cluster with --backend {backend}"
            )
        asked_world = kwargs.get("world_size", args[2] if len(args) > 2 else -1)
        asked_rank = kwargs.get("rank", args[3] if len(args) > 3 else -1)
        if asked_world not in (-1, None, world) or asked_rank not in (-1, None, rank):
            raise DtworkError(
                f"the script asks for rank {asked_rank} of world size {asked_world}, but this is rank "
                f"{rank} of {world}: read them from the environment (RANK, WORLD_SIZE) as torchrun sets them"
            )

    def destroy_process_group(group: dist.ProcessGroup | None = None) -> None:
        if group is None or group is c10d.GroupMember.WORLD:
            return  # the warm group outlives the script
        real_destroy(group)

    patched = {"init_process_group": init_process_group, "destroy_process_group": destroy_process_group}
    saved = {mod: {name: getattr(mod, name) for name in patched} for mod in (dist, c10d)}
    for mod in saved:
        for name, fn in patched.items():
            setattr(mod, name, fn)
    try:
        yield
    finally:
        for mod, fns in saved.items():
            for name, fn in fns.items():
                setattr(mod, name, fn)


@contextlib.contextmanager
def _no_worker_processes() -> Iterator[None]:
    """Refuse launchers that start a process per rank (Fabric ddp_spawn/ddp_notebook, notebook_launcher)."""
    import torch.multiprocessing as mp

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise DtworkError(
            "this starts a process per rank, but every dtwork rank already is one process of the group: "
            'use Fabric(strategy="ddp") or a plain Accelerator(), or call the training function directly'
        )

    saved = {name: getattr(mp, name) for name in ("start_processes", "spawn")}
    for name in saved:
        setattr(mp, name, refuse)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(mp, name, fn)


def context_from_env(
    *,
    global_batch_size: int | None = None,
    config: str | os.PathLike[str] | Mapping[str, object] | ExperimentConfig | None = None,
    backend: str | None = None,
) -> Context:
    """Join the group torchrun describes (env://) and return this rank's ``ctx``.

    The same ``ctx`` a ``%%dtrain`` cell gets: seeds, batch sizes and config as ``%dtrain start``
    sets them, so an exported notebook trains to the same numbers under ``torchrun``.
    """
    from dtwork import runtime
    from dtwork.config import load_config
    from dtwork.runtime.context import Context

    env = os.environ
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in env]
    if missing:
        raise DtworkError(f"{', '.join(missing)} not set: run this script with torchrun --nproc_per_node=N")
    local_rank, local_world = int(env["LOCAL_RANK"]), int(env.get("LOCAL_WORLD_SIZE", "1"))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    ctx = Context(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=device,
        backend=backend,
        config=load_config(config),
        global_batch_size=global_batch_size,
    )
    runtime.set_current(ctx)
    return ctx


class _Rank0Output:
    """Silence stdout on every rank but 0 (what ``%%dtrain --rank0`` shows), until ``restore``."""

    def __init__(self, rank: int) -> None:
        self._saved = sys.stdout
        if rank != 0:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115

    def restore(self) -> None:
        if sys.stdout is not self._saved:
            sys.stdout.close()
            sys.stdout = self._saved


def rank0_output(ctx: Context) -> _Rank0Output:
    """For exported ``%%dtrain --rank0`` cells: only rank 0 prints until ``.restore()``."""
    return _Rank0Output(ctx.rank)
