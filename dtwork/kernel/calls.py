"""The engine group's calls to its engines: joining the process group, results by rank, logs.

Nothing here starts or stops engines (``engines.EngineGroup`` does). What runs on the engines
is ``dtwork.runtime.entry``, shipped by reference.
"""

from __future__ import annotations

import logging
import os
import platform
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import ipyparallel as ipp

from dtwork.errors import DtworkError, DtworkWarning, RankFailure
from dtwork.kernel.replies import EngineReply
from dtwork.launch import registry
from dtwork.runtime import entry

if TYPE_CHECKING:
    from dtwork.launch.rendezvous import RankPlan
    from dtwork.runtime.core.payloads import ConfigApplied

# seconds for the engines to answer the first request, then for a second one (see probe_engines)
PROBE_TIMEOUTS = (30.0, 60.0)

log = logging.getLogger("dtwork")
T = TypeVar("T")


def kernel_record() -> dict[str, float]:
    """This kernel's process (pid and start time), as the engines and the registry know it."""
    rec = registry.proc_record(os.getpid())
    assert rec is not None
    return rec


# -- joining the process group ---------------------------------------------------------------------


def probe_engines(
    client: ipp.Client, ids: list[int], kernel: Mapping[str, float], host: str, keep: float | None = None
) -> list[EngineReply]:
    """Every engine's ``probe``: the first request to engines that have just registered.

    On a loaded machine such a request was once lost between the controller and an engine (both
    idle, the kernel waiting for ever): one not answered in time is asked again (``probe`` may
    run twice).
    """
    for i, seconds in enumerate(PROBE_TIMEOUTS):
        ar = client[ids].apply_async(entry.probe, kernel, host, keep)
        try:
            return list(ar.get(timeout=seconds))
        except ipp.error.TimeoutError:
            if i + 1 < len(PROBE_TIMEOUTS):
                log.warning("dtwork: engines %s did not answer within %.0f s: asking again", ids, seconds)
    raise DtworkError(
        f"the engines did not answer dtwork's first request within {sum(PROBE_TIMEOUTS):.0f} s: "
        "the machine may be overloaded; stop the cluster and start it again"
    )


def check_routes(
    client: ipp.Client, ranks: list[RankPlan], master_addr: str | None, iface: str | None
) -> None:
    """Check that every rank can reach rank 0's address before the process group forms."""
    port = client[ranks[0].engine_id].apply_sync(entry.listen_once, master_addr, 15.0)
    others = [p.engine_id for p in ranks[1:]]
    if not others:
        return
    errors = client[others].apply_sync(entry.check_route, master_addr, port)
    bad = [(p, e) for p, e in zip(ranks[1:], errors, strict=True) if e]
    if bad:
        p, err = bad[0]
        raise DtworkError(
            f"rank {p.rank} on {p.hostname} cannot reach rank 0 at {master_addr} "
            f"(interface {iface or 'loopback'}): {err}; name a shared interface with --interface"
        )


def rank_specs(
    plans: list[RankPlan], probes: Mapping[int, EngineReply], iface: str | None, shared: dict[str, object]
) -> dict[int, dict[str, object]]:
    """Each engine's part in the process group, by engine id: its rank, device and place among the
    hosts, with the settings every rank shares."""
    from dtwork.launch.rendezvous import loopback_interface

    hosts = list(dict.fromkeys(p.hostname for p in plans))
    return {
        p.engine_id: {
            **shared,
            "rank": p.rank,
            "world_size": len(plans),
            "local_rank": p.local_rank,
            "gpu": p.gpu,
            "gpu_uuid": p.gpu_uuid,
            "local_world_size": sum(1 for q in plans if q.hostname == p.hostname),
            "group_rank": hosts.index(p.hostname),  # torchrun's node rank, for scripts
            "group_world_size": len(hosts),
            "interface": iface or loopback_interface(probes[p.engine_id]),
        }
        for p in plans
    }


def init_ranks(
    client: ipp.Client, specs: dict[int, dict[str, object]], seconds: float
) -> dict[int, EngineReply]:
    """Join every engine (by id) to the process group its spec names; each rank's info by engine id."""
    ars = {eid: client[eid].apply_async(entry.init_rank, spec) for eid, spec in specs.items()}
    deadline = time.monotonic() + seconds
    infos = {}
    for eid, ar in ars.items():
        try:
            infos[eid] = ar.get(timeout=max(1.0, deadline - time.monotonic()))
        except ipp.error.TimeoutError as exc:
            master = f"{specs[eid]['master_addr']}:{specs[eid]['master_port']}"
            raise DtworkError(
                f"ranks did not join the process group at {master} in time: "
                "check the network (--interface) and firewalls"
            ) from exc
        except ipp.error.RemoteError as exc:
            raise DtworkError(
                f"rank on engine {eid} could not join the process group: {exc.ename}: {exc.evalue}"
            ) from exc
    return infos


def take_rank0_warnings(infos: Sequence[ConfigApplied] | Sequence[EngineReply]) -> list[str]:
    """Take the warnings out of the ranks' replies (rank 0's first; the others repeat them)."""
    replies = [cast(dict[str, object], info) for info in infos]  # the replies are this kernel's to edit
    notes = replies[0].get("warnings", []) if replies else []
    for reply in replies:
        reply.pop("warnings", None)
    return [str(n) for n in notes] if isinstance(notes, list) else []


def show_warnings(notes: list[str]) -> None:
    """Show what rank 0 warned about while joining or configuring, once, here in the notebook
    (nobody sees an engine's stderr during a call)."""
    for message in notes:
        warnings.warn(message, DtworkWarning, stacklevel=3)


