"""GPU facts and telemetry through NVML (nvidia-ml-py).

NVML never initialises CUDA, so the kernel may call it. Every function degrades to
"no GPU" (an empty list) on ``NVMLError`` — including the library being absent — and
NVML is initialised lazily, never at import time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_state: dict[str, bool] = {"tried": False, "ok": False}


@dataclass(frozen=True)
class GPUInfo:
    """Static facts about one GPU."""

    index: int
    name: str
    uuid: str
    memory_total_mb: float
    driver: str
    mig: bool = False  # a MIG instance of GPU ``index`` (its UUID starts with "MIG-")

    def to_dict(self) -> dict[str, Any]:  # Any: JSON for the ranks' reports and the server
        return asdict(self)


@dataclass(frozen=True)
class GPUSample:
    """One telemetry sample of one GPU; fields NVML cannot give are None."""

    index: int
    utilization: float | None
    memory_used_mb: float | None
    memory_total_mb: float | None
    temperature_c: float | None
    power_w: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _init() -> ModuleType | None:
    """Initialise NVML once; return the pynvml module, or None when there is no GPU."""
    with _lock:
        try:
            import pynvml
        except ImportError:
            return None
        if not _state["tried"]:
            _state["tried"] = True
            try:
                pynvml.nvmlInit()
                _state["ok"] = True
            except pynvml.NVMLError:
                _state["ok"] = False
        return pynvml if _state["ok"] else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_count() -> int:
    """Return the number of GPUs NVML sees (0 without NVML or a driver)."""
    nv = _init()
    if nv is None:
        return 0
    try:
        return int(nv.nvmlDeviceGetCount())
    except nv.NVMLError:
        return 0


def gpu_inventory() -> list[GPUInfo]:
    """List the GPUs of this host by NVML index (physical order, ignoring CUDA_VISIBLE_DEVICES)."""
    nv = _init()
    if nv is None:
        return []
    out = []
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out.append(
                GPUInfo(
                    i,
                    _text(nv.nvmlDeviceGetName(h)),
                    _text(nv.nvmlDeviceGetUUID(h)),
                    mem.total / 2**20,
                    driver,
                )
            )
    except nv.NVMLError:
        return out
    return out


def cuda_devices() -> list[GPUInfo]:
    """The devices CUDA can be given, in NVML order: each GPU, or the MIG instances of a MIG-enabled one."""
    nv = _init()
    out: list[GPUInfo] = []
    for gpu in gpu_inventory():
        migs = _mig_instances(nv, gpu) if nv is not None else []
        out.extend(migs or [gpu])
    return out


def _mig_instances(nv: ModuleType, gpu: GPUInfo) -> list[GPUInfo]:
    try:
        h = nv.nvmlDeviceGetHandleByIndex(gpu.index)
        if nv.nvmlDeviceGetMigMode(h)[0] != 1:
            return []
        slots = nv.nvmlDeviceGetMaxMigDeviceCount(h)
    except (nv.NVMLError, AttributeError):  # no MIG support on this GPU or this NVML
        return []
    out = []
    for i in range(slots):
        m = _try(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
        if m is None:
            continue  # an empty slot
        name, uuid, mem = (
            _try(f, m) for f in (nv.nvmlDeviceGetName, nv.nvmlDeviceGetUUID, nv.nvmlDeviceGetMemoryInfo)
        )
        if uuid is not None:
            total = mem.total / 2**20 if mem is not None else 0.0
            out.append(GPUInfo(gpu.index, _text(name), _text(uuid), total, gpu.driver, True))
    return out


def _try(fn: Callable[..., T], *args: object) -> T | None:
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: the field stays None
        return None


def sample(indices: list[int] | None = None) -> list[GPUSample]:
    """Sample utilisation, memory, temperature and power of the given GPUs (all by default)."""
    nv = _init()
    if nv is None:
        return []
    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError:
        return []
    out = []
    for i in indices if indices is not None else range(count):
        h = _try(nv.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            continue
        util = _try(nv.nvmlDeviceGetUtilizationRates, h)
        mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
        temp = _try(nv.nvmlDeviceGetTemperature, h, 0)
        power = _try(nv.nvmlDeviceGetPowerUsage, h)
        out.append(
            GPUSample(
                index=i,
                utilization=float(util.gpu) if util is not None else None,
                memory_used_mb=mem.used / 2**20 if mem is not None else None,
                memory_total_mb=mem.total / 2**20 if mem is not None else None,
                temperature_c=float(temp) if temp is not None else None,
                power_w=power / 1000.0 if power is not None else None,
            )
        )
    return out
