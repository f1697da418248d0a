"""Where running clusters register themselves, so that they can be found and cleaned.

Each cluster writes one JSON file ``$DTWORK_HOME/clusters/<cluster_id>.json`` (default
``~/.dtwork``) naming its kernel, the host it runs on and every process it owns (PID + create
time, so a reused PID is never killed by mistake). The server extension lists these files;
``start`` cleans the entries whose kernel is gone; a small reaper process per cluster kills
the processes the moment the kernel dies, however it died.

The clusters directory is the user's own (mode 0700) and its files 0600: they hold addresses and
ports. An entry is trusted only once validated: its id by pattern and equal to its file's
name, the files it may delete only ipyparallel's ``security/cluster-<id>.json``; a malformed
file is skipped with a warning. A home shared over NFS holds other hosts' entries: a kernel
is only judged dead on the host it runs on, so another host's cluster is never cleaned here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import signal
import socket
import stat
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import psutil

from dtwork.errors import DtworkError, DtworkWarning
from dtwork.shared import durations

CLUSTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
# optional fields the panel reads, with the JSON types each may have
_OPTIONAL: dict[str, tuple[type, ...]] = {
    "state": (str,),
    "n": (int,),
    "backend": (str,),
    "profile": (str,),
    "master": (str,),
    "notebook": (str,),
    "cwd": (str,),
    "store": (str,),
    "started_at": (int, float),
    "updated_at": (int, float),
    "ranks": (list,),
    "launcher": (str,),
    "keep": (int, float),  # seconds the cluster stays after its kernel ends (kept clusters only)
    "orphaned_at": (int, float),  # when the reaper saw the kernel of a kept cluster gone
    "timeout": (int, float),
    "interface": (str,),
    "engine_timeout": (int,),
    "stacks": (dict,),  # where the ranks answer stack requests, and the token (kernel.stacks)
    "gpus": (dict,),  # the GPUs of this host the cluster holds: {"host", "uuids"} (launch.leases)
}
# ipyparallel puts the cluster's id in the environment of every process it launches (controller,
# engines, mpiexec or srun); their children (an engine's nanny) inherit it.
MARK = "IPP_CLUSTER_ID"


def home() -> Path:
    """Return dtwork's per-user state directory (``$DTWORK_HOME`` or ``~/.dtwork``)."""
    return Path(os.environ.get("DTWORK_HOME") or Path.home() / ".dtwork")


def _private_dir(path: Path) -> Path:
    """Make ``path`` (mode 0700) or narrow it to 0700; refuse a directory of another user."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid():
        raise DtworkError(
            f"{path} belongs to user id {st.st_uid}, not you: set DTWORK_HOME to a directory of your own"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        path.chmod(0o700)
    return path


def clusters_dir() -> Path:
    home().mkdir(mode=0o700, parents=True, exist_ok=True)  # one the user made is left as it is
    return _private_dir(home() / "clusters")


def entry_path(cluster_id: str) -> Path:
    if not isinstance(cluster_id, str) or not CLUSTER_ID.fullmatch(cluster_id):
        raise DtworkError(f"malformed cluster id {str(cluster_id)[:40]!r}: letters, digits, '-' and '_' only")
    return clusters_dir() / f"{cluster_id}.json"


_held: dict[str, int] = {}  # cluster id -> how deep this process holds its lock


@contextlib.contextmanager
def locked(cluster_id: str) -> Iterator[None]:
    """Hold a cluster's entry lock (re-entrant in one process): read, decide and write as one step,
    so that an attaching kernel and the reaper never act on each other's stale entry."""
    path = entry_path(cluster_id).with_name(f".{cluster_id}.lock")
    if _held.get(cluster_id):
        _held[cluster_id] += 1
        try:
            yield
        finally:
            _held[cluster_id] -= 1
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held[cluster_id] = 1
        try:
            yield
        finally:
            _held.pop(cluster_id, None)
    finally:
        os.close(fd)  # closing releases the lock


def this_host() -> str:
    return socket.gethostname()


def proc_record(pid: int) -> dict[str, float] | None:
    """Return ``{"pid", "create_time"}`` for a live process, None when it is gone."""
    try:
        return {"pid": pid, "create_time": psutil.Process(pid).create_time()}
    except psutil.Error:
        return None


