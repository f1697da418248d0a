"""Every thread's Python stack of this rank, served on a side channel of its own (which also
carries the commands of a pdb stopped at ``breakpoint()``, ``breakpoints.py``).

A thread started when the rank joins listens on a TCP port; the kernel connects, sends the
token it was given, and reads the stacks back as JSON. It answers while the main thread waits
in a collective, because torch releases the GIL there: neither ipyparallel's shell channel (busy
with the cell) nor the rank's cooperation is needed.
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from types import FrameType
from typing import TypedDict

from dtwork.runtime.core import control

_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")
_BACKWARD = os.path.join("torch", "autograd", "graph.py")
READ_SECONDS = 2.0  # how long a connection may take to send its token


class Frame(TypedDict):
    file: str
    line: int
    function: str
    code: str
    cell: str | None  # IPython's name of the cell ("In[3]") when the frame runs a cell's code


class Collective(TypedDict):
    op: str  # torch.distributed's function: all_reduce, barrier, ...
    tensor: str | None  # dtype and shape of its tensor argument, "float32[4]"
    group: str | None  # the process group's name, None for the default group
    seq: int | None  # the group's count of collectives so far, this one included (where torch says)


class Thread(TypedDict):
    name: str
    main: bool
    frames: list[Frame]  # outermost first
    collective: Collective | None


class Snapshot(TypedDict):
    pid: int
    in_cell: bool
    threads: list[Thread]


class _Server:
    """The listening socket and the token a request must carry (a restart of the kernel side
    hands a new one)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.token = b""
        self.pdb: Callable[[str], tuple[str, bool]] | None = None  # a stopped pdb's command (breakpoints.py)
        self.records: Callable[[int, int], dict[str, object]] | None = None  # the journal's ``since``
        self.driver: Callable[[dict[str, object]], None] | None = None  # the kernel that drives this rank now


_server = _Server()


def answer_pdb(ask: Callable[[str], tuple[str, bool]]) -> None:
    """Hand ``TOKEN pdb`` requests' command lines to ``ask``: (what pdb wrote, whether it let go)."""
    _server.pdb = ask


def answer_records(since: Callable[[int, int], dict[str, object]]) -> None:
    """Hand ``TOKEN records AFTER MOST`` requests to ``since`` (the rank's journal of its cell)."""
    _server.records = since


def answer_driver(tell: Callable[[dict[str, object]], None]) -> None:
    """Hand ``TOKEN driver JSON`` requests (a kernel that attached while a cell runs) to ``tell``."""
    _server.driver = tell


def serve(token: str, address: str) -> int:
    """Answer stack requests carrying ``token`` on ``address`` (a thread, started once); the port."""
    _server.token = token.encode()
    if _server.sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((address, 0))
        sock.listen(8)
        _server.sock = sock
        threading.Thread(target=_loop, args=(sock,), name="dtwork-stacks", daemon=True).start()
    return int(_server.sock.getsockname()[1])


def _loop(sock: socket.socket) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        # A pdb command can run for long (``n`` over a training step): on a thread of its own, so
        # that stacks are still answered meanwhile.
        threading.Thread(target=_answer, args=(conn,), name="dtwork-stacks-request", daemon=True).start()


def _answer(conn: socket.socket) -> None:
    """Read the token line, ``TOKEN`` (the stacks), ``TOKEN records AFTER MOST`` (the cell's batches
    past seq AFTER), ``TOKEN driver JSON`` (the kernel's process) or ``TOKEN pdb`` then a pdb command."""
    with conn:
        try:
            conn.settimeout(READ_SECONDS)
            got = b""
            while got.count(b"\n") < (2 if b" pdb\n" in got else 1) and len(got) < 4096:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                got += chunk
            first, _, rest = got.partition(b"\n")
            token, _, verb = first.strip().partition(b" ")
            if not hmac.compare_digest(token, _server.token):
                return
            if verb.startswith(b"records ") and _server.records is not None:
                after, most = map(int, verb.split()[1:3])
                conn.settimeout(None)  # a long cell's records take what they take to send
                conn.sendall(json.dumps(_server.records(after, most), default=str).encode())
                return
            if verb.startswith(b"driver ") and _server.driver is not None:
                _server.driver(json.loads(verb.partition(b" ")[2]))
                conn.sendall(b"{}")
                return
            if verb == b"pdb" and _server.pdb is not None:
                conn.settimeout(None)  # the command takes what it takes; the kernel can interrupt it
                out, ended = _server.pdb(rest.decode(errors="replace").rstrip("\n"))
                conn.sendall(json.dumps({"out": out, "ended": ended}).encode())
            else:
                conn.sendall(json.dumps(snapshot()).encode())
        except OSError:
            pass


def snapshot() -> Snapshot:
    """Every thread's stack but the asking one's, outermost frame first."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads: list[Thread] = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        threads.append(
            {
                "name": names.get(ident, f"thread {ident}"),
                "main": ident == main,
                "frames": _frames(frame),
                "collective": collective(frame),
            }
        )
    return {"pid": os.getpid(), "in_cell": control.in_cell(), "threads": threads}


def cell_name(filename: str) -> str | None:
    """IPython's name of the cell compiled under ``filename`` ("In[3]"), or None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    named = shell.compile.format_code_name(filename) if shell is not None else None
    return named[1] if named else None


def _frames(frame: FrameType) -> list[Frame]:
    return [
        {
            "file": fs.filename,
            "line": fs.lineno or 0,
            "function": fs.name,
            "code": (fs.line or "").strip(),
            "cell": cell_name(fs.filename),
        }
        for fs in traceback.extract_stack(frame)
    ]


def collective(frame: FrameType | None) -> Collective | None:
    """The torch.distributed call a thread is inside (its outermost frame in distributed_c10d),
    with its tensor's dtype and shape; a backward pass stands for DDP's gradient all-reduce."""
    found: Collective | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.endswith(_C10D) and not frame.f_code.co_name.startswith("_"):
            found = {"op": frame.f_code.co_name, "tensor": _tensor(frame), **_group(frame)}
        elif (
            found is None and filename.endswith(_BACKWARD) and frame.f_code.co_name == "_engine_run_backward"
        ):
            found = {
                "op": "backward (DDP's gradient all-reduce, in C++)",
                "tensor": None,
                "group": None,
                "seq": None,
            }
        frame = frame.f_back
    return found


def _tensor(frame: FrameType) -> str | None:
    value = frame.f_locals.get("tensor")
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


class _Group(TypedDict):
    group: str | None
    seq: int | None


def _group(frame: FrameType) -> _Group:
    """The collective's process group (None: the default one) and its sequence number: ranks at
    different numbers of one group are not in the same collective."""
    import torch.distributed as dist

    pg = frame.f_locals.get("group")
    try:
        c10d = dist.distributed_c10d
        default = c10d._get_default_group()
        name = None if pg is None or pg is default else c10d._get_process_group_name(pg)
        seq = int((pg or default)._get_sequence_number_for_group())  # type: ignore[union-attr]
    except Exception:  # torch's private names move between versions: the op and tensor still tell
        return {"group": None, "seq": None}
    return {"group": name, "seq": seq}
