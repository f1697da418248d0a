"""The /dtwork/ REST routes, served by a real jupyter_server with authentication on."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import math
import re
import shutil
import sqlite3
import subprocess
import sys
import types
import urllib.parse
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jupyter_server_fixtures import server_fixtures
from tornado.httpclient import HTTPClientError, HTTPResponse
from tornado.routing import PathMatches, Rule

import dtwork
from dtwork.errors import DtworkError
from dtwork.launch import registry
from dtwork.shared import telemetry
from dtwork.shared.records import Kind, make_record
from dtwork.store.runs import RunStore
from dtwork.store.writer import StoreWriter

# pytest-jupyter's fixtures, with its autouse ones (a fresh event loop, a ServerApp clean-up).
globals().update(server_fixtures())


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test to completion on the event loop the server fixtures use."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.get_event_loop().run_until_complete(test(*args, **kwargs))

    return run


# A sample value for each named group of the route patterns (see test_every_route_needs_auth).
SAMPLE_IDS = {"run_id": "1", "seq": "1", "cluster_id": "dtwork-1-abcdef", "rest": "no-such-route"}
EXPECTED_ROUTES = {
    ("GET", "/dtwork/health"),
    ("GET", "/dtwork/clusters"),
    ("POST", "/dtwork/clusters/dtwork-1-abcdef/stop"),
    ("GET", "/dtwork/runs"),
    ("GET", "/dtwork/runs/1"),
    ("GET", "/dtwork/runs/1/metrics"),
    ("GET", "/dtwork/runs/1/cells/1"),
    ("POST", "/dtwork/runs/1/report"),
    ("GET", "/dtwork/gpus"),
}
MALFORMED_RUN_IDS = ["abc", "-1", "1.5", "0x10", "1e3", "..", "%2e%2e%2fetc", "9" * 40, "%20"]
MALFORMED_CLUSTER_IDS = ["..", "-x", "a.b", "a%20b", "%2e%2e%2f%2e%2e", "x" * 200, "%00"]


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"dtwork": True}}}


@pytest.fixture(autouse=True)
def dtwork_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A private cluster registry and run store (which does not exist until a test makes it)."""
    home = tmp_path / "dtwork-home"
    store = tmp_path / "store" / "runs.sqlite"
    monkeypatch.setenv("DTWORK_HOME", str(home))
    monkeypatch.setenv("DTWORK_STORE", str(store))
    return {"home": home, "store": store}


@pytest.fixture
def store(dtwork_env: dict[str, Path]) -> dict[str, int]:
    """A real store: run 1 completed with a loss curve and the panel's figures, run 2 running, empty."""
    with RunStore(dtwork_env["store"]) as s:
        done = s.create_run(name="mlp", world_size=2, backend="gloo", cluster_id="dtwork-1-abcdef")
        s.add_cell(done, "print(ctx.rank)")
        records = [{"step": i, "name": "loss", "value": 2.0 / (i + 1)} for i in range(100)]
        records += [{"step": i, "rank": 0, "name": "loss", "value": 9.0} for i in range(100)]
        records += [  # each rank's own throughput: the run's is the sum of their latest
            {"step": step, "rank": rank, "name": "samples_per_s", "value": 600.0 + step + rank / 2}
            for step in (50, 98)
            for rank in (0, 1)
        ]
        records += [
            {"step": 99, "name": "samples_per_sec", "value": 1234.5},
            {"step": 99, "name": "b_simple", "value": 321.0},
            {"step": 99, "name": "scaling_efficiency", "value": 0.93},
            {"step": 99, "name": "grad_norm", "value": math.nan},
        ]
        s.add_metrics(done, records)
        s.set_run_status(done, "completed", ended=True)
        running = s.create_run(name=None, world_size=2, backend="gloo")
    return {"done": done, "running": running}


async def get_json(jp_fetch: Any, *parts: str, **kwargs: Any) -> Any:
    response = await jp_fetch("dtwork", *parts, **kwargs)
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.body)


async def error_of(jp_fetch: Any, *parts: str, code: int = 404, **kwargs: Any) -> str:
    """Fetch expecting an HTTP error; return its JSON ``error`` message."""
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("dtwork", *parts, **kwargs)
    assert info.value.code == code, info.value
    assert info.value.response is not None
    body = json.loads(info.value.response.body)
    assert isinstance(body["error"], str) and body["error"]
    return body["error"]


def post(body: str = "{}") -> dict[str, Any]:
    return {"method": "POST", "body": body}


# -- authentication: every registered route, enumerated from the web app ----------------------


