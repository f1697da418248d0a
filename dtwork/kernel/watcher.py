"""The cell watcher: follows one cell on the ranks until it ends.

It streams output by rank, takes the records the ranks publish (datapub) and hands them to its
host (the session, which writes them to the store first, then to the dashboard), relays
interrupts (first: a consistent stop at the same step on every rank; second: abort and restart)
and notices dead or stalled ranks. It talks to the host only through ``CellHost``.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ipyparallel as ipp

from dtwork.errors import RankFailure
from dtwork.shared.records import Kind

POLL_SECONDS = 0.1
PROGRESS_SECONDS = 5.0  # how often a cell outside a notebook prints a line of progress
INTERRUPT_GRACE = 10.0  # seconds for ranks to stop after a consistent stop is asked, on top of steps
GRACE_STEPS = 3  # steps the grace adds: the one under way, one more for a sync in flight, a checkpoint
FAILURE_GRACE = 5.0  # seconds survivors get to finish after another rank failed


@dataclass
class CellResult:
    """What one cell produced, by rank."""

    seq: int | None
    ranks: list[int]
    status: str = "running"
    results: list[Any] = field(default_factory=list)
    errors: dict[int, BaseException] = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""
    records: int = 0

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

    def persist(self, records: list[dict[str, Any]], seq: int | None) -> None: ...

    def flush(self) -> None: ...

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None: ...

    def dead_ranks(self, ranks: list[int]) -> dict[int, str]: ...

    def interrupt_ranks(self, ranks: list[int]) -> None:
        """Ask the ranks for a consistent stop (SIGUSR1 to their engines)."""
        ...

    def restart_after_failure(self, why: str) -> None: ...

    def show_progress(self, progress: dict[int, dict[str, Any]]) -> None:
        """Hand the ranks' progress to the live view, if one is showing."""
        ...


