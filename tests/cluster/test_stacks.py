"""Seeing inside hung ranks: every rank's stack while one waits in a collective the other never reaches."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

# Rank 1 waits in an all_reduce (line 3) while rank 0 waits for a file (line 7) and only then joins it.
HANG = """import os, time, torch, torch.distributed as dist
if ctx.rank == 1:
    dist.all_reduce(torch.ones(2))
else:
    deadline = time.time() + 40
    while not os.path.exists(RELEASE) and time.time() < deadline:
        time.sleep(0.02)
    dist.all_reduce(torch.ones(2))
"""


def _hang(release: Path) -> str:
    return HANG.replace("RELEASE", repr(str(release)))


def test_stacks_name_each_rank_s_line_and_collective_while_one_hangs(
    ip: Any, tmp_path: Path, capsys: Any
) -> None:
    from dtwork import cluster as clusters

    cluster = clusters.current()
    release = tmp_path / "release"
    cluster.run(_hang(release), bg=True, quiet=True)
    try:
        deadline = time.monotonic() + 30  # the cell reaches its lines (a loaded machine may take seconds)
        while time.monotonic() < deadline and cluster.stacks().waiting() != [1]:
            time.sleep(0.1)
        capsys.readouterr()
        t0 = time.monotonic()
        ip.run_line_magic("dtrain", "stacks")
        took = time.monotonic() - t0
        out = capsys.readouterr().out
    finally:
        release.touch()
        result = cluster.session.wait_background()
    assert took < 30, f"%dtrain stacks took {took:.1f} s"  # the hung cell would hold it for good
    assert "rank 0: cell line 7\n" in out, out
    assert re.search(r"rank 1: all_reduce float32\[2\] at cell line 3, collective #\d+\n", out), out
    assert "    cell line 3: dist.all_reduce(torch.ones(2))" in out, out
    assert result is not None and result.ok


def test_a_hung_foreground_cell_shows_the_stacks_by_itself(cluster: Any, tmp_path: Path, capsys: Any) -> None:
    release = tmp_path / "release"
    shown = threading.Event()
    event = cluster.session.event

    def on_event(kind: str, message: str, data: Any = None) -> None:
        event(kind, message, data)
        if kind == "stacks":  # what the notebook has just shown lets rank 0 go on
            shown.set()
            release.touch()

    cluster.session.event = on_event
    cluster.session.stall_seconds = 2.0
    t0 = time.monotonic()
    try:
        result = cluster.run(_hang(release), quiet=True)
    finally:
        cluster.session.stall_seconds = 60.0
        del cluster.session.event
    err = capsys.readouterr().err
    assert shown.is_set(), f"no stacks shown by the hang detector: {err}"
    assert time.monotonic() - t0 < 60
    assert (
        "dtwork: no progress for" in err and "rank 1 waits in a collective that rank 0 did not reach" in err
    )
    assert "rank 0: cell line 7\n" in err, err
    assert re.search(r"rank 1: all_reduce float32\[2\] at cell line 3, collective #\d+\n", err), err
    assert result.ok


MISMATCH = """import torch, torch.distributed as dist
if ctx.rank == 0:
    dist.all_reduce(torch.ones(4))
else:
    x = 1
    dist.all_reduce(torch.ones(3))
"""


def test_mismatched_collectives_fail_at_once_naming_each_rank_s_shape_and_line(ip: Any, capsys: Any) -> None:
    from dtwork import cluster as clusters
    from dtwork.errors import RankFailure

    cluster = clusters.current()
    ip.run_line_magic("dtrain", "collectives on")
    try:
        t0 = time.monotonic()
        try:
            cluster.run(MISMATCH, quiet=True)
        except RankFailure as exc:
            failure = str(exc)
        else:
            raise AssertionError("the mismatched collectives did not fail")
        took = time.monotonic() - t0
    finally:
        ip.run_line_magic("dtrain", "collectives off")
    assert "collectives are checked" in capsys.readouterr().out
    assert took < 30, f"the mismatch took {took:.0f} s to fail (the group's timeout is 60 s)"
    first = failure.splitlines()[0]
    assert re.search(
        r"mismatched collectives \(the group's collective #\d+\): "
        r"rank 0 all_reduce float\[4\] at cell line 3; rank 1 all_reduce float\[3\] at cell line 6$",
        first,
    ), failure
    assert "rank 1: the same mismatch" in failure
    cluster.run("after = ctx.rank", quiet=True)
    assert cluster.pull("after") == [0, 1]


def test_debug_prints_a_rank_s_local_and_returns_and_the_next_cell_runs(
    ip: Any, capsys: Any, monkeypatch: Any
) -> None:
    from dtwork import cluster as clusters
    from dtwork.errors import RankFailure

    cluster = clusters.current()
    try:
        cluster.run("here = 40 + ctx.rank\nif ctx.rank == 1:\n    raise ValueError('boom')\n", quiet=True)
    except RankFailure:
        pass
    typed = iter(["p here + 1", "up", "q"])
    prompts: list[str] = []

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return next(typed)

    monkeypatch.setattr("builtins.input", reply)
    capsys.readouterr()
    ip.run_line_magic("dtrain", "debug 1")
    out = capsys.readouterr().out
    assert prompts == ["(rank 1 pdb) "] * 3
    assert "ValueError: boom" in out and "\n42\n" in out, out
    cluster.run("after = ctx.rank", quiet=True)
    assert cluster.pull("after") == [0, 1]
