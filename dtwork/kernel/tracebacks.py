"""Rank errors as the notebook shows them: one line each, and a traceback cut to the user's frames.

IPython's traceback text from a rank is rewritten: ipyparallel's own line dropped, ``%run``'s
frames dropped, runs of torch's and dtwork's frames folded into one line saying how many.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import ipyparallel as ipp


def error_line(err: BaseException) -> str:
    if isinstance(err, ipp.error.RemoteError):
        return f"{err.ename}: {err.evalue}"
    return f"{type(err).__name__}: {err}"


def left_after_peer(err: BaseException) -> bool:
    """Whether a rank raised only because another rank failed (its group was aborted)."""
    line = error_line(err)
    return line.startswith("PeerFailure") or "closed by peer" in line or "reset by peer" in line


def stopped_by_interrupt(err: BaseException) -> bool:
    """Whether a rank raised only because the cell was interrupted (outside ``ctx.steps`` the stop
    signal raises KeyboardInterrupt), or because another rank was."""
    return error_line(err).startswith("KeyboardInterrupt") or left_after_peer(err)


def remote_traceback(err: BaseException) -> str:
    """The rank's whole traceback, without ipyparallel's ``[n:execute]`` line (colours kept)."""
    if not isinstance(err, ipp.error.RemoteError):
        return error_line(err)
    return "\n".join(ln for ln in err.render_traceback() if not re.fullmatch(r"\[\d+:\w+\]", ln))


ANSI = re.compile(r"\x1b\[[0-9;]*m")
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
        plain = ANSI.sub("", line)
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


def short_traceback(text: str) -> tuple[str, bool]:
    """The traceback from the user's first frame on, each frame its running line, and runs of
    torch's (and dtwork's) frames folded into one line that says how many; whether it changed."""
    cuts = [m.start() for m in _CHAINED.finditer(text)]
    if cuts:  # chained exceptions: each traceback on its own, with the line that joins them
        bounds = [0, *cuts, len(text)]
        pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        done = [short_traceback(pieces[0])]
        for piece in pieces[1:]:
            joint, _, rest = piece.partition("\n")
            short, changed = short_traceback(rest)
            done.append((f"{joint}\n{short}", changed))
        return "\n\n".join(p for p, _ in done), any(c for _, c in done)
    parts = _frames(text)
    if parts is None:
        return text, False
    head, frames, tail = parts
    while frames and _PLUMBING.search(ANSI.sub("", "\n".join(frames[0]))):
        frames.pop(0)  # %run's own frames: the traceback starts at the user's code
    lines: list[str] = list(head)
    folded: list[str] = []  # where each frame of the run being folded is: torch or dtwork
    for i, frame in enumerate(frames + [[""]]):
        where = ANSI.sub("", frame[0])
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
            lines.extend(ln for ln in frame[1:] if _ARROW.match(ANSI.sub("", ln)))
    return "\n".join([*lines, *tail]), True


# torch's checked collectives (DETAIL debug level) describe each rank's call in the error they raise
_FINGERPRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), OpType=(\w+), "
    r"TensorShape=(.*?), TensorDtypes=(\w+)"
)
_CELL_LINE = re.compile(r"Cell In\[\d+\], line (\d+)")
_OPS = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "ALLTOALL": "all_to_all"}


def collective_mismatch(errors: Mapping[int, BaseException]) -> tuple[str, list[int]] | None:
    """When the ranks' collectives did not match (``Cluster.check_collectives``): one line naming
    each rank's op, dtype, shape and cell line, and the ranks it names; None otherwise."""
    calls: dict[int, tuple[str, str, str, str]] = {}  # rank -> (sequence number, op, dtype, shape)
    for err in errors.values():
        for m in _FINGERPRINT.finditer(error_line(err)):
            calls.setdefault(int(m[1]), (m[2], _OPS.get(m[3], m[3].lower()), m[5].lower(), m[4]))
    if len(calls) < 2:
        return None
    said = []
    for rank, (_, op, dtype, shape) in sorted(calls.items()):
        cells = _CELL_LINE.findall(ANSI.sub("", remote_traceback(errors[rank]))) if rank in errors else []
        said.append(f"rank {rank} {op} {dtype}{shape}" + (f" at cell line {cells[-1]}" if cells else ""))
    seq = next(iter(calls.values()))[0]
    return f"mismatched collectives (the group's collective #{seq}): {'; '.join(said)}", sorted(calls)
