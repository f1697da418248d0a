"""What a user of the Python API sees: rank 0's warnings once, ctx in functions, the step's batch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest

from dtwork.errors import DtworkError, DtworkWarning


def test_an_uneven_global_batch_warns_once_in_the_kernel_and_the_cluster_shows_the_batch_used(
    fresh_run,
) -> None:
    c = fresh_run
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        c.configure({"global_batch_size": 65})
    mine = [str(w.message) for w in seen if w.category is DtworkWarning]
    assert mine == [
        "global batch 65 does not divide over 2 slots: 32 per slot, 1 example(s) per step dropped "
        "(effective global batch 64)"
    ]
    assert c.global_batch_size == 64
    assert c.run(lambda ctx: ctx.global_batch_size) == [64, 64]


def test_cluster_run_hands_ctx_to_a_function_that_takes_it(cluster) -> None:
    def shifted(x: int, ctx: object) -> int:
        return x + ctx.rank  # type: ignore[attr-defined]

    assert cluster.run(lambda ctx: ctx.rank) == [0, 1]
    assert cluster.run(lambda c, x: c.world_size * x, 3) == [6, 6]
    assert cluster.run(shifted, 10) == [10, 11]
    assert cluster.run(lambda: __import__("dtwork").ctx().rank) == [0, 1]
    assert cluster.run(lambda: __import__("dtwork").ctx.rank) == [0, 1]


def test_dtwork_ctx_is_a_ranks_ctx_and_says_so_in_the_kernel(cluster) -> None:
    import dtwork

    def sizes() -> tuple[int, int]:
        return dtwork.ctx.rank, dtwork.ctx.world_size

    assert cluster.run(sizes) == [(0, 2), (1, 2)]
    with pytest.raises(DtworkError, match=r"dtwork.ctx exists on the ranks only: use it in a %%dtrain cell"):
        dtwork.ctx.rank  # noqa: B018
    assert cluster.run(lambda x=1: x) == [1, 1]  # takes no ctx: called as given


def test_errors_raised_to_a_script_are_plain_text(state_dir) -> None:
    script = (
        "import dtwork\n"
        "c = dtwork.start(n=2, backend='gloo', timeout=60)\n"
        "try:\n"
        "    c.run(\"raise ValueError('plain text please')\", quiet=True)\n"
        "except dtwork.RankFailure as exc:\n"
        "    print(str(exc))\n"
        "finally:\n"
        "    c.stop()\n"
    )
    env = {**os.environ, "DTWORK_STORE": str(state_dir / "script.sqlite")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert "dtwork: the cell failed on rank 0" in out.stdout
    assert "ValueError: plain text please" in out.stdout
    assert "\x1b[" not in out.stdout and not re.search(r"^\[\d+:execute\]", out.stdout, re.M), out.stdout
