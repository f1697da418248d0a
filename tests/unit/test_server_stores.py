"""The sidebar's routes over every run store under the Jupyter root (a notebook in a subfolder
records in its own ``.dtwork``), and its clusters named by the server's sessions: a real
jupyter_server, real SQLite stores, a real kernel session renamed as JupyterLab renames it."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_server_fixtures import server_fixtures
from tornado.httpclient import HTTPClientError

from dtwork.launch import registry
from dtwork.server import stores
from dtwork.store.runs import RunStore

globals().update(server_fixtures())


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.get_event_loop().run_until_complete(test(*args, **kwargs))

    return run


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"dtwork": True}}}


@pytest.fixture(autouse=True)
def dtwork_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private registry; the server's default store outside the root, as $DTWORK_STORE names it."""
    monkeypatch.setenv("DTWORK_HOME", str(tmp_path / "dtwork-home"))
    store = tmp_path / "store" / "runs.sqlite"
    monkeypatch.setenv("DTWORK_STORE", str(store))
    return store


def make_store(path: Path, name: str, notebook: Path | None = None, runs: int = 1) -> None:
    """A store with ``runs`` completed runs named ``name``, ``name-2``, ... with a short loss curve."""
    with RunStore(path) as s:
        for i in range(runs):
            rid = s.create_run(
                name=name if i == 0 else f"{name}-{i + 1}",
                world_size=2,
                backend="gloo",
                notebook=str(notebook) if notebook else None,
            )
            seq = s.add_cell(rid, "train()")
            s.add_metrics(
                rid, [{"step": k, "name": "loss", "value": 3.0 - k, "cell_seq": seq} for k in range(3)]
            )
            s.set_run_status(rid, "completed", ended=True)


async def get_json(jp_fetch: Any, *parts: str, **kwargs: Any) -> Any:
    response = await jp_fetch("dtwork", *parts, **kwargs)
    assert response.code == 200
    return json.loads(response.body)


async def error_of(jp_fetch: Any, *parts: str, code: int = 404, **kwargs: Any) -> str:
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("dtwork", *parts, **kwargs)
    assert info.value.code == code, info.value
    assert info.value.response is not None
    return str(json.loads(info.value.response.body)["error"])


def dot(folder: Path) -> Path:
    return folder / ".dtwork" / "runs.sqlite"


@in_loop
async def test_runs_of_every_store_under_the_root(jp_fetch: Any, jp_root_dir: Path, dtwork_env: Path) -> None:
    make_store(dtwork_env, "default")
    make_store(dot(jp_root_dir / "sub"), "sub", notebook=jp_root_dir / "sub" / "train.ipynb")
    make_store(dot(jp_root_dir / "a" / "b"), "deep")
    make_store(dot(jp_root_dir / "node_modules" / "x"), "skipped")  # never a notebook's folder
    make_store(dot(jp_root_dir / ".hidden"), "hidden")
    body = await get_json(jp_fetch, "runs", params={"rescan": "1"})
    by_name = {r["name"]: r for r in body["runs"]}
    assert set(by_name) == {"default", "sub", "deep"} and body["total"] == 3 and body["notes"] == []
    assert [by_name[n]["store"] for n in ("default", "sub", "deep")] == ["", "sub", "a/b"]
    assert by_name["sub"]["notebook"] == "sub/train.ipynb" and by_name["sub"]["sparkline"][-1] == [2, 1.0]
    # each store numbers its runs from 1: its key picks which run 1
    assert {r["id"] for r in body["runs"]} == {1}
    assert (await get_json(jp_fetch, "runs", "1", params={"store": "sub"}))["run"]["name"] == "sub"
    assert (await get_json(jp_fetch, "runs", "1", params={"store": "a/b"}))["run"]["store"] == "a/b"
    assert (await get_json(jp_fetch, "runs", "1"))["run"]["name"] == "default"
    points = (await get_json(jp_fetch, "runs", "1", "metrics", params={"store": "sub", "name": "loss"}))[
        "points"
    ]
    assert [p[1] for p in points] == [3.0, 2.0, 1.0]
    cell = await get_json(jp_fetch, "runs", "1", "cells", "1", params={"store": "sub"})
    assert cell["seq"] == 1 and cell["step"] == 2
    # a notebook's folder without a store of its own: its runs are the default store's
    assert (await get_json(jp_fetch, "runs", "1", "cells", "1", params={"store": "a"}))["run_id"] == 1
    for bad in ("../x", "/etc", "sub/../..", "a\\b"):
        assert "malformed store" in await error_of(jp_fetch, "runs", "1", params={"store": bad})
    assert "no run store in folder 'a'" in await error_of(jp_fetch, "runs", "1", params={"store": "a"})
    assert "no run store" in await error_of(jp_fetch, "runs", "1", params={"store": "node_modules/y"})


