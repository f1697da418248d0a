"""The cell watcher: follows one cell on the ranks until it ends.

It streams output by rank, takes the records the ranks publish (datapub) and hands them to its
host (the session, which writes them to the store first, then to the dashboard), relays
interrupts (first: a consistent stop at the same step on every rank; second: abort and restart)
and notices dead or stalled ranks. It talks to the host only through ``CellHost``.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ipyparallel as ipp

from dtwork.errors import RankFailure
from dtwork.kernel.output import RankOutput
from dtwork.kernel.progress import Progress, ProgressWatch
from dtwork.kernel.stacks import RankStacks
from dtwork.kernel.tracebacks import (
    ANSI,
    collective_mismatch,
    error_line,
    left_after_peer,
    remote_traceback,
    short_traceback,
    stopped_by_interrupt,
)
from dtwork.shared.records import SETTINGS_KEY, CellSettings, Mark, Record, batch_mark

POLL_SECONDS = 0.1
INTERRUPT_GRACE = 10.0  # seconds for ranks to stop after a consistent stop is asked, on top of steps
GRACE_STEPS = 3  # steps the grace adds: the one under way, one more for a sync in flight, a checkpoint
FAILURE_GRACE = 5.0  # seconds survivors get to finish after another rank failed


@dataclass
class CellResult:
    """What one cell produced, by rank."""

    seq: int | None
    ranks: list[int]
    status: str = "running"
    results: list[object] = field(default_factory=list)  # by rank: replies or exceptions
    errors: dict[int, BaseException] = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""
    records: int = 0
    settings: CellSettings | None = None  # what the cell left, as its first rank sent it when it ended well

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class CellHost(Protocol):
    """What a watcher needs of whoever runs the cell (``session.Session`` implements it)."""

    @property
    def live(self) -> bool:
        """Whether the live view is fed now (read at every poll: it can be paused mid-cell)."""
        ...

    @property
    def stall_seconds(self) -> float:
        """Seconds without progress before a stall is named (0: never)."""
        ...

    @property
    def engine_log(self) -> Path | None:
        """The engines' log file, named when a rank dies."""
        ...

    def in_background(self, watcher: CellWatcher) -> bool: ...

    def persist(self, records: list[Record], seq: int | None, marks: list[Mark]) -> None: ...

    def flush(self, final: bool = False) -> None:
        """Write what waits for the store when due (rows alone wait up to a second; ``final``: the cell
        ended, its rows go now); a refusing store is tried again at most once a second."""

    def event(self, kind: str, message: str, data: Mapping[str, object] | None = None) -> None: ...

    def dead_ranks(self, ranks: list[int]) -> dict[int, str]: ...

    def interrupt_ranks(self, ranks: list[int]) -> None:
        """Ask the ranks for a consistent stop (SIGUSR1 to their engines)."""
        ...

    def restart_after_failure(self, why: str) -> None: ...

    def stacks(self, ranks: list[int]) -> RankStacks:
        """The ranks' Python stacks now (asked on a side channel that answers while they are blocked)."""
        ...

    def debug_stop(self, rank: int, stop: Mapping[str, object]) -> None:
        """Run the pdb prompt of ``rank``, stopped at ``breakpoint()``, until it continues or quits."""
        ...

    def show_progress(self, progress: dict[int, Progress]) -> None:
        """Hand the ranks' progress to the live view, if one is showing."""
        ...


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (widgets can be shown), not a script or a terminal."""
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell
        from IPython import get_ipython
    except ImportError:
        return False
    # The shell's own class is asked: a plain InteractiveShell (a test, a terminal) makes
    # ``ZMQInteractiveShell.initialized()`` true too, through the singleton it shares.
    return isinstance(get_ipython(), ZMQInteractiveShell)


@contextlib.contextmanager
def interrupts_as_flags() -> Iterator[list[int]]:
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


@dataclass
class _Interrupts:
    """The kernel interrupts a cell has had: how many, when the first asked for a stop, its grace."""

    count: int = 0
    asked_at: float | None = None
    grace: float = INTERRUPT_GRACE


class CellWatcher:
    """Follow one AsyncResult until it ends: output, records, failures, interrupts."""

    def __init__(
        self,
        host: CellHost,
        ar: ipp.AsyncResult,
        ranks: list[int],
        *,
        seq: int | None,
        rank0: bool,
        quiet: bool,
        on_records: Callable[[list[Record]], None] | None = None,
    ) -> None:
        self.host = host
        self.ar = ar
        self.on_records = on_records
        self.result = CellResult(seq, ranks)
        self.output = RankOutput(ranks, rank0=rank0, quiet=quiet)
        # Outside a notebook (a script, a terminal) progress is a plain line now and then.
        self.watch = ProgressWatch(text=not quiet and not host.live and not in_notebook())
        self._interrupts = _Interrupts()
        self._failed_at: float | None = None
        self.dead: dict[int, str] = {}  # rank -> why its engine is gone
        self._t0 = time.monotonic()
        self.restarted = False
        self.restart_after: str | None = None  # a background cell's engines restart once it ended, why
        # the first health check comes half a second in: a short cell pays none (a rank that died
        # between cells is found then, or at once when the cell fails)
        self._last_health = time.monotonic()
        # when the stacks were last read for a hang without progress (infinity once shown: never again)
        self._stacks_looked = self._t0
        self.done = threading.Event()

    @property
    def ranks(self) -> list[int]:
        return self.result.ranks

    @property
    def seq(self) -> int | None:
        return self.result.seq

    @property
    def rank0(self) -> bool:
        return self.output.rank0

    @property
    def quiet(self) -> bool:
        return self.output.quiet

    @quiet.setter
    def quiet(self, value: bool) -> None:
        self.output.quiet = value

    @property
    def progress(self) -> dict[int, Progress]:
        """Each rank's latest progress."""
        return self.watch.progress

    @property
    def step_time(self) -> float:
        """The slowest rank's latest step time in seconds (0 before any was measured)."""
        return self.watch.step_time

    # -- the loop ------------------------------------------------------------------------

    def wait(self) -> CellResult:
        """Poll until the cell ends; Ctrl-C asks for a consistent stop, twice escalates.

        While waiting, SIGINT only sets a flag: a KeyboardInterrupt raised inside
        ipyparallel's client code could leave its message routing half-updated.
        """
        with interrupts_as_flags() as pending:
            while True:
                try:
                    # It returns the moment the cell ends; finish() then takes what is left in one go.
                    if self.ar.wait(POLL_SECONDS) and not pending:
                        break
                    if self.poll():
                        break
                    if pending:
                        pending.clear()
                        self.interrupt()
                except KeyboardInterrupt:  # not the main thread: no handler could be installed
                    self.interrupt()
        return self.finish()

    def poll(self) -> bool:
        """One polling round; return True when the cell has ended on every rank (or was given up)."""
        self.output.drain(self._metadata())
        self._drain_records()
        if self.watch.stops and not self.host.in_background(self):
            self.drive_stops()
        self._check_ranks()
        if self.ar.ready():
            return True
        if self._failed_at is not None and time.monotonic() - self._failed_at > FAILURE_GRACE:
            if self.dead:
                # Survivors blocked on a dead peer (NCCL never releases them): the cell fails now,
                # naming the dead rank; the engines restart after (replay.Replay.recover, or for a
                # background cell its thread, once the failure is known: not before it)
                self.result.message = "ranks still running after another rank died"
                if self.host.in_background(self):
                    self.restarted = True
                    self.restart_after = self.result.message
            else:
                self._abandon("ranks still running after another rank failed")
            return True
        asked = self._interrupts
        if asked.asked_at is not None and time.monotonic() - asked.asked_at > asked.grace:
            asked.asked_at = None  # said once; only a second interrupt aborts
            self._print(
                f"dtwork: ranks have not stopped after {asked.grace:.0f} s: still waiting; "
                "interrupt again to abort the process group and restart the engines (names on the ranks are lost)",
                err=True,
            )
        return False

    def drive_stops(self) -> None:
        """Each rank stopped at ``breakpoint()`` gets its pdb prompt in turn (from the main thread:
        the notebook's input box needs it); the others' wait meanwhile is no stall."""
        while self.watch.stops:
            self.host.debug_stop(*self.watch.stops.pop(0))
        self.watch.excuse()
        self._stacks_looked = max(self._stacks_looked, time.monotonic())

    def interrupt(self) -> None:
        """Relay a kernel interrupt: first a consistent stop, then an abort with restart."""
        asked = self._interrupts
        asked.count += 1
        if asked.count == 1:
            asked.asked_at = time.monotonic()
            asked.grace = INTERRUPT_GRACE + GRACE_STEPS * self.step_time
            steps = f" (steps take {self.step_time:.1f} s)" if self.step_time >= 1 else ""
            self._print(
                f"dtwork: interrupt: asking every rank to stop at the same step; waiting up to "
                f"{asked.grace:.0f} s{steps}; interrupt again to abort",
                err=True,
            )
            self.host.event("interrupt", "consistent stop requested")
            with contextlib.suppress(Exception):
                self.host.interrupt_ranks(self.ranks)
        else:
            self._print(
                "dtwork: second interrupt: aborting the process group and restarting the engines", err=True
            )
            self.host.event("abort", "second interrupt: engines restarted")
            self._abandon("interrupted")
            self.result.status = "interrupted"

    def _abandon(self, why: str) -> None:
        """Give up on ranks that cannot finish: restart the engines so nothing is left waiting."""
        self.result.message = why
        self.restarted = True
        self.host.restart_after_failure(why)

    # -- output and records ------------------------------------------------------------------

    def _print(self, text: str, err: bool = False) -> None:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)

    def _metadata(self) -> list[dict[str, Any]]:  # ipyparallel's metadata: JSON from messages
        """Each rank's metadata dict, as ipyparallel's IO thread has it now (updated in place)."""
        try:
            md = self.ar.metadata
        except Exception:
            return []
        return md if isinstance(md, list) else [md]

    def _drain_records(self) -> None:
        watch = self.watch
        batch: list[Record] = []
        marks: list[Mark] = []  # each batch's (rank, stream, seq): stored with its records
        for i, md in enumerate(self._metadata()):
            d = md.get("data")
            if not isinstance(d, dict):
                continue
            # Take each batch out of the result's metadata as it is read: a long cell neither
            # keeps its records twice nor rescans them at every poll. (ipyparallel's IO thread
            # adds keys meanwhile: list() and pop() are atomic, iterating the dict is not.)
            for key in sorted(k for k in list(d) if k.startswith("r")):
                batch.extend(d.pop(key, ()))
                marks.extend(m for m in [batch_mark(self.ranks[i], key)] if m is not None)
            if SETTINGS_KEY in d:
                self.result.settings = d.pop(SETTINGS_KEY)
            if "progress" in d:
                watch.take(self.ranks[i], d["progress"])
            if "pdb" in d and watch.stopped(self.ranks[i], d["pdb"]) and self.host.in_background(self):
                self._print(
                    f"dtwork: rank {self.ranks[i]} stopped at breakpoint(): %dtrain wait gives its prompt"
                )
        if batch:
            self.result.records += len(batch)
            self.host.persist(batch, self.seq, marks)
            watch.keep(batch)
            if self.on_records is not None and self.host.live:
                self.on_records(batch)
        else:
            self.host.flush()  # what the store refused earlier is tried again
        if watch.text and watch.changed:
            self._say(watch.line())
        if self.on_records is None or not self.host.live:
            return
        if watch.changed:
            watch.changed = False
            self.host.show_progress(dict(watch.progress))

    def _say(self, line: str | None) -> None:
        if line is not None:
            self._print(line)

    # -- rank health ---------------------------------------------------------------------------

    def _check_ranks(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_health < 0.5:
            return
        self._last_health = now
        for rank, why in self.host.dead_ranks(self.ranks).items():
            if rank not in self.dead:
                self.dead[rank] = why
                log = f" (engine log: {self.host.engine_log})" if self.host.engine_log else ""
                self._print(f"dtwork: rank {rank} failed: {why}{log}", err=True)
                self.host.event("rank_failure", f"rank {rank}: {why}", {"rank": rank})
                if self._failed_at is None:
                    self._failed_at = now
        if self._failed_at is None and self._metadata_errors():
            self._failed_at = now
        if self.watch.stops:
            return  # a rank waits at breakpoint() for %dtrain wait: the others' wait is no hang
        stall = self.watch.stall(self.host.stall_seconds)
        if stall is not None:
            self._print(stall[0], err=True)
            self.host.event("stall", *stall)
            self._show_stacks(self._read_stacks())
        elif not self.watch.progress:
            self._hang_without_progress(now)

    def _hang_without_progress(self, now: float) -> None:
        """A cell that reports no progress (no loop) is hung when, after the stall time, some of
        its ranks wait in a collective: say so with the stacks, once."""
        limit = self.host.stall_seconds
        if not limit or now - self._stacks_looked < limit:
            return
        self._stacks_looked = now
        stacks = self._read_stacks()
        waiting = stacks.waiting() if stacks is not None else []
        if not waiting:
            return
        others = sorted(set(self.ranks) - set(waiting))
        names = ", ".join(f"rank {r}" for r in waiting)
        msg = f"dtwork: no progress for {now - self._t0:.0f} s: {names} wait{'s' * (len(waiting) == 1)} in a collective"
        if others:
            msg += f" that {', '.join(f'rank {r}' for r in others)} did not reach"
        self._print(msg, err=True)
        self.host.event("stall", msg, {"ranks": others, "waiting": waiting})
        self._show_stacks(stacks)

    def _read_stacks(self) -> RankStacks | None:
        try:
            return self.host.stacks(self.ranks)
        except Exception as exc:  # the hang is named already; the stacks are extra
            self._print(f"dtwork: could not read the ranks' stacks: {exc}", err=True)
            return None

    def _show_stacks(self, stacks: RankStacks | None) -> None:
        if stacks is None:
            return
        self._stacks_looked = math.inf
        self._print(stacks.text(), err=True)
        self.host.event("stacks", stacks.summary(), {"text": stacks.text()})

    def _metadata_errors(self) -> bool:
        return any(md.get("status") == "error" for md in self._metadata())

    # -- the end -------------------------------------------------------------------------------

    def finish(self) -> CellResult:
        if self.ar.ready():
            # The reply can arrive before the last output and records: wait for them (bounded).
            self.ar.wait_for_output(5)
        self._drain_records()
        self.host.flush(final=True)  # a cell's last rows now, not a second later (or at %dtrain wait)
        self.output.drain(self._metadata(), final=True)
        if not self.ar.ready() or self._metadata_errors():
            # Survivors often fail at once when a peer dies: name the dead before concluding.
            self._check_ranks(force=True)
        result = self.result
        result.seconds = time.monotonic() - self._t0
        if self.ar.ready():
            outcomes = self.ar.get(return_exceptions=True)
        else:
            outcomes = [ipp.error.EngineError(self.dead.get(r, "did not finish")) for r in self.ranks]
        for rank, out in zip(self.ranks, outcomes, strict=False):
            if isinstance(out, BaseException):
                result.errors[rank] = out
            result.results.append(out)
        for rank, why in self.dead.items():
            result.errors.setdefault(rank, ipp.error.EngineError(why))
        if result.status == "running":
            result.status = "ok" if not result.errors else "error"
            if self._interrupts.count and all(map(stopped_by_interrupt, result.errors.values())):
                result.status = "interrupted"  # a hand loop stops by a KeyboardInterrupt on its ranks
        if self.watch.text and self.watch.anything:
            self._say(self.watch.line(end=f"{result.status} in {result.seconds:.1f} s"))
        if result.ok or result.status == "interrupted":
            self.output.display(result.results)
        self.done.set()
        return result

    def failure(self) -> RankFailure:
        """One traceback (the first failing rank's) plus one status line per other rank."""
        errs = self.result.errors
        first = min(errs, key=lambda r: (r not in self.dead, left_after_peer(errs[r]), r))  # the cause first
        mismatch = collective_mismatch(errs)
        lines = [
            f"dtwork: the cell failed on rank {first}"
            + (f" ({self.result.message})" if self.result.message else "")
            + (f": {mismatch[0]}" if mismatch else "")
        ]
        whole = remote_traceback(errs[first])
        short, changed = short_traceback(whole)
        if changed and self.host.engine_log is not None:
            with contextlib.suppress(OSError), self.host.engine_log.open("a") as log:
                log.write(
                    f"rank {first}'s whole traceback (cell {self.result.seq}):\n{ANSI.sub('', whole)}\n"
                )
            short += f"\n(the whole traceback: {self.host.engine_log})"
        lines.append(short if in_notebook() else ANSI.sub("", short))
        if "restart your runtime" in whole:  # a library's process-wide state refuses a change
            lines.append("dtwork: %dtrain restart gives every rank a new process (a few seconds)")
        for rank in self.ranks:
            if rank == first:
                continue
            if mismatch and rank in mismatch[1]:
                lines.append(f"rank {rank}: the same mismatch")
            elif rank in errs and left_after_peer(errs[rank]) and not left_after_peer(errs[first]):
                lines.append(f"rank {rank}: left its collective when rank {first} failed")
            elif rank in errs:
                lines.append(f"rank {rank}: {error_line(errs[rank])}")
            else:
                lines.append(f"rank {rank}: ok")
        return RankFailure("\n".join(lines), ranks=sorted(errs))