def _rules(router: Any) -> list[Rule]:
    out = []
    for rule in getattr(router, "rules", []):
        if hasattr(rule.target, "rules"):
            out.extend(_rules(rule.target))
        else:
            out.append(rule)
    return out


def dtwork_routes(web_app: Any) -> list[tuple[str, str, str]]:
    """``(method, url path, pattern)`` for every handler method mounted under /dtwork/."""
    found = []
    for rule in _rules(web_app.default_router) + _rules(web_app.wildcard_router):
        if not isinstance(rule.matcher, PathMatches) or "/dtwork/" not in rule.matcher.regex.pattern:
            continue
        pattern = rule.matcher.regex.pattern
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: SAMPLE_IDS[m.group(1)], pattern).rstrip("$")
        assert re.fullmatch(pattern, path), f"sample path {path} does not match {pattern}"
        handler = rule.target
        for method in ("get", "post", "put", "patch", "delete"):
            if any(method in vars(cls) for cls in handler.__mro__ if cls.__module__.startswith("dtwork")):
                found.append((method.upper(), path, pattern))
    return found


def test_routes_are_enumerated(jp_serverapp: Any, jp_base_url: str) -> None:
    routes = {
        (m, p.replace(jp_base_url.rstrip("/"), "", 1)) for m, p, _ in dtwork_routes(jp_serverapp.web_app)
    }
    assert EXPECTED_ROUTES <= routes, EXPECTED_ROUTES - routes


@pytest.mark.parametrize("token", [None, "not-the-token"])
@in_loop
async def test_every_route_needs_auth(
    jp_serverapp: Any, http_server_client: Any, store: dict[str, int], token: str | None
) -> None:
    routes = dtwork_routes(jp_serverapp.web_app)
    assert len(routes) >= len(EXPECTED_ROUTES)
    headers = {"Authorization": f"token {token}"} if token else {}
    for method, path, pattern in routes:
        body = "{}" if method in ("POST", "PUT", "PATCH") else None
        response: HTTPResponse = await http_server_client.fetch(
            path, method=method, body=body, headers=headers, raise_error=False, follow_redirects=False
        )
        assert response.code == 403, f"{method} {path} ({pattern}) answered {response.code} without auth"


# -- health, unknown routes --------------------------------------------------------------------


@in_loop
async def test_health(jp_fetch: Any) -> None:
    body = await get_json(jp_fetch, "health")
    assert body == {"ok": True, "version": dtwork.__version__, "store_exists": False}


@in_loop
async def test_unknown_route_is_json_404(jp_fetch: Any) -> None:
    assert "no dtwork route" in await error_of(jp_fetch, "nothing", "here")
    assert "no dtwork route" in await error_of(jp_fetch, "runs", "1", "nothing", **post())


# -- runs -------------------------------------------------------------------------------------


@in_loop
async def test_runs_without_store_are_empty(jp_fetch: Any) -> None:
    empty = {"store_exists": False, "total": 0, "runs": [], "searches": [], "notes": []}
    assert await get_json(jp_fetch, "runs") == empty
    assert "store is empty" in await error_of(jp_fetch, "runs", "1")


@in_loop
async def test_runs_with_empty_store_file(jp_fetch: Any, dtwork_env: dict[str, Path]) -> None:
    dtwork_env["store"].parent.mkdir(parents=True)
    dtwork_env["store"].write_bytes(b"")  # e.g. created by another tool, no schema yet
    body = await get_json(jp_fetch, "runs")
    assert body["runs"] == [] and body["total"] == 0


@in_loop
async def test_runs_list(jp_fetch: Any, store: dict[str, int]) -> None:
    body = await get_json(jp_fetch, "runs")
    assert body["store_exists"] is True and body["total"] == 2
    newest, done = body["runs"]
    assert newest["id"] == store["running"] and newest["status"] == "running"
    assert newest["sparkline"] == [] and newest["throughput"] is None and newest["loss"] is None
    assert done["id"] == store["done"] and done["status"] == "completed"
    assert done["world_size"] == 2 and done["backend"] == "gloo" and done["n_cells"] == 1
    assert done["last_step"] == 99
    assert done["throughput"] == 1396.5 and done["b_simple"] == 321.0
    assert done["scaling_efficiency"] == 0.93
    assert done["loss"] == pytest.approx(0.02)
    spark = done["sparkline"]
    assert 2 <= len(spark) <= 48
    assert spark[0] == [0, 2.0] and spark[-1] == [99, pytest.approx(0.02)]  # aggregated, not rank 0's 9.0
    assert [p[0] for p in spark] == sorted(p[0] for p in spark)


