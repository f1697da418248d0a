"""Every rank's Python stack, asked of each rank's stack thread, ranks alike grouped.

Each rank serves its threads' stacks on a side channel (``runtime/debug/stacks.py``), which
answers while the rank's main thread waits in a collective. This side arms the channels when
the ranks join, asks them all at once, and says what each rank is doing from the user's cell
down: "ranks 0,2,3: all_reduce float32[4] at cell line 7; rank 1: cell line 12".
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ipyparallel as ipp

from dtwork.kernel.replies import EngineReply
from dtwork.launch import rendezvous
from dtwork.runtime import entry

ASK_SECONDS = 3.0  # a rank's stack thread answers in milliseconds unless C code holds its GIL
ARM_SECONDS = 30.0
JOURNAL_SECONDS = 60.0  # a page of a rank's kept records, read from its spill file when it is long
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]dtwork[/\\]runtime[/\\]")
_STDLIB = os.path.dirname(os.__file__)
_INSIDE = re.compile(r"[/\\](?:site|dist)-packages[/\\](torch|dtwork)[/\\]|[/\\](dtwork)[/\\]runtime[/\\]")

Snapshot = dict[str, object]  # runtime/debug/stacks.py's Snapshot, as JSON brings it back
Frame = Mapping[str, object]


@dataclass
class StackChannels:
    """Where each rank's stack thread listens, and the token a request must carry."""

    token: str = ""
    where: dict[int, tuple[str, int]] = field(default_factory=dict)  # rank -> (address, port)
    processes: dict[int, str] = field(default_factory=dict)  # rank -> "PID on HOST", for py-spy

    def to_entry(self) -> dict[str, object]:
        """As the registry entry keeps it (0600: the token is no one else's), for a kernel that attaches."""
        return {"token": self.token, "where": {str(r): list(w) for r, w in self.where.items()}}

    @classmethod
    def of_entry(cls, data: Mapping[str, Any]) -> StackChannels:
        where = {int(r): (str(w[0]), int(w[1])) for r, w in dict(data.get("where") or {}).items()}
        return cls(str(data.get("token") or ""), where)


def arm(
    client: ipp.Client, rank_info: list[EngineReply], probes: Mapping[int, EngineReply], iface: str | None
) -> StackChannels:
    """Start every rank's stack thread (with a new token), on an address this kernel reaches."""
    token, host = secrets.token_hex(16), socket.gethostname()
    asked = {}
    for info in rank_info:
        local = info.get("hostname") == host
        addr = rendezvous.LOOPBACK if local else rendezvous.master_address(probes[info["engine_id"]], iface)
        asked[info["rank"]] = (addr, client[info["engine_id"]].apply_async(entry.serve_stacks, token, addr))
    where = {rank: (addr, int(ar.get(timeout=ARM_SECONDS))) for rank, (addr, ar) in asked.items()}
    processes = {info["rank"]: f"{info.get('pid')} on {info.get('hostname')}" for info in rank_info}
    return StackChannels(token, where, processes)


def busy(channels: StackChannels) -> dict[int, str]:
    """The ranks that run a cell now, with what each does (one line); none when none answers."""
    got = ask(channels, sorted(channels.where)).by_rank
    return {r: _doing(snap)[0] for r, snap in got.items() if isinstance(snap, dict) and snap.get("in_cell")}


def ask(channels: StackChannels, ranks: list[int], timeout: float = ASK_SECONDS) -> RankStacks:
    """Every rank's stacks, asked in parallel; a rank that does not answer says why."""
    got: dict[int, Snapshot | str] = {}

    def one(rank: int) -> None:
        if rank not in channels.where:
            got[rank] = "its stack thread was not started (a cluster from before this dtwork)"
            return
        try:
            got[rank] = _request(channels.where[rank], channels.token, timeout)
        except (OSError, ValueError) as exc:
            why = "no answer" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            got[rank] = (
                f"{why} within {timeout:.0f} s: C code holds its GIL, or its host is unreachable; "
                f"py-spy dump --pid {channels.processes.get(rank, '?')} sees it even then"
            )

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1)
    return RankStacks({r: got.get(r, "no answer") for r in ranks})


