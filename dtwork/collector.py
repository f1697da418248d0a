"""Kernel side of a running cell: streams output by rank, persists records, watches ranks.

One direction: ranks publish records (datapub) -> the collector writes them to the store
first -> then hands them to the dashboard. It relays interrupts (first: a consistent stop at
the same step on every rank; second: abort and restart) and notices dead or stalled ranks.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ipyparallel as ipp
import psutil

from dtwork.errors import DtworkError, RankFailure
from dtwork.records import Kind, to_rows

POLL_SECONDS = 0.1
INTERRUPT_GRACE = 10.0  # seconds for ranks to stop after a consistent stop is asked
FAILURE_GRACE = 5.0  # seconds survivors get to finish after another rank failed
STALL_SECONDS = 60.0  # default hang watchdog


@dataclass
class CellResult:
    """What one cell produced, by rank."""

    seq: int | None
    ranks: list[int]
    status: str = "running"
    results: list[Any] = field(default_factory=list)
    errors: dict[int, Any] = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""
    records: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _error_line(err: Any) -> str:
    if isinstance(err, ipp.error.RemoteError):
        return f"{err.ename}: {err.evalue}"
    return f"{type(err).__name__}: {err}"


def _traceback(err: Any) -> str:
    if isinstance(err, ipp.error.RemoteError):
        lines = err.render_traceback()
        return "\n".join(lines)
    return _error_line(err)


@contextlib.contextmanager
def _interrupts_as_flags() -> Any:
    """Within the block, SIGINT appends to the yielded list instead of raising (main thread only)."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield pending
    finally:
        signal.signal(signal.SIGINT, previous)