@in_loop
async def test_runs_group_a_searchs_trial_runs(jp_fetch: Any, dtwork_env: dict[str, Path]) -> None:
    from dtwork.store import searches

    with RunStore(dtwork_env["store"]) as s:
        new = searches.NewSearch(
            "sweep.yaml", "grid", "loss", True, None, "pass", "c1", 2, "gloo", [{}, {}, {}]
        )
        sid = searches.create(s.db, new)
        first = s.create_run(world_size=2, backend="gloo", cluster_id="c1")
        searches.set_trial(s.db, sid, 1, run_id=first, status="completed", metric=0.5)
        s.set_run_status(first, "completed", ended=True)
        second = s.create_run(world_size=2, backend="gloo", cluster_id="c1")  # trial 2, training
        other = s.create_run(world_size=2, backend="gloo", cluster_id="c2")  # not the search's
    body = await get_json(jp_fetch, "runs")
    assert [r["id"] for r in body["runs"]] == [other, second, first]
    (group,) = body["searches"]
    assert group["run_ids"] == [first, second]
    tally = [group[k] for k in ("id", "label", "status", "best", "trials", "running", "stopped", "done")]
    assert tally == [sid, "sweep.yaml", "running", 0.5, 3, 1, 0, 1]


@in_loop
async def test_runs_limit_and_fresh_figures(
    jp_fetch: Any, store: dict[str, int], dtwork_env: dict[str, Path]
) -> None:
    body = await get_json(jp_fetch, "runs", params={"limit": "1"})
    assert body["total"] == 2 and [r["id"] for r in body["runs"]] == [store["running"]]
    assert body["runs"][0]["sparkline"] == []
    assert "limit must be a whole number" in await error_of(jp_fetch, "runs", code=400, params={"limit": "x"})
    with RunStore(dtwork_env["store"]) as s:  # the running run logs: the next poll shows it
        s.add_metrics(
            store["running"],
            [{"step": 0, "name": "loss", "value": 3.0}, {"step": 1, "name": "loss", "value": 2.5}],
        )
    (run,) = (await get_json(jp_fetch, "runs", params={"limit": "1"}))["runs"]
    assert run["sparkline"] == [[0, 3.0], [1, 2.5]] and run["loss"] == 2.5 and run["last_step"] == 1


def _decide(path: Path, run_id: int, decisions: list[tuple[int, int, float]]) -> None:
    """Write adaptive decisions ``(step, global_batch, lr_factor)`` as rank 0 publishes them and
    the session's writer stores them (runtime/loop/adaptive.py, writer.py)."""
    records = [
        make_record(
            Kind.ADAPTIVE,
            step,
            0,
            {"global_batch": float(batch), "per_slot_batch": batch / 2, "lr_factor": lr, "efficiency": 0.9},
        )
        for step, batch, lr in decisions
    ]
    with RunStore(path) as s:
        writer = StoreWriter(lambda: s, path)
        writer.records(run_id, None, records)
        assert writer.flush(force=True)


@in_loop
async def test_an_adaptive_runs_batch_trajectory(
    jp_fetch: Any, store: dict[str, int], dtwork_env: dict[str, Path]
) -> None:
    path = dtwork_env["store"]
    with RunStore(path) as s:  # the user's own metrics of the same names are not the decisions'
        s.add_metrics(
            store["running"],
            [
                {"step": 30, "name": "global_batch", "value": 999.0},
                {"step": 130, "name": "lr_factor", "value": 7.0},
            ],
        )
    steps = [(20, 16, 1.0), (40, 16, 1.0), (60, 32, 1.9), (80, 32, 1.9), (100, 64, 3.5), (120, 32, 1.8)]
    _decide(path, store["running"], steps)
    newest, done = (await get_json(jp_fetch, "runs"))["runs"]
    assert newest["adaptive_batch"] == {
        "changes": [[20, 16], [60, 32], [100, 64], [120, 32]],  # the first decision, then each change
        "n_changes": 4,
        "global_batch": 32,
        "lr_factor": 1.8,
    }
    assert done["adaptive_batch"] is None  # nothing for a run that never adapted
    _decide(path, store["running"], [(140, 32, 1.7)])  # a decision that keeps the batch: a new LR factor
    detail = (await get_json(jp_fetch, "runs", str(store["running"])))["run"]["adaptive_batch"]
    assert detail["changes"][-1] == [120, 32] and detail["lr_factor"] == 1.7
    # a long trajectory stays compact: first and last kept, every change counted
    _decide(path, store["running"], [(200 + i, 16 << (i % 3), 1.0) for i in range(40)])
    (run,) = (await get_json(jp_fetch, "runs", params={"limit": "1"}))["runs"]
    changes = run["adaptive_batch"]["changes"]
    assert len(changes) == 16 and run["adaptive_batch"]["n_changes"] == 44
    assert changes[0] == [20, 16] and changes[-1] == [239, 16 << (39 % 3)]
    assert [c[0] for c in changes] == sorted(c[0] for c in changes)


