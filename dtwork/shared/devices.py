"""Which GPUs a rank may use and which backend the group gets: pure rules over NVML facts and the environment.

The facts are the dicts of ``telemetry.cuda_devices()`` (NVML order, which is PCI bus order;
a MIG-enabled GPU is replaced by its MIG instances). The rules follow CUDA's own:

- ``CUDA_VISIBLE_DEVICES`` entries are integers (NVML/PCI order, since the engines run with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), ``GPU-<uuid>`` or ``MIG-<uuid>`` (prefixes allowed);
  the list stops at the first entry that names no device, as CUDA's does.
- Slurm's ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS`` hold physical indices; integer
  ``CUDA_VISIBLE_DEVICES`` under device constraint (cgroups) count within them.
- A rank is pinned by UUID, so the order in which CUDA would number the devices never matters.

Kernel and engines both call this module; it imports neither torch nor ipyparallel.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from dtwork.errors import DtworkError

Device = dict[str, Any]  # GPUInfo.to_dict(): index, name, uuid, memory_total_mb, driver, mig


def parse_indices(text: str) -> list[int] | None:
    """Parse Slurm's GPU index list (``"0,2-3"``); None when it is not one."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _match(token: str, devices: Sequence[Device], chosen: Sequence[Device]) -> Device | None:
    """The device a CUDA_VISIBLE_DEVICES entry names (None: CUDA stops the list here)."""
    free = [d for d in devices if all(d["uuid"] != c["uuid"] for c in chosen)]
    if token.isdigit():
        # A MIG-enabled GPU named by index gives its first instance, as in CUDA.
        return next((d for d in free if d["index"] == int(token)), None)
    if token.upper().startswith(("GPU-", "MIG-")) and len(token) > 4:
        hits = [d for d in free if d["uuid"].lower().startswith(token.lower())]
        return hits[0] if len(hits) == 1 else None
    return None


def visible(devices: Sequence[Device], env: Mapping[str, str] | None = None) -> list[Device]:
    """The devices a process with environment ``env`` may use, in its order (default: this process)."""
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    slurm_text = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
    slurm = parse_indices(slurm_text) if slurm_text else None
    if cvd is None:
        if slurm is None:
            return list(devices)
        tokens = [str(i) for i in slurm]
    else:
        tokens = [t.strip() for t in cvd.split(",")] if cvd.strip() else []
        ints = [int(t) for t in tokens if t.isdigit()]
        if (
            slurm
            and len(ints) == len(tokens)
            and set(ints) != set(slurm)
            and all(i < len(slurm) for i in ints)
        ):
            tokens = [str(slurm[i]) for i in ints]  # numbered within the job's devices (cgroup constraint)
    out: list[Device] = []
    for token in tokens:
        found = _match(token, devices, out)
        if found is None:
            break
        out.append(found)
    return out


def slurm_local_id(env: Mapping[str, str] | None = None) -> int | None:
    """This task's local id under Slurm (``SLURM_LOCALID``), if any."""
    value = (os.environ if env is None else env).get("SLURM_LOCALID", "")
    return int(value) if value.isdigit() else None


def _key(d: Device) -> str:
    return str(d.get("uuid") or d["index"])


def pin(host: str, lists: Sequence[Sequence[Device]], local_ids: Sequence[int | None]) -> list[Device]:
    """One device per engine of ``host``, each from its own list (engines in local-rank order).

    An engine whose scheduler gave it a local id prefers that entry of its list (the binding
    Slurm chose); otherwise it takes the first device no earlier engine took. Engines bound to
    one GPU each (per-task binding) and engines sharing one list both come out one per GPU.
    """
    taken: set[str] = set()
    out: list[Device] = []
    for k, (devs, local) in enumerate(zip(lists, local_ids, strict=True)):
        order = list(devs)
        if local is not None and len(order) > 1 and local < len(order):
            order.insert(0, order[local])
        pick = next((d for d in order if _key(d) not in taken), None)
        if pick is None:
            usable = len({_key(d) for ds in lists for d in ds})
            raise DtworkError(
                f"host {host} runs {len(lists)} engines but they can use {usable} GPU(s) between them "
                f"(engine {k} has none left): start at most {usable} engine(s) there, or use --backend gloo"
            )
        taken.add(_key(pick))
        out.append(pick)
    return out


def choose_backend(requested: str, probes: Mapping[int, Mapping[str, Any]]) -> tuple[str, str | None]:
    """The backend for the group and a note for the user (None: nothing to say).

    NCCL needs a GPU and a CUDA build of torch on every engine; ``auto`` falls back to gloo
    with a note when NVML sees GPUs that torch cannot use, ``nccl`` fails with what to do.
    """
    if requested == "gloo":
        return "gloo", None
    no_gpu = sorted({p["hostname"] for p in probes.values() if not p.get("gpus")})
    no_cuda = sorted(
        {
            f"{p['hostname']} (torch {p.get('torch')})"
            for p in probes.values()
            if p.get("gpus") and not p.get("torch_cuda")
        }
    )
    if requested == "nccl":
        if no_gpu:
            raise DtworkError(
                f"--backend nccl needs a GPU on every engine, and NVML sees none for the engines on {', '.join(no_gpu)}: "
                "use --backend gloo (CPU)"
            )
        if no_cuda:
            raise DtworkError(
                f"--backend nccl needs a CUDA build of torch, and torch has no CUDA on {', '.join(no_cuda)}: "
                "install a CUDA build of torch there (see README), or use --backend gloo (CPU)"
            )
        return "nccl", None
    if no_gpu:
        return "gloo", None
    if no_cuda:
        return "gloo", (
            f"NVML sees GPUs but torch has no CUDA on {', '.join(no_cuda)}: training on CPU with gloo; "
            "install a CUDA build of torch to train on the GPUs"
        )
    return "nccl", None


def rank_environment(uuid: str | None) -> dict[str, str]:
    """The variables a rank sets before CUDA starts: its one device, PCI numbering, NCCL error handling."""
    env = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        # NCCL's watchdog aborts the communicators and ends a rank whose collective failed or timed out.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    if uuid is not None:
        env["CUDA_VISIBLE_DEVICES"] = uuid
    return env


def host_addresses() -> dict[str, list[str]]:
    """This host's IPv4 addresses by network interface name (an interface without one: empty list)."""
    import psutil

    return {
        name: [str(a.address) for a in addrs if a.family == socket.AF_INET]
        for name, addrs in psutil.net_if_addrs().items()
    }
