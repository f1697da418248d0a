"""A re-run is a fresh launch: edited modules, torch's settings, singletons, atexit, cell reloads.

The shared 2-rank gloo cluster runs the scripts; torchrun runs the same files as the reference.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from torchrun_ref import torchrun

TRAIN = """\
import sys, torch, torch.distributed as dist
from model import build, SCALE

dist.init_process_group("gloo")
net = torch.nn.parallel.DistributedDataParallel(build())
opt = torch.optim.SGD(net.parameters(), lr=0.1)
g = torch.Generator().manual_seed(dist.get_rank())
for _ in range(5):
    loss = (net(torch.randn(8, 4, generator=g)) * SCALE).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
if dist.get_rank() == 0:
    torch.save(net.module.state_dict(), sys.argv[1])
dist.destroy_process_group()
"""


def _model(scale: float, width: int) -> str:
    return (
        "import torch\n\n"
        f"SCALE = {scale}\n\n\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        f"    return torch.nn.Sequential(torch.nn.Linear(4, {width}), torch.nn.Tanh(), torch.nn.Linear({width}, 1))\n"
    )


EDITED = _model(0.5, 16)  # the model as torchrun runs it


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """torchrun's weights for the edited model (one launch for the module)."""
    folder = tmp_path_factory.mktemp("torchrun")
    (folder / "train.py").write_text(TRAIN)
    (folder / "model.py").write_text(EDITED)
    torchrun(folder / "train.py", [str(folder / "ref.pt")], folder)
    return _weights(folder / "ref.pt")


def _weights(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=True)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].equal(b[k]) for k in a)


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_an_edited_module_is_imported_afresh(ip: Any, tmp_path: Path, reference: dict[str, Any]) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "model.py").write_text(_model(1.0, 8))
    ip.run_line_magic("dtrain", f"run {tmp_path / 'train.py'} {tmp_path / 'before.pt'}")
    (tmp_path / "model.py").write_text(EDITED)
    ip.run_line_magic("dtrain", f"run {tmp_path / 'train.py'} {tmp_path / 'magic.pt'}")
    ip.run_cell_magic("dtrain", "", f"%run {tmp_path / 'train.py'} {tmp_path / 'cell.pt'}\n")
    assert not _same(_weights(tmp_path / "before.pt"), reference)
    assert _same(_weights(tmp_path / "magic.pt"), reference)
    assert _same(_weights(tmp_path / "cell.pt"), reference)


def test_torch_settings_do_not_leak_into_the_next_script(
    ip: Any, cluster: Any, tmp_path: Path, reference: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    def now() -> tuple[Any, ...]:
        import logging
        import os

        dtype, det = torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled()
        root = logging.getLogger()
        return (
            dtype,
            det,
            torch.get_num_threads(),
            "PL_GLOBAL_SEED" in os.environ,
            root.level,
            len(root.handlers),
        )

    before = cluster.run(now)
    (tmp_path / "settings.py").write_text(
        "import torch\n"
        "torch.set_default_dtype(torch.float64)\n"
        "torch.use_deterministic_algorithms(True)\n"
        "torch.set_num_threads(2)\n"
        "import os\n"
        "os.environ['PL_GLOBAL_SEED'] = '7'\n"
        "import logging\n"
        "logging.basicConfig(level=logging.DEBUG)\n"
    )
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "model.py").write_text(EDITED)
    ip.run_line_magic("dtrain", f"run {tmp_path / 'settings.py'}")
    out = capsys.readouterr().out
    line = "dtwork: settings.py changed torch's default dtype (torch.float64), deterministic algorithms (True), threads (2)"
    assert line in out, out
    ip.run_line_magic("dtrain", f"run {tmp_path / 'train.py'} {tmp_path / 'after.pt'}")
    assert _same(_weights(tmp_path / "after.pt"), reference)
    assert "changed torch's" not in capsys.readouterr().out  # the training script changed nothing

    assert cluster.run(now) == before  # cells too: nothing of the script's settings stayed
    assert {b[:4] for b in before} == {(torch.float32, False, before[0][2], False)}


ACCELERATE = """\
import sys, torch, torch.nn.functional as F
from accelerate import Accelerator

accelerator = Accelerator(cpu=True, mixed_precision=sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
loader = torch.utils.data.DataLoader(data, batch_size=8)
model, opt, loader = accelerator.prepare(model, opt, loader)
for x, y in loader:
    with accelerator.autocast():
        loss = F.mse_loss(model(x), y)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
if accelerator.is_main_process:
    torch.save(accelerator.unwrap_model(model).state_dict(), sys.argv[2])
accelerator.end_training()
"""