@in_loop
async def test_run_detail(jp_fetch: Any, store: dict[str, int]) -> None:
    run = (await get_json(jp_fetch, "runs", str(store["done"])))["run"]
    assert run["id"] == store["done"] and run["name"] == "mlp"
    assert run["metric_names"] == [
        "b_simple",
        "grad_norm",
        "loss",
        "samples_per_s",
        "samples_per_sec",
        "scaling_efficiency",
    ]
    assert run["last_metrics"]["grad_norm"] is None  # NaN travels as null: valid JSON
    assert run["last_metrics"]["samples_per_sec"] == 1234.5
    assert len(run["sparkline"]) == 100


@in_loop
async def test_run_metrics(jp_fetch: Any, store: dict[str, int]) -> None:
    rid = str(store["done"])
    body = await get_json(jp_fetch, "runs", rid, "metrics", params={"name": "loss"})
    assert body["name"] == "loss" and body["total"] == 100 and len(body["points"]) == 100
    step, value, when = body["points"][3]
    assert step == 3 and value == pytest.approx(0.5) and when > 0
    body = await get_json(jp_fetch, "runs", rid, "metrics", params={"name": "loss", "max_points": "10"})
    assert len(body["points"]) == 10 and body["points"][-1][0] == 99
    nan = await get_json(jp_fetch, "runs", rid, "metrics", params={"name": "grad_norm"})
    assert nan["points"][0][1] is None
    assert "name the metric" in await error_of(jp_fetch, "runs", rid, "metrics", code=400)
    message = await error_of(jp_fetch, "runs", rid, "metrics", params={"name": "accuracy"})
    assert "no metric 'accuracy'" in message and "loss" in message
    assert "malformed metric name" in await error_of(jp_fetch, "runs", rid, "metrics", params={"name": "a b"})


@in_loop
async def test_cell_view_follows_the_cell_then_shows_its_end(
    jp_fetch: Any, store: dict[str, int], dtwork_env: dict[str, Path]
) -> None:
    """What a notebook reopened mid-training polls: the cell's own rows drawn as the dashboard
    draws them, the figure growing while the cell runs, then its final status."""
    rid = store["running"]
    with RunStore(dtwork_env["store"]) as s:
        first = s.add_cell(rid, "pass")
        s.add_metrics(rid, [{"step": 0, "name": "loss", "value": 7.0, "cell_seq": first}])
        s.finish_cell(rid, first, "ok")
        seq = s.add_cell(rid, "train()", ranks=[0, 1])
        s.add_metrics(rid, [{"step": i, "name": "loss", "value": 1.0 + i, "cell_seq": seq} for i in range(3)])

    def loss(body: dict[str, Any]) -> list[float]:
        return next(t["y"] for t in body["figure"]["data"] if t.get("name") == "loss")

    body = await get_json(jp_fetch, "runs", str(rid), "cells", str(seq))
    assert body["status"] == "running" and body["running"] is True and body["step"] == 2
    assert loss(body) == [1.0, 2.0, 3.0]  # not the first cell's 7.0
    assert "cell 2" in body["figure"]["layout"]["title"]["text"]
    with RunStore(dtwork_env["store"]) as s:
        s.add_metrics(rid, [{"step": 3, "name": "loss", "value": 4.0, "cell_seq": seq}])
        s.finish_cell(rid, seq, "ok")
    body = await get_json(jp_fetch, "runs", str(rid), "cells", str(seq))
    assert body["status"] == "ok" and body["running"] is False and body["step"] == 3
    assert loss(body) == [1.0, 2.0, 3.0, 4.0]
    assert "step 3 · finished" in body["figure"]["layout"]["title"]["text"]
    with RunStore(dtwork_env["store"]) as s:  # a cell cut short by the cluster's end ends with the run
        third = s.add_cell(rid, "train()")
        s.set_run_status(rid, "stopped", ended=True)
    assert (await get_json(jp_fetch, "runs", str(rid), "cells", str(third)))["status"] == "stopped"
    assert "no cell 9" in await error_of(jp_fetch, "runs", str(rid), "cells", "9")
    assert "malformed cell number" in await error_of(jp_fetch, "runs", str(rid), "cells", "x")
    assert "no run 999" in await error_of(jp_fetch, "runs", "999", "cells", "1")