# -- the processes ipyparallel started -------------------------------------------------------------


def _launchers(ipc: ipp.Cluster | None) -> Iterator[object]:
    """ipyparallel's engine launchers of a cluster (one per engine set member)."""
    for es in ipc.engines.values() if ipc is not None else []:
        yield from getattr(es, "launchers", {}).values()


def launched_pids(ipc: ipp.Cluster | None) -> list[int]:
    """The PIDs of the controller and the engine launchers ipyparallel started for a cluster."""
    ctrl = ipc.controller if ipc is not None else None
    pids = [getattr(ctrl, "pid", None)] + [getattr(launcher, "pid", None) for launcher in _launchers(ipc)]
    return [pid for pid in pids if pid]


def exit_code(ipc: ipp.Cluster | None, pid: int) -> int | None:
    """The exit code of an engine process its launcher has seen end (negative: a signal)."""
    for launcher in _launchers(ipc):
        if getattr(launcher, "pid", None) == pid:
            code = (getattr(launcher, "stop_data", None) or {}).get("exit_code")
            return None if code is None else int(code)
    return None


# -- the engines' own log --------------------------------------------------------------------------

KEEP_LOGS = 20  # the newest engine logs kept in $DTWORK_HOME/logs


def engine_log(cluster_id: str) -> tuple[logging.Logger, Path]:
    """A logger for what ipyparallel says about a cluster's engines (their output when they end,
    stop notices), writing to a file of its own instead of the notebook."""
    folder = registry.home() / "logs"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _prune_logs(folder)
    path = folder / f"{cluster_id}.log"
    # Owner-only before the handler opens it: the engines' output may hold what the user keeps private.
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600))
    os.chmod(path, 0o600)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger(f"dtwork.engines.{cluster_id}")
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    return logger, path


def _prune_logs(folder: Path) -> None:
    """Drop the oldest logs past KEEP_LOGS, never one whose cluster is still registered; another
    kernel may prune the same folder at the same moment, so a log may vanish under us."""
    live = {p.stem for p in registry.clusters_dir().glob("*.json")}
    dated = []
    for log in folder.glob("dtwork-*.log"):
        try:
            dated.append((log.stat().st_mtime, log))
        except FileNotFoundError:
            continue
    for _, old in sorted(dated)[:-KEEP_LOGS]:
        if old.stem not in live:
            old.unlink(missing_ok=True)


def close_log(logger: logging.Logger) -> None:
    for handler in logger.handlers:
        handler.close()
    logger.handlers = []


# -- results by rank -------------------------------------------------------------------------------


def first_error(exc: Exception) -> tuple[str, str]:
    """(exception name, message) of the first rank's failure in an ipyparallel error."""
    if isinstance(exc, ipp.error.CompositeError) and exc.elist:
        return str(exc.elist[0][0]), str(exc.elist[0][1])
    return str(getattr(exc, "ename", type(exc).__name__)), str(getattr(exc, "evalue", exc))


def call_on_ranks(
    view: ipp.DirectView, fn: Callable[..., T], args: tuple[object, ...], kwargs: Mapping[str, object]
) -> list[T]:
    """Call ``fn(*args, **kwargs)`` on every engine of ``view``; the results by rank (raise on failure)."""
    ar = view.apply_async(entry.call, fn, *args, **kwargs)
    try:
        return [box[0] for box in ar.get()]
    except (ipp.error.CompositeError, ipp.error.RemoteError) as exc:
        ename, evalue = first_error(exc)
        name = getattr(fn, "__name__", type(fn).__name__)
        raise RankFailure(f"{name} failed: {ename}: {evalue}") from None


def settle(view: ipp.DirectView, tries: int = 40) -> None:
    """Wait until ranks that raised stop aborting requests (ipykernel aborts what arrives right after
    an error), so the next cell is not refused with TaskAborted."""
    for _ in range(tries):
        try:
            view.execute("", silent=True, block=False).get(timeout=5)
            return
        except ipp.error.TaskAborted:
            time.sleep(0.05)
        except (ipp.error.CompositeError, ipp.error.RemoteError) as exc:
            if "TaskAborted" not in str(exc):
                return
            time.sleep(0.05)
        except Exception:
            return


def pull_by_rank(view: ipp.DirectView, name: str) -> list[object]:
    """Fetch ``name`` from every engine's namespace of ``view``; a list by rank."""
    if not isinstance(name, str) or not name.isidentifier():
        raise DtworkError(f"pull takes a variable name, got {name!r}")
    try:  # a one-name list comes back as a list per rank: see entry.call
        return [box[0] for box in view.pull([name], block=True)]
    except (ipp.error.CompositeError, ipp.error.RemoteError) as exc:
        ename, evalue = first_error(exc)
        if ename == "NameError":
            raise DtworkError(
                f"no variable {name!r} on every rank: define it in a %%dtrain cell first"
            ) from None
        raise DtworkError(f"could not fetch {name!r} from the ranks: {ename}: {evalue}") from None


def environment(backend: str, rank_info: list[EngineReply], seed: int) -> dict[str, object]:
    """Versions, hosts, devices and seeds of what the ranks run (no secrets)."""
    from dtwork.shared import telemetry

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dtwork": version("dtwork"),
        "torch": version("torch"),
        "ipyparallel": version("ipyparallel"),
        "numpy": version("numpy"),
        "backend": backend,
        "world_size": len(rank_info),
        "hosts": sorted({str(r["hostname"]) for r in rank_info}),
        "ranks": rank_info,
        "gpus": [g.to_dict() for g in telemetry.gpu_inventory()],
        "seed": seed,
    }
