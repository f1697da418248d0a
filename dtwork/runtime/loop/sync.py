"""The steps loop's sync: what every step leaves for the other ranks, in one all-reduce.

Each step leaves a ``StepHead`` (named fields, summed over ranks) and the means of the names
it logged. Steps are not sent one by one: ``StepSync`` keeps them and sends all kept steps in
ONE float64 vector ``[seconds per step, head of every step, logs of every step]`` (each step's
logs in ``MAX_LOGGED`` slots: the length never depends on what a rank logged), launched
asynchronously every ``sync_every`` steps and read one step later, so the exchange overlaps
compute. ``sync_every`` follows the ranks' mean step time (the same on every rank, since it
comes from the reduced vector): every step when steps are slower than ``timing.SYNC_SECONDS``, fewer
all-reduces for fast steps, whose latency would otherwise cost a large share of each step.
Steps slower than ``timing.WAIT_SYNC_SECONDS`` read it at once instead (``waits_now``), so that a
stop asked during a slow step is honoured at that step's end rather than a whole step later.

On a GPU nothing here waits for the device: the vector goes up from pinned memory and comes back
into pinned memory behind an event, and it is always read a step later (a slow step's stop is then
honoured one step late). A plain copy between host and device synchronises the stream, and the GPU
would sit idle at every sync while the CPU queued the next step.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from dtwork.errors import DtworkError
from dtwork.runtime.core import group
from dtwork.shared.timing import WAIT_SYNC_SECONDS, steps_per_sync

MAX_LOGGED = 32

Logged = dict[str, Any]  # a step's logged means by name: floats, or 0-d tensors on the device


@dataclass
class StepHead:
    """What one step tells the other ranks; each field is summed over ranks by the all-reduce.

    A new field is one line here: ``pack``/``unpack`` and the vector's layout follow it.
    """

    stop: float = 0.0  # ranks asking for a consistent stop
    gns_small: float | torch.Tensor = 0.0  # local |G_small|^2 (unscaled; a tensor on the device)
    gns_measured: float = 0.0  # ranks that measured the noise scale at this step
    gns_big_share: float | torch.Tensor = 0.0  # this rank's share of |G_big|^2 (the same)
    logged: float = 0.0  # names logged at this step (every rank must log the same ones)
    names: float = 0.0  # a hash of the names logged at this step (``names_key``)
    names_sq: float = 0.0  # its square: the ranks agree when world_size * sum(sq) == sum(key) ** 2

    SIZE: ClassVar[int]

    def pack(self) -> tuple[float | torch.Tensor, ...]:
        # not dataclasses.astuple: it deep-copies every field, a tensor on the device included
        return tuple(getattr(self, name) for name in _HEAD_FIELDS)

    @classmethod
    def unpack(cls, values: list[float]) -> StepHead:
        return cls(*values)


_HEAD_FIELDS = tuple(f.name for f in fields(StepHead))
StepHead.SIZE = len(_HEAD_FIELDS)


@dataclass
class SyncedStep:
    """One step's reduced values, the same on every rank."""

    step: int
    head: StepHead
    logs: list[float]  # the means over ranks, in the order of ``local``
    local: Logged  # this rank's own means