@pytest.mark.parametrize("suffix", [(), ("metrics",), ("report",)])
@pytest.mark.parametrize("run_id", MALFORMED_RUN_IDS)
@in_loop
async def test_malformed_run_ids(
    jp_fetch: Any, store: dict[str, int], run_id: str, suffix: tuple[str, ...]
) -> None:
    kwargs = post() if suffix == ("report",) else {"params": {"name": "loss"}}
    assert "malformed run id" in await error_of(jp_fetch, "runs", run_id, *suffix, **kwargs)


@pytest.mark.parametrize("suffix", [(), ("metrics",), ("report",)])
@in_loop
async def test_unknown_run_ids(jp_fetch: Any, store: dict[str, int], suffix: tuple[str, ...]) -> None:
    kwargs = post() if suffix == ("report",) else {"params": {"name": "loss"}}
    assert "no run 999" in await error_of(jp_fetch, "runs", "999", *suffix, **kwargs)


@in_loop
async def test_no_paths_or_environment_leak(
    jp_fetch: Any, store: dict[str, int], dtwork_env: dict[str, Path], tmp_path: Path
) -> None:
    texts = []
    for parts in (("health",), ("runs",), ("runs", "1"), ("runs", "999"), ("clusters",), ("gpus",)):
        try:
            texts.append((await jp_fetch("dtwork", *parts)).body.decode())
        except HTTPClientError as exc:
            assert exc.response is not None
            texts.append(exc.response.body.decode())
    for text in texts:
        assert str(tmp_path) not in text and "runs.sqlite" not in text and "DTWORK" not in text


# -- report -----------------------------------------------------------------------------------


@in_loop
async def test_report_missing_module_is_501(
    jp_fetch: Any, store: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "dtwork.report", None)  # import fails as if not installed
    message = await error_of(jp_fetch, "runs", str(store["done"]), "report", code=501, **post())
    assert "report export is not available" in message