@in_loop
async def test_a_new_store_shows_at_a_rescan_and_a_walk_stops_at_its_bounds(
    jp_fetch: Any, jp_root_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_store(dot(jp_root_dir / "one"), "one")
    assert [r["name"] for r in (await get_json(jp_fetch, "runs", params={"rescan": "1"}))["runs"]] == ["one"]
    make_store(dot(jp_root_dir / "two"), "two")
    # polls between walks read the stores already found, not the tree
    assert [r["name"] for r in (await get_json(jp_fetch, "runs"))["runs"]] == ["one"]
    names = [r["name"] for r in (await get_json(jp_fetch, "runs", params={"rescan": "1"}))["runs"]]
    assert sorted(names) == ["one", "two"]
    monkeypatch.setattr(stores, "RESCAN_SECONDS", 0.0)  # an old walk is walked again
    make_store(dot(jp_root_dir / "three"), "three")
    assert len((await get_json(jp_fetch, "runs"))["runs"]) == 3
    monkeypatch.setattr(stores, "SCAN_FOLDERS", 2)  # the root and "one" only
    body = await get_json(jp_fetch, "runs")
    assert [r["name"] for r in body["runs"]] == ["one"]
    (note,) = body["notes"]
    assert "stopped after 2 folders" in note and "dtwork runs --store" in note
    monkeypatch.setattr(stores, "SCAN_FOLDERS", 100)
    monkeypatch.setattr(stores, "SCAN_DEPTH", 1)
    make_store(dot(jp_root_dir / "x" / "deeper"), "deeper")
    assert "deeper" not in [r["name"] for r in (await get_json(jp_fetch, "runs"))["runs"]]


@in_loop
async def test_a_damaged_folder_store_is_a_note_not_a_503(jp_fetch: Any, jp_root_dir: Path) -> None:
    make_store(dot(jp_root_dir / "good"), "good")
    dot(jp_root_dir / "bad").parent.mkdir(parents=True)
    dot(jp_root_dir / "bad").write_bytes(b"this is not a database" * 100)
    body = await get_json(jp_fetch, "runs", params={"rescan": "1"})
    assert [r["name"] for r in body["runs"]] == ["good"]
    (note,) = body["notes"]
    assert "bad/.dtwork/runs.sqlite" in note and str(jp_root_dir) not in note


@in_loop
async def test_a_folder_runs_report_lands_beside_its_notebook(jp_fetch: Any, jp_root_dir: Path) -> None:
    make_store(dot(jp_root_dir / "sub"), "sub", notebook=jp_root_dir / "sub" / "train.ipynb")
    response = await jp_fetch(
        "dtwork",
        "runs",
        "1",
        "report",
        method="POST",
        body="{}",
        params={"store": "sub"},
        request_timeout=120,
    )
    body = json.loads(response.body)
    assert body["path"] == "sub/reports/run-1.ipynb"
    assert json.loads((jp_root_dir / body["path"]).read_text())["nbformat"] == 4


# -- clusters: their notebooks as the server's sessions name them ------------------------------


@pytest.fixture
def script(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A program outside any notebook (``train.py``) that drives a cluster."""
    path = tmp_path / "train.py"
    path.write_text("import time\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(path), "--lr", "0.1"])
    yield proc
    proc.kill()
    proc.wait()


def register(cluster_id: str, kernel_pid: int, notebook: str | None) -> None:
    registry.write(
        cluster_id,
        {
            "kernel": registry.proc_record(kernel_pid),
            "kernel_host": socket.gethostname(),  # this host's: only here is a kernel checked
            "state": "running",
            "n": 2,
            "backend": "gloo",
            "ranks": [],
            "processes": [],
            "files": [],
            "started_at": 1700000000.0,
            "notebook": notebook,
        },
    )


@in_loop
async def test_a_clusters_notebook_follows_a_rename_and_a_scripts_is_marked(
    jp_fetch: Any, jp_serverapp: Any, jp_root_dir: Path, script: subprocess.Popen[bytes]
) -> None:
    """One kernel session (a kernel start, ~1 s): its notebook renamed as JupyterLab renames it."""
    (jp_root_dir / "sub").mkdir()
    model = {"path": "sub/Untitled.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    session = json.loads((await jp_fetch("api", "sessions", method="POST", body=json.dumps(model))).body)
    kernel = jp_serverapp.kernel_manager.get_kernel(session["kernel"]["id"])
    assert psutil.pid_exists(kernel.provisioner.pid)
    # what the kernel recorded at %dtrain start: its notebook's name then
    register("dtwork-1-nbook0", kernel.provisioner.pid, str(jp_root_dir / "sub" / "Untitled.ipynb"))
    register("dtwork-2-script", script.pid, None)
    clusters = {c["id"]: c for c in (await get_json(jp_fetch, "clusters"))["clusters"]}
    assert clusters["dtwork-1-nbook0"]["notebook"] == "sub/Untitled.ipynb"
    rename = json.dumps({"path": "sub/mnist.ipynb", "name": "mnist.ipynb"})
    await jp_fetch("api", "sessions", session["id"], method="PATCH", body=rename)
    clusters = {c["id"]: c for c in (await get_json(jp_fetch, "clusters"))["clusters"]}
    nb, sc = clusters["dtwork-1-nbook0"], clusters["dtwork-2-script"]
    assert (nb["notebook"], nb["origin"], nb["program"]) == ("sub/mnist.ipynb", "notebook", None)
    assert (sc["notebook"], sc["origin"], sc["program"]) == (None, "script", "train.py")
    await jp_fetch("api", "sessions", session["id"], method="DELETE")
    # no session holds the kernel any more: the name it recorded
    (nb,) = [c for c in (await get_json(jp_fetch, "clusters"))["clusters"] if c["id"] == "dtwork-1-nbook0"]
    assert nb["notebook"] == "sub/Untitled.ipynb" and nb["origin"] == "notebook"
