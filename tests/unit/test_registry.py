"""The cluster registry: private files, validated entries, per-host staleness, malformed files.

Real files in a private DTWORK_HOME, real processes (a sleeper a cluster "owns", a kernel that
exited), a real cluster start and a real jupyter_server for GET /dtwork/clusters.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import warnings
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jupyter_server_fixtures import server_fixtures

from dtwork.errors import DtworkError, DtworkWarning
from dtwork.launch import registry

globals().update(server_fixtures(autouse=False))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "dtwork-home"
    monkeypatch.setenv("DTWORK_HOME", str(path))
    return path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def security_file(tmp_path: Path, cluster_id: str) -> Path:
    """An ipyparallel cluster file as a cluster's entry names it."""
    path = tmp_path / "profile_default" / "security" / f"cluster-{cluster_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    return path


def raw(home: Path, name: str, content: Any) -> Path:
    """Write a registry file as anyone with access to the directory could."""
    path = registry.clusters_dir() / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_directories_are_0700_and_files_0600(home: Path) -> None:
    registry.write("dtwork-1-abcdef", {"kernel": registry.proc_record(os.getpid())})
    assert mode(home) == 0o700 and mode(home / "clusters") == 0o700
    os.chmod(home / "clusters", 0o755)  # as an older dtwork made it
    path = registry.write("dtwork-1-abcdef", {"kernel": registry.proc_record(os.getpid())})
    assert mode(home / "clusters") == 0o700 and mode(path) == 0o600
    names = sorted(p.name for p in (home / "clusters").iterdir())
    assert names == [".dtwork-1-abcdef.lock", "dtwork-1-abcdef.json"]  # its lock, no temp file
    assert mode(home / "clusters" / ".dtwork-1-abcdef.lock") == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_registry_directory_of_another_user_is_refused(home: Path) -> None:
    (home / "clusters").mkdir(parents=True)
    os.chown(home / "clusters", 65534, 65534)
    with pytest.raises(DtworkError, match="belongs to user id 65534.*DTWORK_HOME"):
        registry.write("dtwork-1-abcdef", {"kernel": registry.proc_record(os.getpid())})


def test_a_stale_entry_of_this_host_is_cleaned_with_its_processes_and_file(
    home: Path, tmp_path: Path, sleeper: subprocess.Popen[bytes], dead_kernel: dict[str, Any]
) -> None:
    cid = "dtwork-7-stale1"
    ipp_file = security_file(tmp_path, cid)
    registry.write(
        cid,
        {"kernel": dead_kernel, "processes": [registry.proc_record(sleeper.pid)], "files": [str(ipp_file)]},
    )
    assert registry.clean_stale() == [cid]
    assert sleeper.wait(timeout=30) is not None
    assert not ipp_file.exists() and not registry.entry_path(cid).exists()