class StepSync:
    """Keep what each step leaves, send it in one asynchronous all-reduce, read it back."""

    def __init__(self, device: torch.device, world_size: int, agree_names: bool = True) -> None:
        self.device = device
        self.world_size = world_size
        self.agree_names = agree_names  # averaged logs need the same names on every rank
        self.sync_every = 1  # steps per all-reduce; the same on every rank
        self.step_seconds: float | None = (
            None  # the ranks' mean step time, once reduced (the same everywhere)
        )
        self._logs: dict[str, list[torch.Tensor | float]] = {}
        self._unsynced: list[tuple[int, StepHead, Logged]] = []  # steps not yet sent
        self._pending: tuple[Any, torch.Tensor, list[tuple[int, StepHead, Logged]]] | None = None
        self._arrived: torch.cuda.Event | None = None  # on a GPU: the pending vector is in host memory
        self.on_gpu = device.type == "cuda"
        self._last_sync = 0.0

    def add_log(self, scalars: dict[str, Any]) -> None:
        """Keep the step's values at the least cost per call (it runs every step).

        A number is kept as a float; a tensor on the CPU is read at once (there is no device to
        wait for); a tensor on an accelerator is detached and kept, and the sync reads all of
        them in one operation (reading it here would wait for the device).
        """
        logs = self._logs
        for name, value in scalars.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise DtworkError(
                        f"{_call(name)} takes a number or a one-element tensor, got a tensor of shape "
                        f"{tuple(value.shape)}: log a reduction of it (.mean(), .sum())"
                    )
                value = value.item() if value.is_cpu else value.detach()
            else:
                try:
                    value = float(value)
                except (TypeError, ValueError, OverflowError):
                    raise DtworkError(not_a_number(name, value)) from None
            kept = logs.get(name)
            if kept is None:
                logs[name] = [value]
            else:
                kept.append(value)

    def record(self, step: int, head: StepHead) -> None:
        """Keep ``step``'s head and the means of what it logged for the next all-reduce."""
        names = sorted(self._logs)[:MAX_LOGGED]
        local = {n: _mean(self._logs[n], self.device) for n in names}
        self._logs = {}
        head.logged = float(len(local))
        head.names = names_key(tuple(local))
        head.names_sq = head.names * head.names
        self._unsynced.append((step, head, local))

    def due(self) -> bool:
        return len(self._unsynced) >= self.sync_every

    @property
    def waits_now(self) -> bool:
        """Whether a launched sync is read at once rather than a step later: for slow steps (and
        before the step time is known) the all-reduce's latency is noise, and a stop asked during
        a step is then honoured at its end on every rank (the decision rests on reduced values)."""
        if self.on_gpu:  # reading at once would idle the GPU while the CPU queues the next step
            return False
        return self.step_seconds is None or self.step_seconds >= WAIT_SYNC_SECONDS

    @property
    def unsent(self) -> bool:
        return bool(self._unsynced)

    def launch(self) -> None:
        """All-reduce the kept steps in one vector; read it with ``drain`` a step later.

        Every rank calls it at the same steps. Two tensors are built whatever the number of steps.
        """
        now = time.perf_counter()
        entries, self._unsynced = self._unsynced, []
        per_step = (now - self._last_sync) / len(entries) if self._last_sync else 0.0
        self._last_sync = now
        heads = [v for _, head, _ in entries for v in head.pack()]
        logs = [v for _, _, local in entries for v in _padded(local)]  # the same length on every rank
        values = [per_step, *heads, *logs]
        if not any(isinstance(v, torch.Tensor) for v in values):  # one operation in the usual case
            vec = self._numbers(values)
        else:  # device tensors (GNS norms, logged values) are read with the all-reduce's result
            vec = self._logs_tensor(values)
        if (
            self.world_size > 1
        ):  # divided before the sum: a mean of values near the largest float stays finite
            vec[1 + len(heads) :] /= self.world_size
        work = dist.all_reduce(vec, async_op=True) if self.world_size > 1 else None
        if self.on_gpu:  # back to host memory behind an event: drain waits for this step only
            if work is not None:
                work.wait()  # the stream waits for the all-reduce; the CPU goes on
            host = torch.empty(vec.shape, dtype=vec.dtype, pin_memory=True)
            host.copy_(vec, non_blocking=True)
            self._arrived = torch.cuda.Event()
            self._arrived.record()
            work, vec = None, host
        self._pending = (work, vec, entries)

    def _numbers(self, values: list[Any], dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Numbers as a vector on the device; on a GPU from pinned memory, so that the copy does not
        wait for the work queued before it."""
        host = torch.tensor(values, dtype=dtype)
        if not self.on_gpu:
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    def _logs_tensor(self, logs: list[Any]) -> torch.Tensor:
        """The logs in the entries' order whatever their types (the layout is the same on every
        rank): numbers and tensors are converted in one operation each."""
        tensor_at = [i for i, v in enumerate(logs) if isinstance(v, torch.Tensor)]
        stacked = _stack_scalars([logs[i] for i in tensor_at], self.device)
        if len(tensor_at) == len(logs):
            return stacked
        part = self._numbers([0.0 if isinstance(v, torch.Tensor) else v for v in logs])
        part[self._numbers(tensor_at, torch.long)] = stacked
        return part

    def drain(self) -> list[SyncedStep]:
        """Wait for the all-reduce in flight (if any); return its steps' reduced values."""
        if self._pending is None:
            return []
        work, vec, entries = self._pending
        self._pending = None
        if self._arrived is not None:
            self._arrived.synchronize()  # the step that launched it, not the ones queued since
            self._arrived = None
        if work is not None:
            try:
                work.wait()
            except RuntimeError as exc:
                peer = group.peer_failure(exc)
                if peer is None:
                    raise
                raise peer from None
        values = vec.tolist()
        if values[0] > 0:  # the ranks' summed seconds per step: how many steps the next sync waits for
            self.step_seconds = values[0] / self.world_size
            self.sync_every = steps_per_sync(self.step_seconds)
        size = StepHead.SIZE
        at = 1 + size * len(entries)  # where the logs start
        out = []
        for i, (step, _, local) in enumerate(entries):
            head = StepHead.unpack(values[1 + size * i : 1 + size * (i + 1)])
            if self.agree_names and self.world_size > 1:
                check_names(head, step, list(local), self.world_size)
            out.append(SyncedStep(step, head, values[at : at + len(local)], local))
            at += MAX_LOGGED
        return out

    def take_unsent(self) -> list[tuple[int, Logged]]:
        """The kept steps' own logs, dropped from the sync (a loop left early on this rank)."""
        entries, self._unsynced = self._unsynced, []
        return [(step, local) for step, _, local in entries]