def journal(channels: StackChannels, rank: int, after: int, most: int) -> Snapshot:
    """What ``rank`` kept of its current (or last) cell (``runtime/core/journal.py``): its stream,
    start, end, and its batches past seq ``after``, about ``most`` records of them."""
    return _request(channels.where[rank], channels.token, JOURNAL_SECONDS, f" records {after} {most}")


def tell_driver(channels: StackChannels, kernel: Mapping[str, object]) -> None:
    """Tell every rank that ``kernel`` drives it now, while a cell keeps its engine busy: its watch
    of the dead kernel (``entry._watch_kernel``) must not end it at the end of the keep time."""
    for rank in sorted(channels.where):
        try:
            _request(channels.where[rank], channels.token, ASK_SECONDS, f" driver {json.dumps(dict(kernel))}")
        except (OSError, ValueError):  # a rank that does not answer cannot be told; the others can
            continue


def pdb_command(channels: StackChannels, rank: int, line: str) -> tuple[str, bool]:
    """Send one command to the pdb ``rank`` is stopped in (``breakpoint()``), on its side channel;
    what pdb wrote until its next prompt, and whether the stop ended (c, q, or the cell ended)."""
    reply = _request(channels.where[rank], channels.token, None, f" pdb\n{line}")
    return str(reply.get("out", "")), bool(reply.get("ended", True))


def _request(where: tuple[str, int], token: str, timeout: float | None, then: str = "") -> Snapshot:
    with socket.create_connection(where, timeout=timeout or ASK_SECONDS) as conn:
        conn.settimeout(timeout)  # None: a pdb command (``n`` over a long step) takes what it takes
        conn.sendall(f"{token}{then}\n".encode())
        chunks = []
        while chunk := conn.recv(1 << 16):
            chunks.append(chunk)
    if not chunks:
        raise ValueError("the rank refused the request")
    reply: Snapshot = json.loads(b"".join(chunks))
    return reply


# -- saying it -------------------------------------------------------------------------------------


def _threads(snap: Snapshot) -> list[dict[str, object]]:
    threads = snap.get("threads")
    return [t for t in threads if isinstance(t, dict)] if isinstance(threads, list) else []


def _frames(thread: Mapping[str, object]) -> list[Frame]:
    frames = thread.get("frames")
    return [f for f in frames if isinstance(f, dict)] if isinstance(frames, list) else []


def _users(frame: Frame) -> bool:
    """Whether the frame runs the user's code: a cell, or a file outside Python and the libraries."""
    path = str(frame["file"])
    return bool(frame.get("cell")) or not (
        _LIBRARY.search(path) or path.startswith((_STDLIB, sys.prefix)) or path.startswith("<")
    )


def from_cell_down(frames: list[Frame]) -> list[Frame]:
    """The frames from the user's outermost one (the cell, or a script's) inward; [] when none."""
    for i, frame in enumerate(frames):
        if _users(frame):
            return frames[i:]
    return []


def _where(frame: Frame, cell: object) -> str:
    if frame.get("cell"):
        return (
            f"cell line {frame['line']}"
            if frame["cell"] == cell
            else f"cell {frame['cell']} line {frame['line']}"
        )
    path = str(frame["file"])
    inside = re.split(r"[/\\](?:site|dist)-packages[/\\]", path)
    short = inside[-1] if len(inside) > 1 else os.path.relpath(path) if path.startswith(os.getcwd()) else path
    return f"{short}:{frame['line']}"