def test_a_stale_entry_listing_no_process_yet_ends_those_that_carry_its_mark(
    home: Path, dead_kernel: dict[str, Any]
) -> None:
    """A kernel killed midway through a start registered the cluster before launching anything, so
    its entry lists no process yet: the processes are found by the mark ipyparallel gave them (in
    sessions of their own, as ipyparallel starts them)."""
    cid, other = "dtwork-7-marked", "dtwork-7-other1"
    procs = [
        subprocess.Popen(["sleep", "120"], env={**os.environ, registry.MARK: c}, start_new_session=True)
        for c in (cid, cid, other)
    ]
    try:
        assert sorted(p["pid"] for p in registry.marked(cid)) == sorted(p.pid for p in procs[:2])
        registry.write(cid, {"kernel": dead_kernel, "processes": []})
        assert registry.clean_stale() == [cid]
        assert all(p.wait(timeout=10) is not None for p in procs[:2])
        assert procs[2].poll() is None  # another cluster's are left alone
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_stale_slurm_entry_cancels_its_job_by_name_too(
    home: Path, tmp_path: Path, dead_kernel: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel killed while sbatch ran never learnt the job's id: the job is named after the cluster."""
    calls = tmp_path / "scancel.calls"
    fake = tmp_path / "bin" / "scancel"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    cid = "dtwork-7-slurm1"
    registry.write(cid, {"kernel": dead_kernel, "launcher": "slurm", "jobs": ["42"]})
    assert registry.clean_stale() == [cid]
    user = pwd.getpwuid(os.getuid()).pw_name
    assert calls.read_text().splitlines() == ["42", f"--name {cid} --user {user}"]


def test_another_hosts_live_cluster_is_never_cleaned(
    home: Path, tmp_path: Path, sleeper: subprocess.Popen[bytes], dead_kernel: dict[str, Any]
) -> None:
    """A home shared over NFS: host B's kernel PID means nothing here (it looks dead)."""
    cid = "dtwork-8-hostb1"
    ipp_file = security_file(tmp_path, cid)
    entry = {
        "kernel": dead_kernel,
        "kernel_host": "not-" + registry.this_host(),
        "processes": [registry.proc_record(sleeper.pid)],
        "files": [str(ipp_file)],
    }
    registry.write(cid, entry)
    assert registry.clean_stale() == []
    assert sleeper.poll() is None and ipp_file.exists() and registry.entry_path(cid).exists()
    (listed,) = registry.entries()
    assert listed["local"] is False and listed["kernel_alive"] is True


def test_forged_entries_delete_nothing_outside_the_registry(
    home: Path, tmp_path: Path, sleeper: subprocess.Popen[bytes], dead_kernel: dict[str, Any]
) -> None:
    victims = [home / "x.json", tmp_path / "thesis.tex", tmp_path / "security" / "cluster-other.json"]
    for victim in victims:
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_text("precious")
    procs = [registry.proc_record(sleeper.pid)]
    forged = {
        "dotdot.json": {"cluster_id": "../x", "kernel": dead_kernel, "kernel_host": registry.this_host()},
        "dtwork-9-aaaaaa.json": {  # the id of another file: its clean-up would remove that one
            "cluster_id": "dtwork-9-bbbbbb",
            "kernel": dead_kernel,
            "kernel_host": registry.this_host(),
        },
        "dtwork-9-bbbbbb.json": {
            "cluster_id": "dtwork-9-bbbbbb",
            "kernel": dead_kernel,
            "kernel_host": registry.this_host(),
            "processes": procs,
            "files": [str(v) for v in victims],
        },
    }
    paths = [raw(home, name, content) for name, content in forged.items()]
    with pytest.warns(DtworkWarning) as caught:
        assert registry.clean_stale() == []
    messages = " | ".join(str(w.message) for w in caught)
    assert "malformed cluster_id '../x'" in messages
    assert "does not match the file name" in messages and "files may only name" in messages
    assert all(v.read_text() == "precious" for v in victims)
    assert all(p.exists() for p in paths) and sleeper.poll() is None
    with pytest.raises(DtworkError, match="malformed cluster id"):
        registry.remove("../x")


MALFORMED: dict[str, Any] = {
    "not-json.json": "{this is not json",
    "a-list.json": [1, 2, 3],
    "no-kernel.json": {"cluster_id": "no-kernel", "kernel_host": "h"},
    "bad-kernel.json": {
        "cluster_id": "bad-kernel",
        "kernel_host": "h",
        "kernel": {"pid": "1", "create_time": 0},
    },
    "nan-time.json": '{"cluster_id": "nan-time", "kernel_host": "h", "kernel": {"pid": 1, "create_time": NaN}}',
    "bad-notebook.json": {
        "cluster_id": "bad-notebook",
        "kernel_host": "h",
        "kernel": {"pid": 1, "create_time": 1.0},
        "notebook": {"a": 1},
    },
    "bad-procs.json": {
        "cluster_id": "bad-procs",
        "kernel_host": "h",
        "kernel": {"pid": 1, "create_time": 1.0},
        "processes": [{"pid": 10**30, "create_time": 1.0}, None],
    },
}


def test_malformed_files_are_skipped_with_a_warning_each(home: Path) -> None:
    for name, content in MALFORMED.items():
        raw(home, name, content)
    registry.write("dtwork-1-good01", {"kernel": registry.proc_record(os.getpid())})
    with pytest.warns(DtworkWarning) as caught:
        listed = registry.entries()
    assert [e["cluster_id"] for e in listed] == ["dtwork-1-good01"] and listed[0]["kernel_alive"] is True
    assert sorted(Path(str(w.message).split()[4].rstrip(":")).name for w in caught) == sorted(MALFORMED)


@pytest.mark.usefixtures("jp_server_cleanup")
def test_the_clusters_route_lists_the_valid_entries_among_malformed_ones(
    home: Path, jp_fetch: Any, jp_asyncio_loop: Any
) -> None:
    for name, content in MALFORMED.items():
        raw(home, name, content)
    registry.write("dtwork-1-good01", {"kernel": registry.proc_record(os.getpid()), "state": "running"})

    def run(coro: Coroutine[Any, Any, Any]) -> Any:
        return jp_asyncio_loop.run_until_complete(coro)

    with pytest.warns(DtworkWarning):
        response = run(jp_fetch("dtwork", "clusters"))
    assert response.code == 200
    (cluster,) = json.loads(response.body)["clusters"]
    assert cluster["id"] == "dtwork-1-good01" and cluster["kernel_alive"] is True


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"dtwork": True}}}


