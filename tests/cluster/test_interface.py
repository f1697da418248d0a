"""``--interface IF``: the controller, the rendezvous store and the collectives listen on that
interface's address only; an unknown name fails before anything starts, naming the interfaces."""

from __future__ import annotations

from typing import Any

import psutil
import pytest

import dtwork
from dtwork.launch import registry


def _listening(cluster: Any) -> list[tuple[str, str, int]]:
    """``(process, ip, port)`` of every listening TCP socket of the cluster's processes."""
    entry = registry.read(registry.entry_path(cluster.cluster_id))
    assert entry is not None, f"{cluster.cluster_id} is not registered"
    out = []
    for record in entry["processes"]:
        proc = psutil.Process(record["pid"])
        for p in [proc, *proc.children(recursive=True)]:
            try:
                conns = p.net_connections(kind="inet")
                name = " ".join(p.cmdline()[:3])
            except psutil.NoSuchProcess:
                continue
            out += [
                (f"{p.pid} {name}", c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN
            ]
    return out


@pytest.fixture(scope="module")
def on_lo() -> Any:
    c = dtwork.start(n=2, backend="gloo", interface="lo", timeout=60)
    c.session.live = False
    yield c
    c.stop()


def test_everything_listens_on_the_named_interface_only(on_lo: Any) -> None:
    assert on_lo.master_addr == "127.0.0.1"
    listening = _listening(on_lo)
    ports = {port for _, _, port in listening}
    assert on_lo.master_port in ports, "the rendezvous store is not among the listening sockets"
    assert len(ports) > 1, "found only the store: the controller's sockets must be there too"
    exposed = [f"{who} on {ip}:{port}" for who, ip, port in listening if ip != "127.0.0.1"]
    assert not exposed, "listening beyond the interface: " + "; ".join(exposed)


def test_the_collectives_use_the_named_interface(on_lo: Any) -> None:
    names = ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"]
    on_lo.run(f"import os\nifnames = [os.environ.get(n) for n in {names!r}]", quiet=True)
    assert on_lo.pull("ifnames") == [["lo", "lo"]] * 2
    on_lo.run("import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)", quiet=True)
    assert on_lo.pull("t")[0].item() == 2.0