def _mean(values: list[Any], device: torch.device) -> Any:
    """The mean of one name's values in a step: the value itself when logged once (no tensor
    operation), a float for numbers, else a 0-d float64 tensor."""
    if len(values) == 1:
        return values[0]
    if not any(isinstance(v, torch.Tensor) for v in values):
        return sum(values) / len(values)
    return torch.stack(
        [torch.as_tensor(v, device=device).to(torch.float64).reshape(()) for v in values]
    ).mean()


def _stack_scalars(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One-element tensors (0-d or not, on the rank's device or not) as one 1-d float64 tensor
    on ``device``: one operation when they share a shape and a device, as a loop's logs do."""
    try:
        out = torch.stack(tensors)
    except RuntimeError:  # shapes (), (1,) ... or devices mixed
        out = torch.stack([t.reshape(()).to(device) for t in tensors])
    return out.reshape(-1).to(device=device, dtype=torch.float64)


_KEYS: dict[tuple[str, ...], float] = {}


def names_key(names: tuple[str, ...]) -> float:
    """A 20-bit hash of the (sorted) names: summed and squared over up to 8192 ranks, it stays an
    exact integer in float64, so the agreement test is exact."""
    key = _KEYS.get(names)
    if key is None:
        try:
            data = "\0".join(names).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no store, JSON or HTML could hold the name
            bad = next(n for n in names if not n.isascii() and not _encodable(n))
            raise DtworkError(
                f"ctx.log: the name {bad!r} is not valid text (a lone surrogate): use another name"
            ) from None
        key = float(int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "big") >> 12)
        if len(_KEYS) > 1024:  # names made per step (f"loss_{i}") must not grow it without bound
            _KEYS.clear()
        _KEYS[names] = key
    return key


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _call(name: str) -> str:
    """``ctx.log(name=...)`` as the user wrote it, on one line whatever the name holds."""
    return f"ctx.log({name}=...)" if name.isidentifier() else f"ctx.log(**{{{name!r}: ...}})"


def not_a_number(name: str, value: object) -> str:
    """The line that refuses ``ctx.log(name=value)`` for a value that is not a real number."""
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return (
        f"{_call(name)} takes a real number or a one-element tensor, got {type(value).__name__} "
        f"{shown}: log float(x), or a reduction of a tensor (.mean(), .sum())"
    )


_ZEROS = (0.0,) * MAX_LOGGED


def _padded(local: Logged) -> list[Any]:
    """A step's logged means in ``MAX_LOGGED`` slots, so that ranks that log different names still
    send vectors of one length (a length mismatch would hang the all-reduce)."""
    values = list(local.values())
    return values + list(_ZEROS[len(values) :])


def check_names(head: StepHead, step: int, names: list[str], world_size: int) -> None:
    """Fail on every rank, naming each rank's names, when the ranks logged different names at
    ``step`` (``head`` is the reduced one: the same decision on every rank)."""
    if world_size * head.names_sq == head.names * head.names:
        return
    per_rank: list[Any] = [None] * world_size
    dist.all_gather_object(per_rank, names)
    said = "; ".join(f"rank {r}: {', '.join(n) if n else '(none)'}" for r, n in enumerate(per_rank))
    raise DtworkError(
        f"ctx.log names differ across ranks at step {step} ({said}): log the same names on every rank "
        "(log float('nan') for a value a rank does not have), or set "
        "optimizations.average_training_metrics: false to keep rank 0's"
    )
