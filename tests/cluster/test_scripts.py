"""Bring your own code: torchrun-style scripts on the warm ranks (%dtrain run, %run in %%dtrain).

The shared 2-rank gloo cluster runs the scripts; torchrun runs the same files as the reference.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from torchrun_ref import torchrun

from dtwork.errors import RankFailure

TUTORIAL = Path(__file__).parents[1] / "fixtures" / "ddp_tutorial.py"


def _params(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=True)


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] - b[k]).abs().max().item() <= 1e-6, k


def _tutorial_args(run: int, folder: Path) -> list[str]:
    """First run: 2 epochs; second run: resumes from its snapshot and trains to 4."""
    epochs = "2" if run == 0 else "4"
    return [epochs, "1", "--snapshot", str(folder / "snapshot.pt"), "--out", str(folder / "final.pt")]


def test_tutorial_runs_twice_like_torchrun(
    ip: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, magic, run = tmp_path / "torchrun", tmp_path / "dtrain-run", tmp_path / "percent-run"
    for folder in (ref, magic, run):
        folder.mkdir()
    for i in range(2):
        torchrun(TUTORIAL, _tutorial_args(i, ref), ref)
        ip.run_line_magic("dtrain", f"run {TUTORIAL} {' '.join(_tutorial_args(i, magic))}")
        ip.run_cell_magic("dtrain", "", f"%run {TUTORIAL} {' '.join(_tutorial_args(i, run))}\n")
    out = capsys.readouterr().out
    assert "[rank 1] Resuming training from snapshot at Epoch 2" in out
    assert "[rank 0] Epoch 4 | Training snapshot saved" in out
    expected = _params(ref / "final.pt")
    _assert_same(_params(magic / "final.pt"), expected)
    _assert_same(_params(run / "final.pt"), expected)


def test_the_script_sees_torchrun_and_leaves_no_trace(cluster: Any, tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    script.write_text(
        "import os, sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo', init_method='env://')\n"
        "keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK',\n"
        "        'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RUN_ID']\n"
        "seen = {k: os.environ[k] for k in keys}\n"
        "seen.update(argv=sys.argv[1:], name=__name__, cwd=os.getcwd(), rank=dist.get_rank())\n"
        "os.chdir('/')\n"
        "dist.destroy_process_group()\n"
    )
    cluster.run_script(script, ["--lr", "0.1"])
    seen = cluster.pull("seen")
    assert [s["rank"] for s in seen] == [0, 1]
    assert [s["RANK"] for s in seen] == ["0", "1"] and [s["LOCAL_RANK"] for s in seen] == ["0", "1"]
    assert {s["WORLD_SIZE"] for s in seen} == {"2"} and {s["LOCAL_WORLD_SIZE"] for s in seen} == {"2"}
    assert {s["GROUP_RANK"] for s in seen} == {"0"}
    assert {s["TORCHELASTIC_RUN_ID"] for s in seen} == {cluster.cluster_id}
    assert {s["MASTER_PORT"] for s in seen} == {str(cluster.master_port)}
    assert {s["name"] for s in seen} == {"__main__"}
    assert [s["argv"] for s in seen] == [["--lr", "0.1"]] * 2

    def after() -> tuple[Any, ...]:

        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)  # the warm group outlived the script's destroy_process_group
        patched = dist.init_process_group.__module__ != "torch.distributed.distributed_c10d"
        return (
            os.getcwd(),
            sys.argv[0] == str(script),
            patched,
            float(t),
            "TORCHELASTIC_RUN_ID" in os.environ,
        )

    assert cluster.run(after) == [(seen[0]["cwd"], False, False, 2.0, False)] * 2


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("dist.init_process_group('mpi')", "asks for the mpi backend, but dtwork's warm group uses gloo"),
        ("dist.init_process_group('gloo', world_size=4, rank=0)", "asks for rank 0 of world size 4"),
    ],
)
def test_an_incompatible_init_is_refused(cluster: Any, tmp_path: Path, call: str, message: str) -> None:
    script = tmp_path / "bad_init.py"
    script.write_text(f"import torch.distributed as dist\n{call}\n")
    with pytest.raises(RankFailure, match=message):
        cluster.run_script(script)
    assert cluster.run(lambda: 1) == [1, 1]


@pytest.mark.parametrize("how", ["magic", "percent-run"])
def test_a_script_that_raises_fails_the_cell_naming_the_rank(
    ip: Any, cluster: Any, tmp_path: Path, how: str
) -> None:
    script = tmp_path / "boom.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise ValueError('boom on one')\n"
        "dist.all_reduce(torch.ones(1))\n"
    )
    with pytest.raises(RankFailure) as info:
        if how == "magic":
            ip.run_line_magic("dtrain", f"run {script}")
        else:
            ip.run_cell_magic("dtrain", "", f"%run {script}\n")
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(info.value))  # IPython colours the traceback
    assert "failed on rank 1" in text and "ValueError: boom on one" in text
    assert text.count("ValueError: boom on one") == 1 and text.count("Traceback") <= 1
    assert "boom.py" in text, text  # the script's own frame is in the traceback
    assert "raise ValueError('boom on one')" in "\n".join(text.splitlines()[:5]), text  # and comes first
    cluster.run("import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)")
    assert [float(t) for t in cluster.pull("t")] == [2.0, 2.0]  # the group works again


def test_sys_exit(cluster: Any, tmp_path: Path) -> None:
    pids = cluster.run(os.getpid)
    ok = tmp_path / "exit0.py"
    ok.write_text("import sys\nreached = 'before'\nsys.exit(0)\nreached = 'after'\n")
    cluster.run_script(ok)
    assert cluster.pull("reached") == ["before", "before"]
    bad = tmp_path / "exit3.py"
    bad.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(RankFailure, match=r"exit3.py called sys.exit\(3\)"):
        cluster.run_script(bad)
    assert cluster.run(os.getpid) == pids  # the engines stayed up


@pytest.mark.parametrize(
    ("package", "fixture", "kind"),
    [
        ("accelerate", "accelerate_train.py", "DistributedType.MULTI_CPU"),
        ("lightning", "fabric_train.py", "DDPStrategy"),
    ],
)
@pytest.mark.parametrize("how", ["script", "cell"])
def test_accelerate_and_fabric_train_on_the_warm_group(
    cluster: Any, package: str, fixture: str, kind: str, how: str
) -> None:
    pytest.importorskip(package, reason=f"{package} is not installed (pip install {package})")
    path = Path(__file__).parents[1] / "fixtures" / fixture
    if how == "script":
        cluster.run_script(path)
    else:
        cluster.run(path.read_text())
    facts = cluster.pull("facts")
    assert [f["index"] for f in facts] == [0, 1]
    assert all(f["type"] == kind and f["processes"] == 2 and f["steps"] == 4 for f in facts), facts
    assert all(f["same_group"] for f in facts)  # no group of its own: dtwork's warm one
    first, second = cluster.pull("weights")
    assert (first - second).abs().max().item() == 0.0  # DDP kept the ranks in step

    def group_works() -> float:
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t)

    assert cluster.run(group_works) == [2.0, 2.0]  # end_training's destroy left the group alive


def test_launchers_that_start_processes_are_refused(cluster: Any) -> None:
    pytest.importorskip("lightning", reason="lightning is not installed (pip install lightning)")
    cell = (
        "from lightning.fabric import Fabric\n"
        "Fabric(accelerator='cpu', strategy='ddp_spawn', devices=2).launch(lambda fabric: 1)\n"
    )
    with pytest.raises(RankFailure, match="every dtwork rank already is one process of the group"):
        cluster.run(cell)
    assert cluster.run(lambda: 1) == [1, 1]


def test_run_needs_a_script_and_takes_no_ipython_options(ip: Any, tmp_path: Path) -> None:
    from dtwork.errors import DtworkError

    with pytest.raises(DtworkError, match=r"%dtrain run needs a script: %dtrain run SCRIPT.py \[ARGS...\]"):
        ip.run_line_magic("dtrain", "run")
    script = tmp_path / "x.py"
    script.write_text("x = 1\n")
    with pytest.raises(RankFailure, match="on dtwork's ranks %run takes SCRIPT.py"):
        ip.run_cell_magic("dtrain", "", f"%run -i {script}\n")
    with pytest.raises(RankFailure, match="no script at nowhere.py"):
        ip.run_line_magic("dtrain", "run nowhere.py")