@in_loop
async def test_report_exports_and_returns_relative_path(
    jp_fetch: Any, jp_root_dir: Path, store: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []

    def export(run_id: int, path: Path, **kwargs: Any) -> Path:
        calls.append((run_id, Path(path), kwargs))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("{}")
        return Path(path)

    monkeypatch.setitem(sys.modules, "dtwork.report", types.SimpleNamespace(export=export))
    rid = store["done"]
    body = await get_json(jp_fetch, "runs", str(rid), "report", **post())
    assert body == {"run_id": rid, "path": f"reports/run-{rid}.ipynb"}
    assert (jp_root_dir / body["path"]).is_file()
    assert calls[0][0] == rid


@in_loop
async def test_report_failure_is_500_without_paths(
    jp_fetch: Any, store: dict[str, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def export(run_id: int, path: Path) -> Path:
        raise RuntimeError(f"cannot write {path}")

    monkeypatch.setitem(sys.modules, "dtwork.report", types.SimpleNamespace(export=export))
    message = await error_of(jp_fetch, "runs", str(store["done"]), "report", code=500, **post())
    assert "cannot write run-1.ipynb" in message and str(tmp_path) not in message


@in_loop
async def test_report_refused_is_409(
    jp_fetch: Any, store: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def export(run_id: int, path: Path) -> Path:
        raise DtworkError(f"run {run_id} has no cells: nothing to export")

    monkeypatch.setitem(sys.modules, "dtwork.report", types.SimpleNamespace(export=export))
    message = await error_of(jp_fetch, "runs", str(store["running"]), "report", code=409, **post())
    assert "has no cells" in message


@pytest.mark.skipif(importlib.util.find_spec("dtwork.report") is None, reason="dtwork.report not written yet")
@in_loop
async def test_report_with_the_real_exporter(jp_fetch: Any, jp_root_dir: Path, store: dict[str, int]) -> None:
    rid = store["done"]
    body = await get_json(jp_fetch, "runs", str(rid), "report", **post(), request_timeout=120)
    notebook = json.loads((jp_root_dir / body["path"]).read_text())
    assert body["path"] == f"reports/run-{rid}.ipynb" and notebook["nbformat"] == 4


@in_loop
async def test_concurrent_exports_give_correct_reports(
    jp_fetch: Any, jp_root_dir: Path, store: dict[str, int], dtwork_env: dict[str, Path]
) -> None:
    """A double click and a second run at once: each answer names its own complete report."""
    with RunStore(dtwork_env["store"]) as s:
        other = s.create_run(name="cnn", world_size=2, backend="gloo")
        s.add_cell(other, "print(2)")
        s.add_metrics(other, [{"step": i, "name": "acc", "value": 0.5} for i in range(10)])
    done = store["done"]
    fetches = [
        get_json(jp_fetch, "runs", str(rid), "report", **post(), request_timeout=300)
        for rid in (done, other, done)
    ]
    bodies = await asyncio.gather(*fetches)
    assert [b["run_id"] for b in bodies] == [done, other, done]
    for body, name in zip(bodies, ("mlp", "cnn", "mlp"), strict=True):
        nb = json.loads((jp_root_dir / body["path"]).read_text())
        assert nb["metadata"]["dtwork"]["run_id"] == body["run_id"]
        assert f"dtwork report: {name}" in "".join(nb["cells"][0]["source"])
        streams = [o for c in nb["cells"] for o in c.get("outputs", []) if o["output_type"] == "stream"]
        assert len(streams) == 1, streams  # its own analysis output, once


@in_loop
async def test_report_scrubs_the_kernel_environment_sent_in_the_body(
    jp_fetch: Any, jp_root_dir: Path, store: dict[str, int], dtwork_env: dict[str, Path]
) -> None:
    kernel_only = "kernel-only-7f3a9c21e8"  # in no token shape, and not in the server's environment
    with RunStore(dtwork_env["store"]) as s:
        rid = s.create_run(name="env", world_size=2, backend="gloo")
        s.add_cell(rid, f"print('{kernel_only}')")
    body = json.dumps({"environ": {"HF_TOKEN": kernel_only}})
    answer = await get_json(jp_fetch, "runs", str(rid), "report", **post(body), request_timeout=120)
    text = (jp_root_dir / answer["path"]).read_text()
    assert kernel_only not in text and "$HF_TOKEN" in text
    message = await error_of(jp_fetch, "runs", str(rid), "report", code=400, **post('{"environ": [1]}'))
    assert "environ" in message


# -- clusters ---------------------------------------------------------------------------------


@pytest.fixture
def sleeper() -> Any:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def register(cluster_id: str, pids: list[int], notebook: str | None = None) -> None:
    kernel = registry.proc_record(psutil.Process().pid)  # this process: the "kernel" is alive
    registry.write(
        cluster_id,
        {
            "kernel": kernel,
            "kernel_host": "host-a",
            "state": "running",
            "n": 2,
            "backend": "gloo",
            "ranks": [
                {
                    "rank": r,
                    "hostname": "host-a",
                    "local_rank": r,
                    "device": "cpu",
                    "gpu_name": None,
                    "pid": pids[0],
                    "engine_id": r,
                }
                for r in range(2)
            ],
            "processes": [registry.proc_record(p) for p in pids],
            "files": [],
            "cwd": "/somewhere/secret",
            "store": "/somewhere/secret/runs.sqlite",
            "started_at": 1700000000.0,
            "notebook": notebook,
        },
    )


@in_loop
async def test_clusters_empty(jp_fetch: Any) -> None:
    assert await get_json(jp_fetch, "clusters") == {"clusters": []}


@in_loop
async def test_clusters_list_and_stop(
    jp_fetch: Any, jp_root_dir: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    cid = "dtwork-4242-a1b2c3"
    register(cid, [sleeper.pid], notebook=str(jp_root_dir / "work" / "train.ipynb"))
    (cluster,) = (await get_json(jp_fetch, "clusters"))["clusters"]
    assert cluster["id"] == cid and cluster["state"] == "running" and cluster["backend"] == "gloo"
    assert cluster["kernel_alive"] is True and cluster["notebook"] == "work/train.ipynb"
    assert [r["rank"] for r in cluster["ranks"]] == [0, 1] and cluster["ranks"][1]["device"] == "cpu"
    assert cluster["pids"] == [sleeper.pid]
    assert "secret" not in json.dumps(cluster)

    body = await get_json(jp_fetch, "clusters", cid, "stop", **post())
    assert body == {"stopped": cid, "killed": [sleeper.pid]}
    assert not psutil.pid_exists(sleeper.pid)
    assert not registry.entry_path(cid).exists()
    assert await get_json(jp_fetch, "clusters") == {"clusters": []}
    assert "no cluster" in await error_of(jp_fetch, "clusters", cid, "stop", **post())


@in_loop
async def test_stop_leaves_other_clusters(jp_fetch: Any, sleeper: subprocess.Popen[bytes]) -> None:
    register("dtwork-1-keep00", [sleeper.pid])
    assert "no cluster" in await error_of(jp_fetch, "clusters", "dtwork-2-other0", "stop", **post())
    assert psutil.pid_exists(sleeper.pid) and sleeper.poll() is None
    assert [c["id"] for c in (await get_json(jp_fetch, "clusters"))["clusters"]] == ["dtwork-1-keep00"]


@pytest.mark.parametrize("cluster_id", MALFORMED_CLUSTER_IDS)
@in_loop
async def test_malformed_cluster_ids(
    jp_fetch: Any, sleeper: subprocess.Popen[bytes], cluster_id: str
) -> None:
    register("dtwork-1-keep00", [sleeper.pid])
    assert "malformed cluster id" in await error_of(jp_fetch, "clusters", cluster_id, "stop", **post())
    assert sleeper.poll() is None


@pytest.mark.parametrize(
    "path", ["clusters/..%2F..%2Fetc/stop", "clusters/%2e%2e/stop", "runs/..%2F1", "runs/1%2F..%2F2/metrics"]
)
@in_loop
async def test_encoded_traversal_is_json_404(
    http_server_client: Any, jp_base_url: str, jp_auth_header: dict[str, str], path: str
) -> None:
    method, body = ("POST", "{}") if path.endswith("stop") else ("GET", None)
    response = await http_server_client.fetch(
        jp_base_url + "dtwork/" + path, method=method, body=body, headers=jp_auth_header, raise_error=False
    )
    assert response.code == 404
    assert "malformed" in json.loads(response.body)["error"]


@in_loop
async def test_stop_get_is_not_allowed(jp_fetch: Any) -> None:
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("dtwork", "clusters", "dtwork-1-abcdef", "stop")
    assert info.value.code == 405


# -- GPUs -------------------------------------------------------------------------------------


@in_loop
async def test_gpus_cpu_mode(jp_fetch: Any) -> None:
    body = await get_json(jp_fetch, "gpus")
    if telemetry.gpu_count() == 0:
        assert body["available"] is False and body["gpus"] == []
        assert "CPU mode" in body["reason"]
    else:
        assert body["available"] is True and body["gpus"]


@in_loop
async def test_gpus_never_500(jp_fetch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[Any]:
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(telemetry, "gpu_inventory", broken)
    body = await get_json(jp_fetch, "gpus")
    assert body == {"available": False, "reason": "NVML failed: RuntimeError", "gpus": []}


@in_loop
async def test_gpus_with_fake_nvml_data(jp_fetch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = telemetry.GPUInfo(0, "Fake H100", "GPU-0", 81559.0, "555.1")
    sample = telemetry.GPUSample(0, 87.0, 1024.0, 81559.0, 61.0, None)
    monkeypatch.setattr(telemetry, "gpu_inventory", lambda: [gpu])
    monkeypatch.setattr(telemetry, "sample", lambda indices=None: [sample])
    (g,) = (await get_json(jp_fetch, "gpus"))["gpus"]
    assert g["name"] == "Fake H100" and g["utilization"] == 87.0 and g["power_w"] is None


# -- a store that cannot be read, and bodies the server cannot take -----------------------------

STORE_ROUTES: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("runs",), {}),
    (("runs", "1"), {}),
    (("runs", "1", "metrics"), {"params": {"name": "loss"}}),
    (("runs", "1", "report"), post()),
]


def _damage_header(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)


def _damage_pages(path: Path) -> None:
    """The header readable, every page after the first garbage."""
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * (path.stat().st_size - 4096))


def _newer(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA user_version = 999")


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "header": (_damage_header, "is not a dtwork run store"),
    "pages": (_damage_pages, "is damaged (database disk image is malformed)"),
    "newer": (_newer, "newer than this dtwork supports"),
}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Another program in the middle of a write (a rollback journal: its lock stops readers too)."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("INSERT INTO events (time, kind, message) VALUES (0, 'x', 'y')")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")


def _reading_export(run_id: int, path: Path, store: Path, environ: dict[str, str]) -> Path:
    """An exporter that reads the run as the real one does, and writes nothing (fast)."""
    with RunStore(store, readonly=True) as s:
        s.cells(run_id), s.metrics(run_id, rank="all"), s.events(run_id)
    return path


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@in_loop
async def test_a_damaged_store_answers_503_with_the_reason(
    jp_fetch: Any, store: dict[str, int], dtwork_env: dict[str, Path], tmp_path: Path, damage: str
) -> None:
    make, says = DAMAGE[damage]
    make(dtwork_env["store"])
    for parts, kwargs in STORE_ROUTES:
        message = await error_of(jp_fetch, *parts, code=503, **kwargs)
        assert says in message and str(tmp_path) not in message, (parts, message)
        assert "store runs.sqlite " in message  # outside the server root: named by its file name
    assert (await get_json(jp_fetch, "health"))["store_exists"]


@in_loop
async def test_a_locked_store_answers_503_not_an_empty_list(
    jp_fetch: Any, store: dict[str, int], dtwork_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "dtwork.report", types.SimpleNamespace(export=_reading_export))
    with _locked(dtwork_env["store"]):
        for parts, kwargs in STORE_ROUTES:
            message = await error_of(jp_fetch, *parts, code=503, **kwargs)
            assert "is locked by another program" in message, (parts, message)
    assert (await get_json(jp_fetch, "runs"))["total"] == 2  # and back once the lock is gone


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("[" * 100_000 + "]" * 100_000, "must be JSON"),  # deeper than the parser's recursion
        ('{"environ": ' + "[" * 5000 + "]" * 5000 + "}", "must be JSON"),
        ('{"environ": {"A": "' + "x" * (9 * 2**20) + '"}}', "at most 8388608"),
        ('{"environ": {"A": 1}}', "map names to strings"),
        ('"environ"', "must be JSON"),
        (b"\xff\xfe\x00garbage", "must be JSON"),
    ],
    ids=["deep", "deep-environ", "huge", "not-strings", "not-an-object", "not-utf8"],
)
@in_loop
async def test_report_bodies_it_cannot_take_are_400(
    jp_fetch: Any, store: dict[str, int], body: str | bytes, says: str
) -> None:
    message = await error_of(jp_fetch, "runs", "1", "report", code=400, method="POST", body=body)
    assert says in message


def _bodies() -> st.SearchStrategy[bytes]:
    json_values = st.recursive(
        st.none() | st.booleans() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=20,
    )
    return st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps({"environ": v}).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.integers(1, 3000).map(lambda n: b'{"environ":' + b"[" * n + b"]" * n + b"}"),
        st.integers(900, 3000).map(lambda n: b"{" * n),
        st.integers(900, 3000).map(lambda n: b"[" * n + b"]" * n),
        st.dictionaries(st.text(max_size=30), st.text(max_size=30), max_size=5).map(
            lambda env: json.dumps({"environ": env}).encode()
        ),
    )