def stopped_first(progress: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The ranks whose progress stopped first: the fewest steps (a rank waiting in a collective has
    gone on to the next step); all of them when the steps do not tell."""
    going = {r: p for r, p in progress.items() if p.get("phase") != "done"} or progress
    steps = {r: p["step"] for r, p in going.items() if isinstance(p.get("step"), int)}
    if not steps:
        return dict(going)
    low = min(steps.values())
    return {r: going[r] for r, s in steps.items() if s == low}


def error_line(err: BaseException) -> str:
    if isinstance(err, ipp.error.RemoteError):
        return f"{err.ename}: {err.evalue}"
    return f"{type(err).__name__}: {err}"


def _left_after_peer(err: BaseException) -> bool:
    """Whether a rank raised only because another rank failed (its group was aborted)."""
    line = error_line(err)
    return line.startswith("PeerFailure") or "closed by peer" in line or "reset by peer" in line


def stopped_by_interrupt(err: BaseException) -> bool:
    """Whether a rank raised only because the cell was interrupted (outside ``ctx.steps`` the stop
    signal raises KeyboardInterrupt), or because another rank was."""
    return error_line(err).startswith("KeyboardInterrupt") or _left_after_peer(err)


def _traceback(err: BaseException) -> str:
    """The rank's whole traceback, without ipyparallel's ``[n:execute]`` line (colours kept)."""
    if not isinstance(err, ipp.error.RemoteError):
        return error_line(err)
    return "\n".join(ln for ln in err.render_traceback() if not re.fullmatch(r"\[\d+:\w+\]", ln))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FRAME = re.compile(r"(Cell In\[\d+\]|Input In \[\d+\]|File )")  # a frame's first line in IPython's text
_ARROW = re.compile(r"\s*-+> ")  # the frame's line that was running
_TORCH = re.compile(r"[/\\](site|dist)-packages[/\\]torch[/\\]")
_DTWORK = re.compile(r"[/\\]dtwork[/\\]runtime[/\\]")
_PLUMBING = re.compile(r"IPython[/\\]core[/\\]|run_line_magic\('run'|[/\\]dtwork[/\\]runtime[/\\]script\.py")
_CHAINED = re.compile(
    r"^(?:\x1b\[[0-9;]*m)*(During handling of the above exception|The above exception was the direct cause)",
    re.M,
)


def _frames(text: str) -> tuple[list[str], list[list[str]], list[str]] | None:
    """IPython's traceback text as (head, frames, error lines); None when it is not that shape."""
    head: list[str] = []
    frames: list[list[str]] = []
    tail: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        plain = _ANSI.sub("", line)
        if _FRAME.match(plain):
            current = [line]
            frames.append(current)
        elif not plain.strip() or plain.lstrip().startswith("[... skipping hidden"):
            current = None
        elif current is not None:
            current.append(line)
        elif frames:
            tail.append(line)
        elif plain.strip("-"):
            head.append(line)
    return (head, frames, tail) if frames and tail else None


def _short_traceback(text: str) -> tuple[str, bool]:
    """The traceback from the user's first frame on, each frame its running line, and runs of
    torch's (and dtwork's) frames folded into one line that says how many; whether it changed."""
    cuts = [m.start() for m in _CHAINED.finditer(text)]
    if cuts:  # chained exceptions: each traceback on its own, with the line that joins them
        bounds = [0, *cuts, len(text)]
        pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        done = [_short_traceback(pieces[0])]
        for piece in pieces[1:]:
            joint, _, rest = piece.partition("\n")
            short, changed = _short_traceback(rest)
            done.append((f"{joint}\n{short}", changed))
        return "\n\n".join(p for p, _ in done), any(c for _, c in done)
    parts = _frames(text)
    if parts is None:
        return text, False
    head, frames, tail = parts
    while frames and _PLUMBING.search(_ANSI.sub("", "\n".join(frames[0]))):
        frames.pop(0)  # %run's own frames: the traceback starts at the user's code
    lines: list[str] = list(head)
    folded: list[str] = []  # where each frame of the run being folded is: torch or dtwork
    for i, frame in enumerate(frames + [[""]]):
        where = _ANSI.sub("", frame[0])
        inside = "torch" if _TORCH.search(where) else "dtwork" if _DTWORK.search(where) else None
        if inside is not None:
            folded.append(inside)
            continue
        if folded:
            n, names = len(folded), " and ".join(sorted(set(folded), reverse=True))
            lines.append(f"    [... {n} frame{'s' * (n > 1)} inside {names}]")
            folded = []
        if i < len(frames):
            lines.append(frame[0])
            lines.extend(ln for ln in frame[1:] if _ARROW.match(_ANSI.sub("", ln)))
    return "\n".join([*lines, *tail]), True


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
def _interrupts_as_flags() -> Iterator[list[int]]:
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
        host: CellHost,
        ar: ipp.AsyncResult,
        ranks: list[int],
        *,
        seq: int | None,
        rank0: bool,
        quiet: bool,
        on_records: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.host = host
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
        self._grace = INTERRUPT_GRACE
        self._step_times: dict[Any, float] = {}  # each rank's latest measured step time (perf records)
        self._stall_warned: set[tuple[int, Any]] = set()  # (rank, step) already named
        self.dead: dict[int, str] = {}  # rank -> why its engine is gone
        self._t0 = time.monotonic()
        self.restarted = False
        self._progress_changed = False
        # the first health check comes half a second in: a short cell pays none (a rank that died
        # between cells is found then, or at once when the cell fails)
        self._last_health = time.monotonic()
        self.done = threading.Event()
        # Outside a notebook (a script, a terminal) progress is a plain line now and then.
        self._text = not quiet and not host.live and not in_notebook()
        self._said_at = time.monotonic()
        self._last_values: dict[str, Any] = {}

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
            if self.dead and not self.host.in_background(self):
                # Survivors blocked on a dead peer (NCCL never releases them): the cell fails now,
                # the session then restarts the engines (Session._recover).
                self.result.message = "ranks still running after another rank died"
            else:
                self._abandon("ranks still running after another rank failed")
            return True
        if self._interrupt_at is not None and time.monotonic() - self._interrupt_at > self._grace:
            self._interrupt_at = None  # said once; only a second interrupt aborts
            self._print(
                f"dtwork: ranks have not stopped after {self._grace:.0f} s: still waiting; "
                "interrupt again to abort the process group and restart the engines (names on the ranks are lost)",
                err=True,
            )
        return False

    def interrupt(self) -> None:
        """Relay a kernel interrupt: first a consistent stop, then an abort with restart."""
        self._interrupts += 1
        if self._interrupts == 1:
            self._interrupt_at = time.monotonic()
            self._grace = INTERRUPT_GRACE + GRACE_STEPS * self.step_time
            steps = f" (steps take {self.step_time:.1f} s)" if self.step_time >= 1 else ""
            self._print(
                f"dtwork: interrupt: asking every rank to stop at the same step; waiting up to "
                f"{self._grace:.0f} s{steps}; interrupt again to abort",
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

    def _metadata(self) -> list[Any]:
        """Each rank's metadata dict, as ipyparallel's IO thread has it now (updated in place)."""
        try:
            md = self.ar.metadata
        except Exception:
            return []
        return md if isinstance(md, list) else [md]

    def _meta_values(self, key: str) -> list[Any]:
        """Each rank's ``key`` of the result's metadata."""
        return [md.get(key) for md in self._metadata()]

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
            self.host.persist(batch, self.seq)
            self._keep_step_time(batch)
            if self._text:
                self._keep_values(batch)
            if self.on_records is not None and self.host.live:
                self.on_records(batch)
        else:
            self.host.flush()  # what the store refused earlier is tried again
        if self._text and self._progress_changed:
            self._say_progress()
        if self.on_records is None or not self.host.live:
            return
        if self._progress_changed:
            self._progress_changed = False
            self.host.show_progress(dict(self.progress))

    def _keep_step_time(self, batch: list[dict[str, Any]]) -> None:
        """The slowest rank's latest step time, which an interrupt's grace follows."""
        for rec in batch:
            if isinstance(rec, dict) and rec.get("kind") == Kind.PERF and isinstance(rec.get("values"), dict):
                t = rec["values"].get("step_time")
                if isinstance(t, (int, float)) and t >= 0:
                    self._step_times[rec.get("rank")] = float(t)

    @property
    def step_time(self) -> float:
        """The slowest rank's latest step time in seconds (0 before any was measured)."""
        return max(self._step_times.values(), default=0.0)

    def _keep_values(self, batch: list[dict[str, Any]]) -> None:
        for rec in batch:
            if isinstance(rec, dict) and rec.get("kind") == Kind.LOG and isinstance(rec.get("values"), dict):
                self._last_values.update(rec["values"])

    def _say_progress(self, end: str = "") -> None:
        """One plain line: the slowest rank's step and the last logged values (at most 4)."""
        now = time.monotonic()
        if not end and (not self.progress or now - self._said_at < PROGRESS_SECONDS):
            return
        self._said_at, self._progress_changed = now, False
        steps = [int(p["step"]) for p in self.progress.values() if isinstance(p.get("step"), int)]
        total = next((p["total"] for p in self.progress.values() if p.get("total")), None)
        parts = [f"step {min(steps)}" + (f"/{total}" if total else "")] if steps else []
        for name, value in list(self._last_values.items())[:4]:
            parts.append(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}")
        if end:
            parts.append(end)
        if parts:
            self._print("dtwork: " + ", ".join(parts))

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
        self._watchdog()

    def _metadata_errors(self) -> bool:
        return any(md.get("status") == "error" for md in self._metadata())

    def _watchdog(self) -> None:
        limit = self.host.stall_seconds
        if not limit or not self.progress:
            return
        now = time.time()
        stalled = {
            r: p
            for r, p in self.progress.items()
            if now - p.get("time", now) > limit and (r, p.get("step")) not in self._stall_warned
        }
        if not stalled:
            return
        first = stopped_first(self.progress)
        if any(now - p.get("time", now) <= limit for p in first.values()):
            return  # the rank that stopped first still moves (or just caught up): nothing to name
        self._stall_warned.update((r, p.get("step")) for r, p in self.progress.items())  # once per stall
        names = ", ".join(
            f"rank {r} (step {p.get('step')}, {p.get('phase', '?')}, {now - p['time']:.0f} s ago)"
            for r, p in sorted(first.items())
        )
        waiting = sorted(set(self.progress) - set(first))
        after = f", stopped first; waiting for it: {', '.join(f'rank {r}' for r in waiting)}"
        msg = f"dtwork: no progress for {limit:.0f} s from {names}" + (after if waiting else "")
        self._print(msg, err=True)
        self.host.event("stall", msg, {"ranks": sorted(first), "waiting": waiting})

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
            outcomes = [ipp.error.EngineError(self.dead.get(r, "did not finish")) for r in self.ranks]
        for rank, out in zip(self.ranks, outcomes, strict=False):
            if isinstance(out, BaseException):
                self.result.errors[rank] = out
            self.result.results.append(out)
        for rank, why in self.dead.items():
            self.result.errors.setdefault(rank, ipp.error.EngineError(why))
        if self.result.status == "running":
            self.result.status = "ok" if not self.result.errors else "error"
            if self._interrupts and all(map(stopped_by_interrupt, self.result.errors.values())):
                self.result.status = "interrupted"  # a hand loop stops by a KeyboardInterrupt on its ranks
        if self._text and (self.progress or self._last_values):
            self._say_progress(end=f"{self.result.status} in {self.result.seconds:.1f} s")
        if self.result.ok or self.result.status == "interrupted":
            self._display_results()
        self.done.set()
        return self.result

    def _display_results(self) -> None:
        if self.quiet:
            return
        try:
            from IPython.core.interactiveshell import InteractiveShell
            from IPython.display import display as show
        except ImportError:
            return

        def display(data: dict[str, Any], raw: bool = True, metadata: dict[str, Any] | None = None) -> None:
            if InteractiveShell.initialized():
                show(data, raw=raw, metadata=metadata)
            elif isinstance(data, dict) and data.get("text/plain"):  # a script: the text, not a repr
                print(data["text/plain"])

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
        first = min(errs, key=lambda r: (r not in self.dead, _left_after_peer(errs[r]), r))  # the cause first
        lines = [
            f"dtwork: the cell failed on rank {first}"
            + (f" ({self.result.message})" if self.result.message else "")
        ]
        whole = _traceback(errs[first])
        short, changed = _short_traceback(whole)
        if changed and self.host.engine_log is not None:
            with contextlib.suppress(OSError), self.host.engine_log.open("a") as log:
                log.write(
                    f"rank {first}'s whole traceback (cell {self.result.seq}):\n{_ANSI.sub('', whole)}\n"
                )
            short += f"\n(the whole traceback: {self.host.engine_log})"
        lines.append(short if in_notebook() else _ANSI.sub("", short))
        if "restart your runtime" in whole:  # a library's process-wide state refuses a change
            lines.append("dtwork: %dtrain restart gives every rank a new process (a few seconds)")
        for rank in self.ranks:
            if rank == first:
                continue
            if rank in errs and _left_after_peer(errs[rank]) and not _left_after_peer(errs[first]):
                lines.append(f"rank {rank}: left its collective when rank {first} failed")
            elif rank in errs:
                lines.append(f"rank {rank}: {error_line(errs[rank])}")
            else:
                lines.append(f"rank {rank}: ok")
        return RankFailure("\n".join(lines), ranks=sorted(errs))
