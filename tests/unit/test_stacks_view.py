"""Rank stacks as the notebook shows them, and mismatched collectives named: no engines."""

from __future__ import annotations

from pathlib import Path

from dtwork.kernel.stacks import RankStacks
from dtwork.kernel.tracebacks import collective_mismatch

PLUMBING = {
    "file": "/py/site-packages/ipykernel/kernelbase.py",
    "line": 9,
    "function": "run",
    "code": "",
    "cell": None,
}
TORCH = {
    "file": "/py/site-packages/torch/distributed/distributed_c10d.py",
    "line": 3,
    "function": "all_reduce",
    "code": "w.wait()",
    "cell": None,
}


def cell(line: int, code: str) -> dict[str, object]:
    return {
        "file": "/tmp/ipykernel_1/5.py",
        "line": line,
        "function": "<module>",
        "code": code,
        "cell": "In[5]",
    }


def snap(*frames: dict[str, object], collective: dict[str, object] | None = None) -> dict[str, object]:
    main = {"name": "MainThread", "main": True, "frames": [PLUMBING, *frames], "collective": collective}
    idle = {"name": "IOPub", "main": False, "frames": [PLUMBING], "collective": None}
    return {"pid": 1, "in_cell": True, "threads": [main, idle]}


def test_ranks_with_the_same_stack_are_grouped_with_their_collective_and_cell_line() -> None:
    waiting = snap(
        cell(7, "dist.all_reduce(t)"), TORCH, collective={"op": "all_reduce", "tensor": "float32[4]"}
    )
    stacks = RankStacks(
        {0: waiting, 1: snap(cell(12, "time.sleep(1)")), 2: waiting, 3: "no answer within 3 s"}
    )
    assert stacks.summary() == (
        "ranks 0,2: all_reduce float32[4] at cell line 7; rank 1: cell line 12; rank 3: no answer (no answer within 3 s)"
    )
    assert stacks.waiting() == [0, 2]
    text = stacks.text()
    assert "    cell line 7: dist.all_reduce(t)\n    [... 1 frame inside torch]\n" in text
    assert "kernelbase" not in text and "(3 threads of ipykernel, ipyparallel and dtwork not shown" in text
    assert "IOPub" in stacks.text(all_threads=True)


def test_a_rank_between_cells_is_idle() -> None:
    assert (
        RankStacks({0: {"pid": 1, "in_cell": False, "threads": []}}).summary()
        == "rank 0: idle (no cell running)"
    )


def test_mismatched_collectives_are_named_with_each_rank_s_op_shape_and_line() -> None:
    def fp(rank: int, shape: str) -> str:
        return f"Rank {rank} is running collective: CollectiveFingerPrint(SequenceNumber=5, OpType=ALLREDUCE, TensorShape={shape}, TensorDtypes=Float, X)"

    errors: dict[int, BaseException] = {
        0: RuntimeError(
            f"Detected mismatch between collectives on ranks. {fp(0, '[4]')}, but {fp(1, '[3]')}"
        ),
        1: RuntimeError(
            f"Detected mismatch between collectives on ranks. {fp(1, '[3]')}, but {fp(0, '[4]')}"
        ),
    }
    found = collective_mismatch(errors)
    assert found == (
        "mismatched collectives (the group's collective #5): rank 0 all_reduce float[4]; rank 1 all_reduce float[3]",
        [0, 1],
    )
    assert collective_mismatch({0: RuntimeError("other")}) is None


def test_a_collective_is_numbered_in_its_group_and_a_sub_group_is_named(tmp_path: Path) -> None:
    """Ranks at different numbers of one group wait in different collectives: the number comes
    from torch's count for the group the call names (one real gloo process here)."""
    import subprocess
    import sys

    code = f"""
import sys, torch, torch.distributed as dist
from dtwork.runtime.debug.stacks import collective
dist.init_process_group("gloo", init_method="file://{tmp_path / "rdv"}", rank=0, world_size=1)
sub = dist.new_group([0])
dist.all_reduce(torch.ones(1)); dist.all_reduce(torch.ones(1))
def all_reduce(tensor, group=None):  # where distributed_c10d's frame would be
    return sys._getframe()
all_reduce.__code__ = all_reduce.__code__.replace(co_filename=dist.distributed_c10d.__file__)
print(collective(all_reduce(torch.ones(2))), flush=True)
print(collective(all_reduce(torch.ones(2), group=sub)), flush=True)
dist.destroy_process_group()
"""
    # Read what it printed whatever its exit: torch's gloo teardown now and then aborts the process
    # at exit ("terminate called without an active exception"), after the lines are out.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    printed = [line for line in out.stdout.splitlines() if line.startswith("{")]
    default, in_sub = printed[-2:] if len(printed) >= 2 else (out.stdout + out.stderr, "")
    assert default == "{'op': 'all_reduce', 'tensor': 'float32[2]', 'group': None, 'seq': 2}", default
    assert in_sub.startswith("{'op': 'all_reduce', 'tensor': 'float32[2]', 'group': '1', 'seq': "), in_sub
