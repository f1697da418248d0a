"""Debugging ranks as a notebook does it: a real kernel through jupyter_client, its stdin channel
answering pdb's prompts (the notebook's input box), 2 real gloo ranks.

``breakpoint()`` on a rank, ``%dtrain debug`` after a rank's error, and ``%dtrain stacks`` on a
hang, each driven the way JupyterLab drives a kernel: execute requests with ``allow_stdin``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_kernel import Notebook

STALL = 5.0  # the watchdog's limit in this kernel: a prompt held longer must raise no alarm


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Notebook]:
    nb = Notebook(tmp_path_factory.mktemp("debug-kernel"))
    nb.run("%load_ext dtwork\n%dtrain start -n 2 --backend gloo --timeout 120")
    nb.run(f"from dtwork.cluster import current\ncurrent().session.stall_seconds = {STALL}")
    yield nb
    nb.close()


class Typist:
    """Types its lines at the prompts, in order, recording each prompt; ``hold`` seconds at the
    prompt before ``hold_before`` (a researcher reading the locals)."""

    def __init__(self, lines: list[str], hold: float = 0.0, hold_before: str = "") -> None:
        self.lines, self.prompts = iter(lines), list[str]()
        self.hold, self.hold_before = hold, hold_before

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        line = next(self.lines)
        if line == self.hold_before:
            time.sleep(self.hold)  # a lower bound on the time at the prompt, not a wait for something
        return line


# Rank 1 stops; rank 0 meanwhile waits in the all_reduce; after c, rank 1 takes a moment more
# before joining it (when the watchdog would look again, were the prompt's time counted).
BREAK = """%%dtrain
import time, torch, torch.distributed as dist
x = 40 + ctx.rank
if ctx.rank == 1:
    breakpoint()
    time.sleep(1.0)
t = torch.ones(1)
dist.all_reduce(t)
done = (x, float(t))
"""


def test_breakpoint_on_rank_1_shows_a_local_and_c_finishes_both_ranks_with_no_hang_alarm(
    notebook: Notebook,
) -> None:
    typist = Typist(["p x + 1", "c"], hold=STALL + 1, hold_before="c")
    out = notebook.run(BREAK, typist)
    assert typist.prompts == ["(rank 1 pdb) "] * 2, out
    assert "rank 1 stopped at breakpoint() at cell line 4" in out and "\n42\n" in out, out
    assert "no progress" not in out, out
    assert "[(40, 2.0), (41, 2.0)]" in notebook.run("print(current().pull('done'))")


def test_n_steps_to_the_cells_next_line_not_into_ipython(notebook: Notebook) -> None:
    """IPython runs each top-level statement as its own code: ``n`` still goes to the next line."""
    cell = "%%dtrain --ranks 1\nx = 1\nbreakpoint()\ny = x + 1\nz = y * 10\n"
    typist = Typist(["n", "p y", "n"])
    out = notebook.run(cell, typist)
    assert typist.prompts == ["(rank 1 pdb) "] * 3, out  # the last n went past the cell's end
    first, *after = out.split("-> y = x + 1")  # where it stopped first: the line after breakpoint()
    assert after and "-> z = y * 10" in after[0] and "\n2\n" in after[0], out
    assert "interactiveshell.py" not in out and "--Return--" not in out and "--Call--" not in out, out
    # ...and traces no more: the next cell runs without a stop.
    notebook.run("%%dtrain --ranks 1\nw = 3\nv = w + 1\n")


def test_a_breakpoint_in_a_background_cell_is_prompted_at_wait(notebook: Notebook) -> None:
    out = notebook.run(BREAK.replace("%%dtrain", "%%dtrain --bg"))
    typist = Typist(["p x", "c"])
    out += notebook.run("%dtrain wait", typist)
    assert typist.prompts == ["(rank 1 pdb) "] * 2, out
    assert "\n41\n" in out and "no progress" not in out, out
    assert "[(40, 2.0), (41, 2.0)]" in notebook.run("print(current().pull('done'))")


def test_debug_after_a_rank_1_error_shows_a_local_and_q_returns_and_the_next_cell_runs(
    notebook: Notebook,
) -> None:
    failing = "%%dtrain\nhere = 40 + ctx.rank\nif ctx.rank == 1:\n    raise ValueError('boom')\n"
    with pytest.raises(AssertionError, match="ValueError"):
        notebook.run(failing)
    typist = Typist(["p here + 1", "up", "q"])
    out = notebook.run("%dtrain debug 1", typist)
    assert typist.prompts == ["(rank 1 pdb) "] * 3, out
    assert "ValueError: boom" in out and "\n42\n" in out, out
    notebook.run("%%dtrain\nafter = ctx.rank")
    assert "[0, 1]" in notebook.run("print(current().pull('after'))")


HANG = """%%dtrain
import os, time, torch, torch.distributed as dist
if ctx.rank == 1:
    dist.all_reduce(torch.ones(2))
else:
    while not os.path.exists(RELEASE):
        time.sleep(0.02)
    dist.all_reduce(torch.ones(2))
"""


def test_stacks_name_the_hung_ranks_lines_and_a_hung_cell_shows_them_by_itself(
    notebook: Notebook, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    cell = HANG.replace("RELEASE", repr(str(release)))
    notebook.run(cell.replace("%%dtrain", "%%dtrain --bg"))
    hung, waiting = "rank 1: all_reduce float32[2] at cell line 3", "rank 0: cell line 6"
    # Each rank begins the cell in its own time on a busy machine (rank 0 may still be in IPython's
    # run_cell before its first line): wait until both are where the cell holds them.
    deadline = time.monotonic() + 120
    try:
        while True:
            t0 = time.monotonic()
            out = notebook.run("%dtrain stacks")
            took = time.monotonic() - t0
            if (hung in out and waiting in out) or time.monotonic() > deadline:
                break
        assert took < 5 + 5, out  # the target is 5 s; a busy machine gets as much again
        assert hung in out and waiting in out, out
    finally:
        release.touch()  # a failed check must not leave the cluster hung for the next test
        notebook.run("%dtrain wait")
    release.unlink()
    # In the foreground the watchdog shows the same stacks by itself (after STALL seconds); the
    # test lets rank 0 go once they are out, as a researcher would after reading them.
    out = notebook.run(cell, heard=lambda text: release.touch() if "at cell line 3" in text else None)
    assert (
        "rank 1 waits in a collective that rank 0 did not reach" in out
        and "rank 1: all_reduce float32[2] at cell line 3" in out
    ), out


MISMATCH = """%%dtrain
import torch, torch.distributed as dist
if ctx.rank == 0:
    dist.all_reduce(torch.ones(4))
else:
    x = 1
    dist.all_reduce(torch.ones(3))
"""


def test_mismatched_collectives_fail_in_one_error_naming_both_shapes_and_lines(notebook: Notebook) -> None:
    notebook.run("%dtrain collectives on")
    try:
        with pytest.raises(AssertionError) as failed:
            notebook.run(MISMATCH)
    finally:
        notebook.run("%dtrain collectives off")
    assert re.search(
        r"mismatched collectives \(the group's collective #\d+\): "
        r"rank 0 all_reduce float\[4\] at cell line 3; rank 1 all_reduce float\[3\] at cell line 6",
        str(failed.value),
    ), failed.value
    notebook.run("%%dtrain\nafter = ctx.rank")
    assert "[0, 1]" in notebook.run("print(current().pull('after'))")