def _matching(record: Mapping[str, object]) -> psutil.Process | None:
    """Return the live process a record names, only if it is the same process (not a reused PID)."""
    try:
        # JSON from a registry file: int() and float() check it, the except below takes their refusal
        proc = psutil.Process(int(cast(int, record["pid"])))
        if abs(proc.create_time() - float(cast(float, record["create_time"]))) > 0.01:
            return None
        return proc
    except (psutil.Error, KeyError, TypeError, ValueError, OverflowError):
        return None


def alive(record: Mapping[str, object] | None) -> bool:
    """Whether the process a record names runs: a zombie (dead, not yet reaped by its parent) does not."""
    proc = None if record is None else _matching(record)
    return proc is not None and not _zombie(proc)


def _zombie(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return True  # gone meanwhile


def write(cluster_id: str, data: Mapping[str, object]) -> Path:
    """Write (atomically, mode 0600) the registry entry of a cluster."""
    path = entry_path(cluster_id)
    entry = {"kernel_host": this_host(), **data, "cluster_id": cluster_id, "updated_at": time.time()}
    for derived in ("local", "kernel_alive"):  # ``entries`` adds them when it reads; never stored
        entry.pop(derived, None)
    with locked(cluster_id):
        tmp = path.with_name(f".{cluster_id}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o600)
            f.write(json.dumps(entry, indent=1))
        os.replace(tmp, path)
    return path


# -- reading and validating --------------------------------------------------------------------


def _is_proc(rec: object) -> bool:
    return (
        isinstance(rec, dict)
        and type(rec.get("pid")) is int
        and rec["pid"] > 0
        and type(rec.get("create_time")) in (int, float)
        and math.isfinite(rec["create_time"])
    )


def problem(path: Path, data: object) -> str | None:
    """Why ``data`` (read from ``path``) is not a valid registry entry; None when it is."""
    if not isinstance(data, dict):
        return "not a JSON object"
    cid = data.get("cluster_id")
    if not isinstance(cid, str) or not CLUSTER_ID.fullmatch(cid):
        return f"malformed cluster_id {str(cid)[:40]!r}"
    if path.name != f"{cid}.json":
        return f"cluster_id {cid!r} does not match the file name"
    if not _is_proc(data.get("kernel")):
        return "no valid kernel record (pid, create_time)"
    if not isinstance(data.get("kernel_host"), str) or not data["kernel_host"]:
        return "no kernel_host"
    if data.get("reaper") is not None and not _is_proc(data["reaper"]):
        return "reaper is not a (pid, create_time) record"
    procs = data.get("processes", [])
    if not isinstance(procs, list) or not all(_is_proc(p) for p in procs):
        return "processes is not a list of (pid, create_time) records"
    files = data.get("files", [])
    if not isinstance(files, list) or not all(_own_file(cid, f) for f in files):
        return f"files may only name ipyparallel's security/cluster-{cid}.json"
    for key, types in _OPTIONAL.items():
        value = data.get(key)
        if value is not None and (type(value) not in types):
            return f"{key} is a {type(value).__name__}"
    return None


def _own_file(cluster_id: str, name: object) -> bool:
    """Whether ``name`` is the ipyparallel cluster file of this cluster (the only file it may delete)."""
    if not isinstance(name, str) or "\0" in name:
        return False
    path = Path(name)
    return path.is_absolute() and path.name == f"cluster-{cluster_id}.json" and path.parent.name == "security"


def read(path: Path) -> dict[str, Any] | None:
    """The validated entry in ``path`` (JSON: ``problem`` checked its fields); None when it is gone
    or malformed (warned about)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _warn(path, f"unreadable ({type(exc).__name__})")
        return None
    why = problem(path, data)
    if why is not None:
        _warn(path, why)
        return None
    return data  # type: ignore[no-any-return]


def _warn(path: Path, why: str) -> None:
    warnings.warn(
        f"dtwork: skipping registry file {path}: {why}; delete it if no cluster of yours uses it",
        DtworkWarning,
        stacklevel=3,
    )


def remove(cluster_id: str) -> None:
    path = entry_path(cluster_id)
    path.unlink(missing_ok=True)
    path.with_name(f".{cluster_id}.lock").unlink(missing_ok=True)


def is_local(entry: Mapping[str, object]) -> bool:
    """Whether an entry's kernel runs on this host (only there can it be seen dead)."""
    return bool(entry.get("kernel_host") == this_host())


def entries() -> list[dict[str, Any]]:
    """Return every valid registered cluster, with ``local`` and ``kernel_alive`` filled in.

    Another host's kernel cannot be checked from here: it counts as alive.
    """
    out = []
    for path in sorted(clusters_dir().glob("*.json")):
        data = read(path)
        if data is not None:
            data["local"] = is_local(data)
            data["kernel_alive"] = alive(data["kernel"]) if data["local"] else True
            out.append(data)
    return out


# -- cleaning ------------------------------------------------------------------------------------


def kill_processes(records: Iterable[Mapping[str, object]], grace: float = 3.0) -> list[int]:
    """Terminate the named processes and their children; SIGKILL what is left after ``grace`` s.

    Return the PIDs that were signalled.
    """
    procs: list[psutil.Process] = []
    for rec in records:
        proc = _matching(rec)
        if proc is None:
            continue
        try:
            procs.extend(proc.children(recursive=True))
        except psutil.Error:
            pass
        procs.append(proc)
    procs = [p for p in procs if not _zombie(p)]  # dead already: waiting for one would cost the grace
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(procs, timeout=grace)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=grace)
    return [p.pid for p in procs]


def await_exit(record: Mapping[str, object] | None, timeout: float = 5.0) -> None:
    """Wait for a process that ends by itself (a reaper whose entry is gone); kill it if it does not."""
    proc = _matching(record) if record is not None else None
    if proc is not None:
        _, left = psutil.wait_procs([proc], timeout=timeout)
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()


def marked(cluster_id: str) -> list[dict[str, float]]:
    """Records of this user's processes on this host that carry ``cluster_id``'s mark: every process
    its start launched, whether the entry lists it yet or not."""
    me, here, out = os.getuid(), os.getpid(), []
    for proc in psutil.process_iter(["uids"]):
        try:
            uids = proc.info["uids"]
            if proc.pid == here or uids is None or uids.real != me:
                continue
            if proc.environ().get(MARK) == cluster_id:
                out.append({"pid": proc.pid, "create_time": proc.create_time()})
        except psutil.Error:
            continue
    return out


def end_marked(cluster_id: str, grace: float = 3.0, rounds: int = 5) -> list[int]:
    """Kill the processes that carry the cluster's mark, again until none is left: a process started
    by one being killed (an engine's nanny) is caught by the next round. Return the PIDs signalled."""
    killed: list[int] = []
    for _ in range(rounds):
        left = marked(cluster_id)
        if not left:
            break
        killed += kill_processes(left, grace=grace)
    return killed


def end(entry: dict[str, Any], why: str) -> list[int]:
    """Stop a cluster from outside its kernel (the sidebar's Stop, ``dtwork clusters stop``); return
    the PIDs signalled. A live kernel sees its entry gone and ends its run itself; the runs of a
    kept cluster without a kernel are marked here."""
    with locked(entry["cluster_id"]):
        if is_local(entry) and not alive(entry.get("kernel")):
            return discard(entry, why=why)
        killed = kill_processes(entry.get("processes") or [], grace=3.0)
        killed += end_marked(entry["cluster_id"])  # a cluster still starting lists few of them yet
        remove(entry["cluster_id"])
    return killed


def discard(entry: dict[str, Any], grace: float = 3.0, why: str = "the kernel died") -> list[int]:
    """Clean up after a dead kernel: kill a validated entry's processes (those it lists and those
    that carry its mark: a start killed midway lists none yet), mark its runs interrupted, cancel
    its scheduler jobs, delete its ipyparallel file and the entry itself; return the PIDs signalled."""
    killed = kill_processes(entry.get("processes", []), grace=grace)
    killed += end_marked(entry["cluster_id"], grace=grace)
    _interrupt_runs(entry, why)
    if entry.get("jobs") or entry.get("launcher") == "slurm":  # else it runs to its time limit
        from dtwork.launch.slurm import cancel  # imports ipyparallel: only for scheduler jobs

        # by name too: a kernel killed while sbatch ran never learnt the job's id
        cancel([str(j) for j in entry.get("jobs", [])], name=entry["cluster_id"])
    cid = entry["cluster_id"]
    for name in entry.get("files", []):
        if _own_file(cid, name):  # validated already; checked again where it deletes
            Path(name).unlink(missing_ok=True)
    remove(cid)
    return killed


def _interrupt_runs(entry: dict[str, Any], why: str) -> None:
    """Mark the runs, cells and searches a dead kernel left "running" in its store as interrupted: the
    kernel cannot say so itself, and a run shown running for ever hides that it ended. Best effort: a
    store that is gone or cannot be written is left as it is."""
    path = entry.get("store")
    if not path or not Path(path).is_file():
        return
    import sqlite3

    from dtwork.errors import DtworkError
    from dtwork.store import searches
    from dtwork.store.runs import RunStore

    try:
        with RunStore(path) as store:
            searches.interrupt(store.db, entry["cluster_id"])
            for run in store.list_runs():
                if run["status"] != "running" or run["cluster_id"] != entry["cluster_id"]:
                    continue
                for cell in store.cells(run["id"]):
                    if cell["status"] == "running":
                        store.finish_cell(run["id"], cell["seq"], "interrupted", why)
                store.set_run_status(run["id"], "interrupted", ended=True)
                store.add_event(run["id"], "kernel_died", f"{why}: its cluster was cleaned up")
    except (DtworkError, sqlite3.Error, OSError):
        pass


def clean_stale() -> list[str]:
    """Clean the clusters of this host whose kernel is gone (a kept one once its time is up);
    return their ids."""
    cleaned = []
    for entry in entries():
        if entry["local"] and not entry["kernel_alive"] and not waiting(entry):
            discard(entry, why=ended_why(entry))
            cleaned.append(entry["cluster_id"])
    return cleaned


# -- kept clusters -------------------------------------------------------------------------------


def time_left(entry: Mapping[str, object], now: float | None = None) -> float | None:
    """Seconds a kept cluster without its kernel has left before it is removed (None: it has a
    live kernel, or is not kept, or its kernel's end was not seen yet)."""
    keep, since = entry.get("keep"), entry.get("orphaned_at")
    if not isinstance(keep, (int, float)) or not keep or not isinstance(since, (int, float)):
        return None
    return max(0.0, since + keep - (time.time() if now is None else now))


def waiting(entry: Mapping[str, object]) -> bool:
    """Whether a kept cluster whose kernel is gone still waits for a notebook to attach: its keep
    time is not up, and its reaper (which ends it then) runs."""
    if not entry.get("keep") or not alive(cast(Mapping[str, object], entry.get("reaper") or {})):
        return False
    left = time_left(entry)
    return left is None or left > 0


def ended_why(entry: Mapping[str, object]) -> str:
    """What ended a cluster whose kernel is gone, for its runs' events."""
    if entry.get("keep"):
        return f"no notebook attached within its keep time ({duration(float(cast(float, entry['keep'])))})"
    return "the kernel died"


def let_go(cluster_id: str) -> None:
    """A kept cluster's kernel lets go of it (``%dtrain detach``): its entry names a kernel record no
    process matches (this kernel's PID, for who drove it last), its keep time running from now."""
    with locked(cluster_id):
        entry = read(entry_path(cluster_id))
        if entry is None:
            raise DtworkError(f"{cluster_id} is gone (stopped outside this kernel)")
        gone = {"pid": os.getpid(), "create_time": 0.0}
        write(cluster_id, {**entry, "kernel": gone, "orphaned_at": time.time()})


def orphans() -> list[dict[str, Any]]:
    """This host's kept clusters whose kernel is gone, waiting for a notebook to attach."""
    return [e for e in entries() if e["local"] and not e["kernel_alive"] and waiting(e)]


def duration(seconds: float) -> str:
    """``90`` -> ``1 min 30 s``; ``7200`` -> ``2 h``: a keep time as people say it."""
    return durations.said(seconds)


def parse_duration(text: object) -> float:
    """A keep time in seconds (``90``, ``90s``, ``30m``, ``2h``, ``1d``); a one-line error else."""
    try:
        return durations.parse(text)
    except ValueError as exc:
        raise DtworkError(f"{exc}: --keep takes it") from None