# -- fuzzing: registry files as anyone could write them -----------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
KEYS = ["cluster_id", "kernel", "kernel_host", "processes", "files", "notebook", "ranks", "state", "n"]


@st.composite
def entry_files(draw: st.DrawFn, sentinel: str, dead: dict[str, Any]) -> tuple[str, Any]:
    """A file name and content: random JSON, or an entry close to valid naming the sentinel."""
    name = draw(st.sampled_from(["dtwork-1-fuzz01", "../x", "x", ".hidden", "a b"]))
    data: dict[str, Any] = draw(st.dictionaries(st.sampled_from(KEYS), JSON, max_size=6))
    if draw(st.booleans()):
        data.update({"cluster_id": name, "kernel": dead, "kernel_host": registry.this_host()})
        data["files"] = draw(st.lists(st.sampled_from([sentinel, "../sentinel", "security/cluster-x.json"])))
    return name, data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_registry_files_never_raise_nor_delete_outside(
    data: st.DataObject, home: Path, tmp_path: Path, dead_kernel: dict[str, Any]
) -> None:
    victims = [tmp_path / "sentinel", home / "x.json"]
    for victim in victims:
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_text("keep")
    name, content = data.draw(entry_files(str(victims[0]), dead_kernel))
    path = registry.clusters_dir() / f"{name.replace('/', '_')}.json"
    path.write_text(json.dumps(content))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DtworkWarning)  # a malformed file warns; that is all it does
        registry.entries()
        registry.clean_stale()
    assert all(v.read_text() == "keep" for v in victims)
    path.unlink(missing_ok=True)


def test_engine_logs_pruned_by_two_kernels_at_once_keep_every_registered_clusters_log(home: Path) -> None:
    from dtwork.kernel import calls

    folder = home / "logs"
    folder.mkdir(parents=True)
    for i in range(60):
        (folder / f"dtwork-old{i}.log").write_text("x")
        os.utime(folder / f"dtwork-old{i}.log", (1_000_000 + i, 1_000_000 + i))
    registry.write("dtwork-old0", {"kernel": registry.proc_record(os.getpid())})  # the oldest, still live
    script = (
        "from dtwork.kernel import calls\n"
        "import sys\n"
        "for i in range(60):\n"
        "    log, _ = calls.engine_log(f'dtwork-{sys.argv[1]}{i}')\n"
        "    calls.close_log(log)\n"
    )
    env = {**os.environ, "DTWORK_HOME": str(home)}
    procs = [
        subprocess.Popen(["python", "-c", script, name], env=env, stderr=subprocess.PIPE, text=True)
        for name in ("a", "b", "c")
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    left = {p.stem for p in folder.glob("dtwork-*.log")}
    assert "dtwork-old0" in left
    assert len(left) <= calls.KEEP_LOGS + 1 + 3  # each kernel's newest may land after the others pruned