def _lines(frames: list[Frame]) -> list[str]:
    """One line a frame, runs of torch's and dtwork's frames folded into one."""
    cell = frames[0].get("cell") if frames else None
    out: list[str] = []
    folded: list[str] = []
    for frame in [*frames, None]:
        inside = _INSIDE.search(str(frame["file"])) if frame is not None else None
        if inside is not None:
            folded.append(inside.group(1) or inside.group(2))
            continue
        if folded:
            n, names = len(folded), " and ".join(sorted(set(folded), reverse=True))
            out.append(f"[... {n} frame{'s' * (n > 1)} inside {names}]")
            folded = []
        if frame is not None:
            code = f": {frame['code']}" if frame.get("code") else ""
            fn = f" in {frame['function']}" if frame["function"] != "<module>" else ""
            out.append(f"{_where(frame, cell)}{fn}{code}")
    return out


def _doing(snap: Snapshot | str) -> tuple[str, tuple[str, ...]]:
    """What a rank's main thread does (its summary), and the lines that show it."""
    if isinstance(snap, str):
        return f"no answer ({snap})", ()
    main = next((t for t in _threads(snap) if t.get("main")), None)
    mine = from_cell_down(_frames(main)) if main is not None else []
    if not mine:
        return ("in a cell, outside the user's code" if snap.get("in_cell") else "idle (no cell running)"), ()
    users = [f for f in mine if _users(f)]
    cell = mine[0].get("cell")
    at = _where(next((f for f in reversed(users) if f.get("cell") == cell), users[-1]), cell)
    if users[-1] is not users[0] and users[-1].get("cell") != cell:
        at += f" > {_where(users[-1], cell)}"
    what = main.get("collective") if main is not None else None
    if isinstance(what, dict):
        tensor = f" {what['tensor']}" if what.get("tensor") else ""
        at = f"{what['op']}{tensor} at {at}"
        if what.get("seq") is not None:  # ranks at different numbers are in different collectives
            at += f", collective #{what['seq']}" + (f" of group {what['group']}" if what.get("group") else "")
    return at, tuple(_lines(mine))


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {','.join(map(str, ranks))}"


@dataclass
class RankStacks:
    """Every rank's stacks as its stack thread sent them (or why it did not), grouped for reading."""

    by_rank: dict[int, Snapshot | str]

    def groups(self) -> list[tuple[list[int], str, tuple[str, ...]]]:
        """(ranks, summary, lines) of each distinct main-thread stack, in the order of its first rank."""
        out: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for rank in sorted(self.by_rank):
            out.setdefault(_doing(self.by_rank[rank]), []).append(rank)
        return [(ranks, summary, lines) for (summary, lines), ranks in out.items()]

    def waiting(self) -> list[int]:
        """The ranks whose main thread is inside a collective."""
        out = []
        for rank, snap in sorted(self.by_rank.items()):
            if not isinstance(snap, str) and any(
                t.get("main") and t.get("collective") for t in _threads(snap)
            ):
                out.append(rank)
        return out

    def summary(self) -> str:
        """One line: "ranks 0,2,3: all_reduce float32[4] at cell line 7; rank 1: cell line 12"."""
        return "; ".join(f"{_ranks(ranks)}: {what}" for ranks, what, _ in self.groups())

    def text(self, all_threads: bool = False) -> str:
        """Each group's main-thread stack from the cell down, then the user's other threads
        (``all_threads``: every thread, the libraries' included)."""
        out = [
            f"dtwork: stacks of {_ranks(sorted(self.by_rank))} (main thread from the cell down, innermost last)"
        ]
        for ranks, what, lines in self.groups():
            out.append(f"{_ranks(ranks)}: {what}")
            out.extend(f"    {line}" for line in lines)
        hidden = 0
        for rank in sorted(self.by_rank):
            snap = self.by_rank[rank]
            if isinstance(snap, str):
                continue
            for thread in _threads(snap):
                if thread.get("main"):
                    continue
                frames = _frames(thread) if all_threads else from_cell_down(_frames(thread))
                if not frames:
                    hidden += 1
                    continue
                out.append(f"rank {rank}, thread {thread.get('name')!r}:")
                out.extend(f"    {line}" for line in _lines(frames))
        if hidden:
            out.append(
                f"({hidden} threads of ipykernel, ipyparallel and dtwork not shown: stacks(all_threads=True))"
            )
        return "\n".join(out)

    def __str__(self) -> str:
        return self.text()
