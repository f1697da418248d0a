"""Rendezvous planning: from what each engine reports, decide ranks, GPUs and the master address.

Pure functions over the engines' probe results (no ipyparallel, no torch), so that the
multi-host rules are testable without hosts: ranks in a stable order (hosts in order of
their first engine, engines by id within a host), ``local_rank`` counting engines per host,
one GPU per rank, and a network interface every host shares.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from dtwork.errors import DtworkError
from dtwork.shared import devices

BACKENDS = ("auto", "nccl", "gloo")
LOOPBACK = "127.0.0.1"
MAX_CPU_RANKS_MIN = 8  # CPU ranks allowed on any machine; more need 4x as many cores
MAX_TIMEOUT = 365 * 24 * 3600.0  # collective timeout bound (s): finite, fits every clock


@dataclass(frozen=True)
class RankPlan:
    """Where one rank lives and what it gets."""

    rank: int
    engine_id: int
    hostname: str
    local_rank: int
    gpu: int | None
    pid: int
    gpu_uuid: str | None = None  # the device the rank is pinned to (a GPU or a MIG instance)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validate_request(
    n: int | None, backend: str, gpus: int | None, *, timeout: float, global_batch_size: int | None
) -> tuple[int, str]:
    """Check a start request before anything starts; return (n, backend).

    ``gpus`` is the number of GPUs NVML sees on this host, or None when the engines run on
    other hosts (a profile's launcher): their GPUs are checked once the engines report.
    """
    if backend not in BACKENDS:
        raise DtworkError(f"unknown backend {backend!r}: use one of auto, nccl, gloo")
    if gpus is None:
        return _validate_remote(n, backend, timeout, global_batch_size)
    if backend == "nccl" and gpus == 0:
        raise DtworkError(
            "--backend nccl needs GPUs, and NVML sees none on this machine: use --backend gloo (CPU)"
        )
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise DtworkError(f"the number of ranks must be a whole number >= 1, got {n!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (0 < timeout <= MAX_TIMEOUT):
        # NaN, inf and huge values would only fail on the engines (timedelta overflow), after they start.
        raise DtworkError(
            f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT:.0f} (a year), got {timeout!r}"
        )
    use_gpus = backend == "nccl" or (backend == "auto" and gpus > 0)
    if n is None:
        n = gpus if use_gpus else 2
    if use_gpus and n > gpus:
        raise DtworkError(
            f"asked for {n} ranks but this machine has {gpus} GPU{'s' if gpus != 1 else ''} (one rank per GPU): "
            f"use -n {gpus} or fewer, or --backend gloo for CPU ranks"
        )
    cores = os.cpu_count() or 1
    if not use_gpus and n > max(MAX_CPU_RANKS_MIN, 4 * cores):
        raise DtworkError(
            f"asked for {n} CPU ranks on a machine with {cores} cores: use at most {max(MAX_CPU_RANKS_MIN, 4 * cores)} "
            f"here, or --launcher slurm|mpi|ssh to start engines on other hosts"
        )
    _check_batch(global_batch_size, n)
    return n, ("nccl" if use_gpus else "gloo")


def _validate_remote(
    n: int | None, backend: str, timeout: float, global_batch_size: int | None
) -> tuple[int, str]:
    if n is None:
        raise DtworkError(
            "with --launcher or --profile, say how many ranks to start: -n N (one per GPU on the hosts)"
        )
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DtworkError(f"the number of ranks must be a whole number >= 1, got {n!r}")
    _check_batch(global_batch_size, n)
    return n, backend


def _check_batch(global_batch_size: int | None, n: int) -> None:
    if global_batch_size is not None:
        if (
            not isinstance(global_batch_size, int)
            or isinstance(global_batch_size, bool)
            or global_batch_size < 1
        ):
            raise DtworkError(f"--global-batch-size must be a whole number >= 1, got {global_batch_size!r}")
        if global_batch_size < n:
            raise DtworkError(
                f"global batch size {global_batch_size} is smaller than the {n} slots: "
                f"each slot needs at least one example; use --global-batch-size {n} or more"
            )


def assign_ranks(
    probes: dict[int, dict[str, Any]], use_gpus: bool, first_host: str | None = None
) -> list[RankPlan]:
    """Order engines into ranks: the kernel's host first (when it runs engines), then hosts by
    their first engine id; engines by id within a host. Registration order between hosts is a
    race, so it never decides which host holds rank 0.
    """
    host_order: list[str] = (
        [first_host]
        if first_host is not None and any(p["hostname"] == first_host for p in probes.values())
        else []
    )
    for eid in sorted(probes):
        host = probes[eid]["hostname"]
        if host not in host_order:
            host_order.append(host)
    plans: list[RankPlan] = []
    for host in host_order:
        eids = sorted(e for e in probes if probes[e]["hostname"] == host)
        lists = [probes[e].get("gpus", []) for e in eids]  # each engine's own: NVML order, or the scheduler's
        pinned = devices.pin(host, lists, [probes[e].get("slurm_localid") for e in eids]) if use_gpus else []
        for local_rank, eid in enumerate(eids):
            dev = pinned[local_rank] if use_gpus else None
            gpu, uuid = (dev["index"], dev.get("uuid")) if dev else (None, None)
            plans.append(RankPlan(len(plans), eid, host, local_rank, gpu, probes[eid]["pid"], uuid))
    if use_gpus and len(host_order) > 1:
        per_host = [
            len(probes[next(e for e in probes if probes[e]["hostname"] == h)].get("gpus", []))
            for h in host_order
        ]
        if len(set(per_host)) == 1 and len(plans) % per_host[0]:
            raise DtworkError(
                f"{len(plans)} slots span {len(host_order)} hosts with {per_host[0]} GPUs each: "
                f"use a multiple of {per_host[0]} slots so that every host is used fully"
            )
    return plans


def _routable(addrs: dict[str, list[str]]) -> dict[str, str]:
    return {name: ips[0] for name, ips in addrs.items() if ips and not ips[0].startswith("127.")}


def choose_interface(probes: dict[int, dict[str, Any]], interface: str | None) -> str | None:
    """Return the network interface for the process group (None: loopback on one host).

    A named interface must exist with an IPv4 address on every host; otherwise, across hosts,
    the first interface (by name) that every host has with a routable address is used.
    """
    hosts = {p["hostname"]: p for p in probes.values()}
    if interface:
        missing = sorted(h for h, p in hosts.items() if not p.get("addresses", {}).get(interface))
        if missing:
            have = sorted(n for n, ips in next(iter(hosts.values())).get("addresses", {}).items() if ips)
            raise DtworkError(
                f"network interface {interface!r} not found on host(s) {', '.join(missing)}, or it has no "
                f"IPv4 address there; interfaces with one include: {', '.join(have)}"
            )
        return interface
    if len(hosts) == 1:
        return None
    common: set[str] | None = None
    for p in hosts.values():
        names = set(_routable(p.get("addresses", {})))
        common = names if common is None else common & names
    if not common:
        raise DtworkError(
            "the hosts share no network interface with a routable address: "
            "name one with --interface IFNAME (like Determined's dtrain_network_interface)"
        )
    preferred = sorted(n for n in common if not n.startswith(("docker", "veth", "virbr", "br-")))
    return (preferred or sorted(common))[0]


def master_address(probe: dict[str, Any], interface: str | None) -> str:
    """Return rank 0's address on the chosen interface (loopback when None)."""
    if interface is None:
        return LOOPBACK
    return str(probe["addresses"][interface][0])


def loopback_interface(probe: dict[str, Any]) -> str | None:
    """The interface carrying 127.0.0.1 on a host (so gloo listens on loopback only), if any."""
    for name, ips in probe.get("addresses", {}).items():
        if any(ip.startswith("127.") for ip in ips):
            return str(name)
    return None


def interface_address(interface: str, addresses: dict[str, list[str]] | None = None) -> str:
    """The IPv4 address of ``interface`` (``addresses``: this host's by default), where the controller,
    the rendezvous store and the collectives listen when ``--interface`` names it; an unknown
    name, or one without an IPv4 address, fails at once with the names there are."""
    have = devices.host_addresses() if addresses is None else addresses
    ips = have.get(interface)
    if not ips:
        usable = ", ".join(f"{n} ({a[0]})" for n, a in sorted(have.items()) if a) or "none"
        why = "not found" if interface not in have else "has no IPv4 address"
        raise DtworkError(
            f"network interface {interface!r} {why} on this host; interfaces with IPv4 here: {usable}: "
            "name one of them with --interface"
        )
    return ips[0]