FUZZ_STORES = ["healthy", "missing", "header", "pages", "newer"]


@pytest.mark.parametrize("state", FUZZ_STORES)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    route=st.sampled_from(
        [*STORE_ROUTES, (("health",), {}), (("clusters",), {}), (("clusters", "x", "stop"), {})]
    ),
    body=_bodies(),
    run_id=st.one_of(st.just("1"), st.text(max_size=12)),
    query=st.text(max_size=12),
)
def test_fuzzed_routes_never_answer_500(
    jp_fetch: Any,
    dtwork_env: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    route: tuple[tuple[str, ...], dict[str, Any]],
    state: str,
    body: bytes,
    run_id: str,
    query: str,
) -> None:
    monkeypatch.setitem(sys.modules, "dtwork.report", types.SimpleNamespace(export=_reading_export))
    path = dtwork_env["store"]
    shutil.rmtree(path.parent, ignore_errors=True)
    if state != "missing":
        with RunStore(path) as s:
            rid = s.create_run(name="fuzz", world_size=2, backend="gloo")
            s.add_cell(rid, "pass")
            s.add_metrics(rid, [{"step": i, "name": "loss", "value": 1.0} for i in range(300)])
    if state in DAMAGE:
        DAMAGE[state][0](path)
    parts, kwargs = route
    parts = tuple(urllib.parse.quote(run_id, safe="") or "x" if p == "1" else p for p in parts)
    if kwargs.get("method") == "POST" or parts[-1] == "stop":
        kwargs = {"method": "POST", "body": body}
    else:
        kwargs = {"params": {"name": query, "limit": query, "max_points": query}}

    async def fetch() -> int:
        try:
            response = await jp_fetch("dtwork", *parts, **kwargs)
        except HTTPClientError as exc:
            assert exc.response is not None
            assert isinstance(json.loads(exc.response.body)["error"], str)
            return exc.code
        return response.code

    code = asyncio.get_event_loop().run_until_complete(fetch())
    assert code != 500 and code < 600, (parts, state, code)
    if state in ("header", "pages", "newer") and parts[0] == "runs" and run_id == "1":
        assert code in (400, 503), (parts, state, code)