def test_accelerate_changes_mixed_precision_between_runs(cluster: Any, tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="accelerate is not installed (pip install accelerate)")
    script = tmp_path / "acc.py"
    script.write_text(ACCELERATE)
    for mp in ("no", "bf16"):
        torchrun(script, [mp, str(tmp_path / f"ref-{mp}.pt")], tmp_path)
        cluster.run_script(script, [mp, str(tmp_path / f"warm-{mp}.pt")])
    assert not _same(_weights(tmp_path / "ref-no.pt"), _weights(tmp_path / "ref-bf16.pt"))  # bf16 did act
    for mp in ("no", "bf16"):
        assert _same(_weights(tmp_path / f"warm-{mp}.pt"), _weights(tmp_path / f"ref-{mp}.pt")), mp


def test_atexit_callbacks_run_when_the_script_ends(cluster: Any, tmp_path: Path) -> None:
    script = tmp_path / "flush.py"
    script.write_text(
        textwrap.dedent(f"""\
        import atexit, os
        rank = os.environ["RANK"]
        atexit.register(lambda: open({str(tmp_path)!r} + f"/flushed-{{rank}}", "w").write(rank))
        def never():
            open({str(tmp_path)!r} + "/never", "w").write(rank)
        atexit.register(never)
        atexit.unregister(never)
        """)
    )
    cluster.run_script(script)
    assert sorted(p.name for p in tmp_path.glob("flushed-*")) == ["flushed-0", "flushed-1"]
    assert not (tmp_path / "never").exists()


def test_cells_reload_an_edited_helper(
    ip: Any, cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the notebook's folder
    helper = tmp_path / "dtw_helper.py"
    helper.write_text(
        "class Scale:\n    def f(self, x):\n        return x * 2\n\n\ndef g(x):\n    return x + 1\n"
    )
    ip.run_cell_magic(
        "dtrain",
        "",
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "import dtw_helper\nfrom dtw_helper import g\nold = dtw_helper.Scale()\na = (old.f(3), g(3))\n",
    )
    capsys.readouterr()
    helper.write_text(
        "class Scale:\n    def f(self, x):\n        return x * 30\n\n\ndef g(x):\n    return x + 100\n"
    )
    ip.run_cell_magic("dtrain", "", "b = (dtw_helper.Scale().f(3), g(3), old.f(3))\n")
    assert "dtwork: reloaded dtw_helper" in capsys.readouterr().out
    assert cluster.pull("a") == [(6, 4)] * 2
    assert cluster.pull("b") == [(90, 103, 90)] * 2  # the object built before works, with the new code
    ip.run_line_magic("dtrain", "autoreload off")
    helper.write_text("class Scale:\n    def f(self, x):\n        return 0\n\n\ndef g(x):\n    return 0\n")
    try:
        ip.run_cell_magic("dtrain", "", "c = g(3)\n")
    finally:
        ip.run_line_magic("dtrain", "autoreload on")
    assert cluster.pull("c") == [103, 103]
    assert "reloaded" not in capsys.readouterr().out


def test_torch_frames_are_folded_and_kept_in_the_engine_log(cluster: Any) -> None:
    from dtwork.errors import RankFailure

    cell = "import torch\nnet = torch.nn.Sequential(torch.nn.Linear(4, 2))\nnet(torch.ones(3, 3))\n"
    with pytest.raises(RankFailure) as info:
        cluster.run(cell)
    lines = _plain(str(info.value)).splitlines()
    assert "----> 3 net(torch.ones(3, 3))" in lines[:5], lines
    folded = [ln for ln in lines if "frames inside torch" in ln]
    assert folded == ["    [... 6 frames inside torch]"], lines  # module.py, container.py, linear.py
    assert not any("module.py" in ln for ln in lines)
    assert f"(the whole traceback: {cluster.log_file})" in lines
    assert "in Linear.forward(self, input)" in cluster.log_file.read_text()


def test_a_singleton_that_refuses_a_change_in_cells_names_restart(cluster: Any) -> None:
    pytest.importorskip("accelerate", reason="accelerate is not installed (pip install accelerate)")
    from dtwork.errors import RankFailure

    cluster.run("from accelerate import Accelerator\nfirst = Accelerator(cpu=True, mixed_precision='no')\n")
    try:
        with pytest.raises(RankFailure) as info:
            cluster.run("second = Accelerator(cpu=True, mixed_precision='bf16')\n")
        text = _plain(str(info.value))
        assert "AcceleratorState has already been initialized" in text
        assert "dtwork: %dtrain restart gives every rank a new process" in text, text
    finally:
        cluster.run("from accelerate.state import AcceleratorState\nAcceleratorState._reset_state(True)\n")