class CellWatcher:
    """Follow one AsyncResult until it ends: output, records, failures, interrupts."""

    def __init__(
        self,
        session: Session,
        ar: Any,
        ranks: list[int],
        *,
        seq: int | None,
        rank0: bool,
        quiet: bool,
        on_records: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.session = session
        self.cluster = session.cluster
        self.ar = ar
        self.ranks = ranks
        self.seq = seq
        self.rank0 = rank0
        self.quiet = quiet
        self.on_records = on_records
        self.result = CellResult(seq, ranks)
        self._out_pos = [0 for _ in ranks]
        self._err_pos = [0 for _ in ranks]
        self._partial: dict[tuple[str, int], str] = {}
        self.progress: dict[int, dict[str, Any]] = {}
        self._failed_at: float | None = None
        self._interrupts = 0
        self._interrupt_at: float | None = None
        self._stall_warned: set[int] = set()
        self._dead: dict[int, str] = {}
        self._t0 = time.monotonic()
        self.restarted = False
        self._progress_changed = False
        # the first health check comes half a second in: a short cell pays none (a rank that died
        # between cells is found then, or at once when the cell fails)
        self._last_health = time.monotonic()
        self.done = threading.Event()

    # -- the loop ------------------------------------------------------------------------

    def wait(self) -> CellResult:
        """Poll until the cell ends; Ctrl-C asks for a consistent stop, twice escalates.

        While waiting, SIGINT only sets a flag: a KeyboardInterrupt raised inside
        ipyparallel's client code could leave its message routing half-updated.
        """
        with _interrupts_as_flags() as pending:
            while True:
                try:
                    if self.poll():
                        break
                    if pending:
                        pending.clear()
                        self.interrupt()
                        continue
                    self.ar.wait(POLL_SECONDS)  # returns the moment the cell ends
                except KeyboardInterrupt:  # not the main thread: no handler could be installed
                    self.interrupt()
        return self.finish()

    def poll(self) -> bool:
        """One polling round; return True when the cell has ended on every rank (or was given up)."""
        self._drain_output()
        self._drain_records()
        self._check_ranks()
        if self.ar.ready():
            return True
        if self._failed_at is not None and time.monotonic() - self._failed_at > FAILURE_GRACE:
            self._abandon("ranks still running after another rank failed")
            return True
        if self._interrupt_at is not None and time.monotonic() - self._interrupt_at > INTERRUPT_GRACE:
            self._print("dtwork: ranks did not stop in time: aborting and restarting the engines", err=True)
            self._abandon("interrupted")
            return True
        return False

    def interrupt(self) -> None:
        """Relay a kernel interrupt: first a consistent stop, then an abort with restart."""
        self._interrupts += 1
        if self._interrupts == 1:
            self._interrupt_at = time.monotonic()
            self._print(
                "dtwork: interrupt: asking every rank to stop at the same step (interrupt again to abort)",
                err=True,
            )
            self.session.event("interrupt", "consistent stop requested")
            with contextlib.suppress(Exception):
                self.cluster.signal(signal.SIGUSR1, self.ranks)
        else:
            self._print(
                "dtwork: second interrupt: aborting the process group and restarting the engines", err=True
            )
            self.session.event("abort", "second interrupt: engines restarted")
            self._abandon("interrupted")
            self.result.status = "interrupted"

    def _abandon(self, why: str) -> None:
        """Give up on ranks that cannot finish: restart the engines so nothing is left waiting."""
        self.result.message = why
        self.restarted = True
        self.session.restart_after_failure(why)

    # -- output ----------------------------------------------------------------------------

    def _show_rank(self, i: int) -> bool:
        return not self.rank0 or self.ranks[i] == 0

    def _print(self, text: str, err: bool = False) -> None:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)

    def _drain_output(self, final: bool = False) -> None:
        if self.quiet:
            return
        multi = len(self.ranks) > 1 and not self.rank0
        for stream, positions in (("stdout", self._out_pos), ("stderr", self._err_pos)):
            texts = self._meta_values(stream)
            for i, text in enumerate(texts):
                if not self._show_rank(i) or not text:
                    continue
                new = text[positions[i] :]
                positions[i] = len(text)
                buf = self._partial.get((stream, i), "") + new
                lines = buf.split("\n")
                self._partial[(stream, i)] = "" if final else lines.pop()
                prefix = f"[rank {self.ranks[i]}] " if multi else ""
                out = "\n".join(prefix + ln for ln in lines if ln or not final)
                if final and not out.strip():
                    continue
                if out:
                    print(out, file=sys.stderr if stream == "stderr" else sys.stdout, flush=True)

    def _meta_values(self, key: str) -> list[Any]:
        """Each rank's ``key`` of the result's metadata, as ipyparallel's IO thread has it now.

        Read from the metadata dicts themselves: ``ar.stdout`` / ``ar.data`` would also parse the
        metadata's date strings with dateutil (four a cell, ~60 µs each), which nothing here
        needs.
        """
        try:
            return [md.get(key) for md in self.ar._metadata]
        except Exception:
            return []

    def _drain_records(self) -> None:
        data = self._meta_values("data")
        batch: list[dict[str, Any]] = []
        for i, d in enumerate(data):
            if not isinstance(d, dict):
                continue
            # Take each batch out of the result's metadata as it is read: a long cell neither
            # keeps its records twice nor rescans them at every poll. (ipyparallel's IO thread
            # adds keys meanwhile: list() and pop() are atomic, iterating the dict is not.)
            for key in sorted(k for k in list(d) if k.startswith("r")):
                batch.extend(d.pop(key, ()))
            if "progress" in d and d["progress"] != self.progress.get(self.ranks[i]):
                self.progress[self.ranks[i]] = d["progress"]
                self._progress_changed = True
        if batch:
            self.result.records += len(batch)
            self.session.persist(batch, self.seq)
            if self.on_records is not None and self.session.live:
                self.on_records(batch)
        dash = self.session.dashboard
        if dash is None or self.on_records is None or not self.session.live:
            return
        if self._progress_changed:
            self._progress_changed = False
            dash.progress(dict(self.progress))
        dash.tick()  # what an earlier poll fed inside the interval is drawn once it has passed

    # -- rank health ---------------------------------------------------------------------------

    def _check_ranks(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_health < 0.5:
            return
        self._last_health = now
        for rank, why in self.session.dead_ranks(self.ranks).items():
            if rank not in self._dead:
                self._dead[rank] = why
                self._print(f"dtwork: rank {rank} failed: {why}", err=True)
                self.session.event("rank_failure", f"rank {rank}: {why}", {"rank": rank})
                if self._failed_at is None:
                    self._failed_at = now
        if self._failed_at is None and self._metadata_errors():
            self._failed_at = now
        self._watchdog()

    def _metadata_errors(self) -> bool:
        return any(md.get("status") == "error" for md in self._metadata())

    def _metadata(self) -> list[dict[str, Any]]:
        try:
            return [dict(m) for m in self.ar._metadata]
        except Exception:
            return []

    def _watchdog(self) -> None:
        limit = self.session.stall_seconds
        if not limit or not self.progress:
            return
        now = time.time()
        stalled = {
            r: p
            for r, p in self.progress.items()
            if now - p.get("time", now) > limit and r not in self._stall_warned
        }
        if not stalled:
            return
        self._stall_warned.update(stalled)
        names = ", ".join(
            f"rank {r} (step {p.get('step')}, {p.get('phase', '?')}, {now - p['time']:.0f} s ago)"
            for r, p in sorted(stalled.items())
        )
        msg = f"dtwork: no progress for {limit:.0f} s from {names}"
        self._print(msg, err=True)
        self.session.event("stall", msg, {"ranks": sorted(stalled)})

    # -- the end -------------------------------------------------------------------------------

    def finish(self) -> CellResult:
        if self.ar.ready():
            # The reply can arrive before the last output and records: wait for them (bounded).
            self.ar.wait_for_output(5)
        self._drain_records()
        self._drain_output(final=True)
        if not self.ar.ready() or self._metadata_errors():
            # Survivors often fail at once when a peer dies: name the dead before concluding.
            self._check_ranks(force=True)
        self.result.seconds = time.monotonic() - self._t0
        if self.ar.ready():
            outcomes = self.ar.get(return_exceptions=True)
        else:
            outcomes = [ipp.error.EngineError(self._dead.get(r, "did not finish")) for r in self.ranks]
        for rank, out in zip(self.ranks, outcomes, strict=False):
            if isinstance(out, BaseException):
                self.result.errors[rank] = out
            self.result.results.append(out)
        for rank, why in self._dead.items():
            self.result.errors.setdefault(rank, ipp.error.EngineError(why))
        if self.result.status == "running":
            self.result.status = "ok" if not self.result.errors else "error"
            if self._interrupts and not self.result.errors:
                self.result.status = "interrupted"
        if self.result.ok or self.result.status == "interrupted":
            self._display_results()
        self.done.set()
        return self.result

    def _display_results(self) -> None:
        if self.quiet:
            return
        try:
            from IPython.display import display
        except ImportError:
            return
        multi = len(self.ranks) > 1 and not self.rank0
        for i, reply in enumerate(self.result.results):
            if not self._show_rank(i) or isinstance(reply, BaseException):
                continue
            for output in getattr(reply, "outputs", []) or []:
                display(output.get("data", {}), raw=True, metadata=output.get("metadata"))
            data = getattr(reply, "execute_result", None) or {}
            data = data.get("data") if isinstance(data, dict) else None
            if data:
                if multi:
                    print(f"[rank {self.ranks[i]}] Out:")
                display(data, raw=True)

    def failure(self) -> RankFailure:
        """One traceback (the first failing rank's) plus one status line per other rank."""
        errs = self.result.errors
        first = min(errs)
        lines = [
            f"dtwork: the cell failed on rank {first}"
            + (f" ({self.result.message})" if self.result.message else "")
        ]
        lines.append(_traceback(errs[first]))
        for rank in self.ranks:
            if rank == first:
                continue
            if rank in errs:
                lines.append(f"rank {rank}: {_error_line(errs[rank])}")
            else:
                lines.append(f"rank {rank}: ok")
        return RankFailure("\n".join(lines), ranks=sorted(errs))


class Session:
    """The trial session of a cluster: the current run, its store, its dashboard."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.run_id: int | None = None
        self.stall_seconds: float = STALL_SECONDS
        # Feed the live dashboard of cells that show output. Read at every poll: switched off
        # while a cell trains, the view pauses (records still go to the store); back on, it
        # resumes with the records that arrive from then on.
        self.live: bool = True
        self._store: Any = None
        self._lock = threading.Lock()
        self.background: CellWatcher | None = None
        self._bg_thread: threading.Thread | None = None
        self.dashboard: Any = None
        self.last: CellResult | None = None
        self.restarts_used = 0
        self._ranks_run: int | None = None  # the run the ranks were told (their ctx.run_id)
        self._procs: dict[int, psutil.Process] = {}  # engine PID -> its process, identity checked once

    # -- store -----------------------------------------------------------------------------

    @property
    def store(self) -> Any:
        if self._store is None:
            from dtwork.store import RunStore

            self._store = RunStore(self.cluster._store_path())
        return self._store

    def ensure_run(self) -> int:
        if self.run_id is None:
            c = self.cluster
            per_slot = (c.global_batch_size // c.world_size) if c.global_batch_size else None
            self.run_id = self.store.create_run(
                name=c.config.name,
                world_size=c.world_size,
                backend=c.backend,
                cluster_id=c.cluster_id,
                notebook=None,
                config_yaml=c.config.to_yaml(),
                global_batch_size=per_slot * c.world_size if per_slot else None,
                per_slot_batch_size=per_slot,
            )
            self.store.set_environment(self.run_id, environment(c))
            self.store.add_event(self.run_id, "start", f"run started on {c.world_size} rank(s), {c.backend}")
        return self.run_id

    def new_run(self) -> None:
        """End the current run; the next cell starts a new one (after a config change)."""
        if self.run_id is not None:
            self.store.set_run_status(self.run_id, "completed", ended=True)
        self.run_id = None
        self.restarts_used = 0

    def persist(self, records: list[dict[str, Any]], seq: int | None) -> None:
        """Write records to the store (first), as rows; events go to the events table."""
        if self.run_id is None:
            return
        rows: list[dict[str, Any]] = [{**row, "cell_seq": seq} for row in to_rows(records)]
        for rec in records:
            if rec.get("kind") == Kind.EVENT:
                self.store.add_event(self.run_id, rec.get("event", "rank"), rec.get("message", ""), rec)
        if rows:
            self.store.add_metrics(self.run_id, rows)

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        if self.run_id is not None:
            self.store.add_event(self.run_id, kind, message, data)

    # -- health ----------------------------------------------------------------------------

    def dead_ranks(self, ranks: list[int]) -> dict[int, str]:
        """Ranks whose engine is gone, with why: by PID on this host, by lost heartbeat elsewhere."""
        import socket

        host = socket.gethostname()
        out = {}
        try:
            registered = set(self.cluster.client.ids) if self.cluster.client is not None else None
        except Exception:
            registered = None
        for rank in ranks:
            info = self.cluster.rank_info[rank]
            if info.get("hostname") != host:
                if registered is not None and info["engine_id"] not in registered:
                    out[rank] = (
                        f"engine {info['engine_id']} on {info.get('hostname')} lost (no heartbeat: host or network down)"
                    )
                continue
            try:
                known = self._procs.get(info["pid"])
                if known is None:  # once per engine: is this PID still the engine that was probed?
                    probe = self.cluster._probes.get(info["engine_id"], {})
                    proc = psutil.Process(info["pid"])
                    if probe and abs(proc.create_time() - probe["create_time"]) > 0.01:
                        raise psutil.NoSuchProcess(info["pid"])
                    known = self._procs[info["pid"]] = proc
                # Later checks only read its state instead of building a new Process: a dead engine
                # is a zombie until its launcher reaps it, and a reaped PID is not handed out again
                # before the system's PIDs wrap around.
                if known.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(info["pid"])
            except psutil.NoSuchProcess:
                self._procs.pop(info["pid"], None)
                out[rank] = (
                    f"engine process {info['pid']} on {info.get('hostname')} died{self._exit_reason(info)}"
                )
        return out

    def _exit_reason(self, info: dict[str, Any]) -> str:
        code = None
        ipc = self.cluster._ipp
        for es in ipc.engines.values() if ipc is not None else []:
            for launcher in getattr(es, "launchers", {}).values():
                if getattr(launcher, "pid", None) == info["pid"]:
                    code = (getattr(launcher, "stop_data", None) or {}).get("exit_code")
        if code is None:
            return ""
        if code < 0:
            try:
                return f" (signal {signal.Signals(-code).name})"
            except ValueError:
                return f" (signal {-code})"
        return f" (exit code {code})"

    def restart_after_failure(self, why: str) -> None:
        self.event("restart", f"engines restarted: {why}")
        self.cluster.restart(force=True)

    def on_restart(self) -> None:
        """Called by the cluster after a restart (fresh engines)."""
        self._procs.clear()
        self._ranks_run = None

    def _tell_ranks(self, run_id: int) -> None:
        """Set ``ctx.run_id`` on the ranks (it names the run's checkpoint folder) when it changed."""
        if self._ranks_run != run_id:
            self.cluster._call(_set_run_id, (run_id,), {}, None)
            self._ranks_run = run_id

    # -- running cells ---------------------------------------------------------------------

    def run_cell(
        self, source: str, *, ranks: list[int] | None, rank0: bool, bg: bool, quiet: bool
    ) -> CellResult:
        if self.background is not None and not self.background.done.is_set():
            raise DtworkError("a background cell is still training: %dtrain wait (or attach) first")
        run_id = self.ensure_run()
        self._tell_ranks(run_id)
        seq = self.store.add_cell(run_id, source, ranks=ranks)
        rank_list = list(range(self.cluster.world_size)) if ranks is None else list(ranks)
        if not quiet:
            from dtwork.widgets import dashboard_ready

            # The live view's modules, if they are still loading (Cluster.start began it), load
            # before the ranks start: ~1.5 s of kernel CPU would otherwise compete with the cell.
            dashboard_ready()
        ar = self.cluster.view(rank_list).execute(source, silent=False, block=False)
        on_records = self._dashboard_feed(run_id, rank_list, quiet)
        watcher = CellWatcher(self, ar, rank_list, seq=seq, rank0=rank0, quiet=quiet, on_records=on_records)
        if bg:
            self.background = watcher
            self._bg_thread = threading.Thread(target=self._watch_bg, args=(watcher,), daemon=True)
            self._bg_thread.start()
            return watcher.result
        return self._conclude(watcher, watcher.wait())

    def _watch_bg(self, watcher: CellWatcher) -> None:
        while not watcher.poll():
            watcher.ar.wait(POLL_SECONDS)
        watcher.quiet = True
        watcher.finish()

    def wait_background(self) -> CellResult | None:
        """Bring a background cell back to the foreground and wait for it."""
        watcher = self.background
        if watcher is None:
            return None
        if self._bg_thread is not None:
            try:
                while self._bg_thread.is_alive():
                    self._bg_thread.join(0.1)
            except KeyboardInterrupt:
                watcher.interrupt()
                while self._bg_thread.is_alive():
                    self._bg_thread.join(0.1)
        self.background = None
        return self._conclude(watcher, watcher.result)

    def _conclude(self, watcher: CellWatcher, result: CellResult) -> CellResult:
        status = {"ok": "ok", "interrupted": "interrupted"}.get(result.status, "error")
        err = None if not result.errors else _error_line(result.errors[min(result.errors)])
        if result.seq is not None and self.run_id is not None:
            self.store.finish_cell(self.run_id, result.seq, status, err)
            if status == "error":
                self.event("error", f"cell {result.seq}: {err}")
        self.last = result
        if self.dashboard is not None:
            self.dashboard.finish(result)
        if watcher._dead and not watcher.restarted:
            recovered = self._recover(watcher)
            if recovered is not None:
                return recovered
        if result.errors:
            self._settle([r for r in result.errors if r not in watcher._dead])
            raise watcher.failure()
        return result

    def _settle(self, ranks: list[int], tries: int = 40) -> None:
        """Wait until ranks that raised stop aborting requests (ipykernel aborts what arrives
        right after an error), so the next cell is not refused with TaskAborted."""
        if not ranks or self.cluster.state != "running":
            return
        for _ in range(tries):
            try:
                self.cluster.view(ranks).execute("", silent=True, block=False).get(timeout=5)
                return
            except ipp.error.TaskAborted:
                time.sleep(0.05)
            except (ipp.error.CompositeError, ipp.error.RemoteError) as exc:
                if "TaskAborted" not in str(exc):
                    return
                time.sleep(0.05)
            except Exception:
                return

    def _recover(self, watcher: CellWatcher) -> CellResult | None:
        """After a rank died: fresh engines; with restarts left, replay the run from its checkpoint."""
        dead = ", ".join(f"rank {r}" for r in sorted(watcher._dead))
        print(
            f"dtwork: {dead} died: restarting the engines (fresh process group)", file=sys.stderr, flush=True
        )
        self.restart_after_failure(f"{dead} died")
        watcher.restarted = True
        limit = self.cluster.config.max_restarts
        if self.restarts_used >= limit or self.run_id is None:
            return None
        self.restarts_used += 1
        self.event(
            "resume",
            f"restart {self.restarts_used} of {limit}: replaying the run's cells from the last checkpoint",
        )
        print(
            f"dtwork: restart {self.restarts_used} of {limit}: replaying the run from its last checkpoint",
            file=sys.stderr,
        )
        self.cluster._call(_set_auto_resume, (True,), {}, None)
        self._tell_ranks(self.run_id)
        try:
            result = None
            for cell in self.store.cells(self.run_id):
                ar = self.cluster.view().execute(cell["source"], silent=False, block=False)
                replay = CellWatcher(
                    self, ar, list(range(self.cluster.world_size)), seq=cell["seq"], rank0=False, quiet=True
                )
                result = replay.wait()
                if result.errors:
                    return self._conclude(replay, result)
                self.store.finish_cell(self.run_id, cell["seq"], "ok")
            return result
        finally:
            if self.cluster.state == "running":
                self.cluster._call(_set_auto_resume, (False,), {}, None)

    def _dashboard_feed(
        self, run_id: int, ranks: list[int], quiet: bool
    ) -> Callable[[list[dict[str, Any]]], None] | None:
        self.dashboard = None  # the last cell's, finished already
        if quiet:
            return None
        try:
            from dtwork.widgets.dashboard import Dashboard
        except ImportError:
            return None

        def feed(records: list[dict[str, Any]]) -> None:
            # Made at the first records: a cell that logs nothing shows no empty dashboard.
            if self.dashboard is None:
                self.dashboard = Dashboard.for_cell(self, run_id, ranks, trailing=False, drawer=True)
            self.dashboard.feed(records)

        return feed

    def close(self) -> None:
        if self.run_id is not None and self._store is not None:
            self.store.set_run_status(self.run_id, "completed", ended=True)
            self.event("stop", "cluster stopped")
        if self._store is not None:
            self._store.close()
            self._store = None
        self.run_id = None


def environment(cluster: Any) -> dict[str, Any]:
    """Versions, hosts, devices and seeds of a cluster's run (no secrets)."""
    import platform
    from importlib import metadata

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
        "backend": cluster.backend,
        "world_size": cluster.world_size,
        "hosts": sorted({r.get("hostname") for r in cluster.rank_info}),
        "ranks": cluster.rank_info,
        "gpus": [g.to_dict() for g in __import__("dtwork.telemetry", fromlist=["x"]).gpu_inventory()],
        "seed": cluster.config.seed,
    }


def _set_auto_resume(on: bool) -> None:
    from dtwork.runtime import current

    current().auto_resume = on


def _set_run_id(run_id: int) -> None:
    from dtwork.runtime import current

    current().run_id = run_id


def _boxed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
    """Call ``fn`` on an engine and return its value in a one-item list.

    ipyparallel sorts the keys of a dict it sends back at the top level, so a dict whose keys
    do not compare (``{0: ..., "total": ...}``) would fail to come back; inside a list it is
    pickled as it is.
    """
    return [fn(*args, **kwargs)]


def _first_error(exc: Exception) -> tuple[str, str]:
    """(exception name, message) of the first rank's failure in an ipyparallel error."""
    if isinstance(exc, ipp.error.CompositeError) and exc.elist:
        return str(exc.elist[0][0]), str(exc.elist[0][1])
    return str(getattr(exc, "ename", type(exc).__name__)), str(getattr(exc, "evalue", exc))


def call_on_ranks(
    cluster: Any, fn: Callable[..., Any], args: Any, kwargs: Any, ranks: list[int] | None
) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` on every rank; return the results by rank (raise on failure)."""
    ar = cluster.view(ranks).apply_async(_boxed, fn, *args, **kwargs)
    try:
        return [box[0] for box in ar.get()]
    except (ipp.error.CompositeError, ipp.error.RemoteError) as exc:
        ename, evalue = _first_error(exc)
        name = getattr(fn, "__name__", type(fn).__name__)
        raise RankFailure(f"{name} failed: {ename}: {evalue}") from None


def pull_by_rank(cluster: Any, name: str, ranks: list[int] | None) -> list[Any]:
    """Fetch ``name`` from every rank's namespace; a list by rank."""
    if not isinstance(name, str) or not name.isidentifier():
        raise DtworkError(f"pull takes a variable name, got {name!r}")
    try:  # a one-name list comes back as a list per rank: see _boxed
        return [box[0] for box in cluster.view(ranks).pull([name], block=True)]
    except (ipp.error.CompositeError, ipp.error.RemoteError) as exc:
        ename, evalue = _first_error(exc)
        if ename == "NameError":
            raise DtworkError(
                f"no variable {name!r} on every rank: define it in a %%dtrain cell first"
            ) from None
        raise DtworkError(f"could not fetch {name!r} from the ranks: {ename}: {evalue}") from None
