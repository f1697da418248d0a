"""A kept cluster's lifecycle without a cluster: the keep time, the reaper on real processes (a
dead kernel, a process standing in for an engine), claiming and giving back the entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dtwork
from dtwork.errors import DtworkError
from dtwork.kernel import calls, kept
from dtwork.kernel import stacks as rank_stacks
from dtwork.launch import registry

ROOT = Path(dtwork.__file__).resolve().parents[1]
BOUND = 60.0  # a slow machine's bound on what takes the reaper a second


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DTWORK_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


@pytest.fixture
def reaper() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def register(
    cid: str, kernel: dict[str, Any], engine: subprocess.Popen[bytes], keep: float, **more: Any
) -> Path:
    rec = registry.proc_record(engine.pid)
    data = {
        "kernel": kernel,
        "processes": [rec],
        "keep": keep,
        "n": 2,
        "backend": "gloo",
        "cwd": str(Path.cwd()),
    }
    return registry.write(cid, data | more)


def start_reaper(path: Path, reaper: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the dtwork under test, not an installed one
    proc = subprocess.Popen([sys.executable, "-m", "dtwork.launch.reaper", str(path)], env=env)
    reaper.append(proc)
    rec = registry.proc_record(proc.pid)
    assert rec is not None
    data = registry.read(path)
    assert data is not None
    registry.write(path.stem, data | {"reaper": rec})
    return rec


def until(cond: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), (90, 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5d", 129600)]
)
def test_keep_times_read_as_people_write_them(text: object, seconds: float) -> None:
    assert registry.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["2 weeks", "-1", "0", "h", "", "nan"])
def test_a_bad_keep_time_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(DtworkError, match="keep time") as err:
        registry.parse_duration(text)
    assert "\n" not in str(err.value)


def test_durations_are_said_in_their_two_largest_units() -> None:
    assert [registry.duration(s) for s in (0, 59, 90, 3600, 3690, 90061)] == [
        "0 s",
        "59 s",
        "1 min 30 s",
        "1 h",
        "1 h 1 min",
        "1 d 1 h",
    ]


def test_the_reaper_waits_the_keep_time_then_ends_the_cluster(
    home: Path,
    sleeper: subprocess.Popen[bytes],
    dead_kernel: dict[str, Any],
    reaper: list[subprocess.Popen[bytes]],
) -> None:
    path = register("dtwork-1-keep01", dead_kernel, sleeper, keep=2.0)
    t0 = time.time()
    start_reaper(path, reaper)
    until(
        lambda: (registry.read(path) or {}).get("orphaned_at") is not None, "the reaper notes the kernel gone"
    )
    assert sleeper.poll() is None, "a kept cluster outlives its kernel"
    assert kept.in_folder() and "waiting for a notebook to attach" in kept.describe(registry.entries()[0])
    until(lambda: sleeper.poll() is not None and not path.exists(), "the reaper ends it when its time is up")
    assert time.time() - t0 >= 2.0
    assert reaper[0].wait(timeout=BOUND) == 0


def test_a_claimed_cluster_is_followed_and_a_second_claim_is_refused(
    home: Path,
    sleeper: subprocess.Popen[bytes],
    dead_kernel: dict[str, Any],
    reaper: list[subprocess.Popen[bytes]],
) -> None:
    path = register("dtwork-1-keep02", dead_kernel, sleeper, keep=1.0, notebook="train.ipynb")
    start_reaper(path, reaper)
    until(
        lambda: (registry.read(path) or {}).get("orphaned_at") is not None, "the reaper notes the kernel gone"
    )
    before, now = kept.claim(None, "other.ipynb")
    assert before["kernel"] == dead_kernel and now["kernel"] == calls.kernel_record()
    assert "orphaned_at" not in (registry.read(path) or {})
    # This process drives it now: the reaper does not end it when the old keep time is up, and
    # another claim (here: this very kernel's again) is refused naming the notebook.
    with pytest.raises(DtworkError, match=r"driven by notebook other.ipynb .*one notebook drives"):
        kept.claim("dtwork-1-keep02", "third.ipynb")
    kept.release(before)  # an attach that failed: the old driver again, its time running on
    until(lambda: sleeper.poll() is not None, "given back, the cluster ends when its time is up")


def test_only_a_kept_cluster_can_be_attached_and_none_is_said_in_one_line(
    home: Path, sleeper: subprocess.Popen[bytes], dead_kernel: dict[str, Any]
) -> None:
    with pytest.raises(DtworkError, match="no kept cluster on this host.*--keep"):
        kept.claim(None, None)
    register("dtwork-1-keep03", dead_kernel, sleeper, keep=0)
    with pytest.raises(DtworkError, match="is not kept"):
        kept.claim("dtwork-1-keep03", None)
    with pytest.raises(DtworkError, match="no cluster dtwork-1-nope on this host"):
        kept.claim("dtwork-1-nope", None)


def test_the_configs_keep_time_is_the_starts_unless_keep_says(home: Path) -> None:
    from dtwork.cluster import Cluster

    assert Cluster(2, backend="gloo", config={"keep": "30m"}).engines.spec.keep_seconds == 1800
    assert Cluster(2, backend="gloo", config={"keep": "30m"}, keep="2h").engines.spec.keep_seconds == 7200
    assert Cluster(2, backend="gloo").engines.spec.keep_seconds is None
    with pytest.raises(DtworkError, match="keep time 'soon' is not a duration"):
        Cluster(2, backend="gloo", keep="soon")


RANK = """
import json, time
from dtwork.runtime import entry
print(entry.serve_stacks("tok", "127.0.0.1"), flush=True)
deadline = time.monotonic() + 60
while entry._driver["kernel"] is None and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps(entry._driver["kernel"]), flush=True)
"""


def test_a_kernel_attaching_while_a_cell_runs_is_told_to_the_ranks_on_their_side_channel() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rank = subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert rank.stdout is not None
        port = int(rank.stdout.readline())
        me = calls.kernel_record()
        rank_stacks.tell_driver(rank_stacks.StackChannels("tok", {0: ("127.0.0.1", port)}), me)
        assert json.loads(rank.stdout.readline()) == me  # it watches this kernel now, not the dead one
    finally:
        rank.kill()
        rank.wait()
