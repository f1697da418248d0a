"""Security properties of a running cluster and of the /dtwork/ server routes.

- every socket the controller and the engines listen on is bound to loopback when no
  interface is named;
- ipyparallel's message signing is on (HMAC key in the session and the connection file,
  which only its owner may read);
- the REST routes never echo the server's environment and refuse path-like or SQL-like ids.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_server_fixtures import server_fixtures
from tornado.httpclient import HTTPClientError

from dtwork.launch import registry
from dtwork.launch.rendezvous import LOOPBACK
from dtwork.store.runs import RunStore

# -- the cluster's processes and sockets ----------------------------------------------------


def _processes(cluster: Any) -> dict[int, psutil.Process]:
    """The controller and engine processes the registry names, and all their children."""
    entry = registry.read(registry.entry_path(cluster.cluster_id))
    assert entry is not None, f"{cluster.cluster_id} is not registered"
    procs: dict[int, psutil.Process] = {}
    for record in entry["processes"]:
        proc = psutil.Process(record["pid"])
        for p in [proc, *proc.children(recursive=True)]:
            procs[p.pid] = p
    return procs


def _listening(cluster: Any) -> list[tuple[int, str, int]]:
    """``(pid, ip, port)`` of every listening TCP socket of the cluster's processes."""
    out = []
    for pid, proc in _processes(cluster).items():
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def test_cluster_listens_on_loopback_only(cluster: Any) -> None:
    assert cluster.interface is None and cluster.master_addr == LOOPBACK
    procs = _processes(cluster)
    engine_pids = {r["pid"] for r in cluster.rank_info}
    assert engine_pids <= set(procs), "the engines are not in the registry entry"
    listening = _listening(cluster)
    # The torch.distributed store on rank 0 is the subject of the next test.
    others = [s for s in listening if s[2] != cluster.master_port]
    assert others, "found no listening socket at all: the check would prove nothing"
    exposed = [
        f"pid {pid} ({' '.join(procs[pid].cmdline()[:3])}) on {ip}:{port}"
        for pid, ip, port in others
        if ip != LOOPBACK
    ]
    assert not exposed, "listening beyond loopback: " + "; ".join(exposed)


def test_rendezvous_store_listens_on_loopback_only(cluster: Any) -> None:
    store = [(pid, ip) for pid, ip, port in _listening(cluster) if port == cluster.master_port]
    assert store, f"nothing listens on the master port {cluster.master_port}"
    assert all(ip == LOOPBACK for _, ip in store), f"rendezvous store listens on {store}"


def test_message_signing_is_on(cluster: Any) -> None:
    session = cluster.client.session
    assert isinstance(session.key, bytes) and len(session.key) >= 16
    assert session.signature_scheme.startswith("hmac-")
    entry = registry.read(registry.entry_path(cluster.cluster_id))
    assert entry is not None and entry["files"], "the ipyparallel cluster file is not registered"
    security = Path(entry["files"][0]).parent
    for side in ("client", "engine"):
        path = security / f"ipcontroller-{cluster.cluster_id}-{side}.json"
        info = json.loads(path.read_text())
        assert info["key"] and info["key"].encode() == session.key, f"{path.name} has another key"
        assert info["signature_scheme"] == session.signature_scheme
        assert info["interface"] == f"tcp://{LOOPBACK}"
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path.name} is readable by others"
    # The cluster file (readable by others) describes processes, never the key.
    assert session.key.decode() not in Path(entry["files"][0]).read_text()


# -- the /dtwork/ routes --------------------------------------------------------------------

# pytest-jupyter's fixtures; its two autouse ones made plain, so that only the server tests use them.
globals().update(server_fixtures(autouse=False))

SECRET = "s3cr3t-7f1c2a9e-do-not-leak"


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"dtwork": True}}}


@pytest.mark.usefixtures("jp_server_cleanup")
def test_routes_leak_no_environment_and_refuse_odd_ids(
    cluster: Any,
    jp_fetch: Any,
    jp_asyncio_loop: Any,
    http_server_client: Any,
    jp_base_url: str,
    jp_auth_header: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_SECRET_TOKEN", SECRET)
    store = tmp_path / "runs.sqlite"
    monkeypatch.setenv("DTWORK_STORE", str(store))
    with RunStore(store) as s:
        rid = s.create_run(name="secure", world_size=2, backend="gloo", cluster_id=cluster.cluster_id)
        s.add_metrics(rid, [{"step": 0, "name": "loss", "value": 1.0}])

    def run(coro: Coroutine[Any, Any, Any]) -> Any:
        return jp_asyncio_loop.run_until_complete(coro)

    clusters = run(jp_fetch("dtwork", "clusters")).body.decode()
    runs = run(jp_fetch("dtwork", "runs")).body.decode()
    assert cluster.cluster_id in clusters and '"secure"' in runs  # real content, not empty lists
    for body in (clusters, runs):
        assert SECRET not in body and "MY_SECRET_TOKEN" not in body

    for run_id in ("..%2F..%2Fetc%2Fpasswd", "../../etc/passwd", "1%3BDROP", "1;DROP"):
        for suffix in ("", "/metrics?name=loss"):
            response = run(
                http_server_client.fetch(
                    f"{jp_base_url}dtwork/runs/{run_id}{suffix}", headers=jp_auth_header, raise_error=False
                )
            )
            assert response.code == 404, f"runs/{run_id}{suffix} answered {response.code}"
            body = response.body.decode()
            assert json.loads(body)["error"] and "root:" not in body and SECRET not in body
    with pytest.raises(HTTPClientError) as info:  # jp_fetch escapes the id: still a 404
        run(jp_fetch("dtwork", "runs", "1;DROP"))
    assert info.value.code == 404


# -- files that hold cell sources, environment values and engine output ---------------------------


def test_the_store_and_the_engine_log_are_owner_only(cluster: Any) -> None:
    cluster.configure(None)
    cluster.run("ctx.log(step=0, loss=1.0)", quiet=True)
    store = cluster.session.store.path
    for path in (store, Path(f"{store}-wal"), Path(f"{store}-shm"), cluster.session.engine_log):
        assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(cluster.session.engine_log.parent.stat().st_mode) == 0o700
