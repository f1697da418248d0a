"""One step axis per run (issue 33, item 3): a later cell that trains the same wrapped model goes
on with the run's steps, as a new segment of it; a new ``ctx.wrap`` starts a new run."""

from __future__ import annotations

from typing import Any

DATA = """
import torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(5)
data = torch.utils.data.TensorDataset(torch.randn(512, 4, generator=g), torch.randn(512, 1, generator=g))
"""

WRAP = """
net = ctx.wrap(nn.Linear(4, 1))
opt = ctx.optimizer(net.parameters())
"""

TRAIN = """
seen = []
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=20):
    seen.append(step)
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
"""


def _steps(store: Any, run: int) -> list[int]:
    return [r["step"] for r in store.metrics(run, "loss")]


def _trained(c: Any) -> tuple[Any, int]:
    """A model wrapped and trained 20 steps in a run of its own: the store and the run."""
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    c.run(WRAP, quiet=True)
    c.run(TRAIN, quiet=True)
    return c.session.store, c.session.run_id


def test_a_continued_run_keeps_one_step_axis_and_a_new_wrap_starts_a_new_run(
    fresh_run, capsys, tmp_path, monkeypatch
) -> None:
    import json
    import re

    import nbformat

    from dtwork import cli
    from dtwork.report import export
    from dtwork.server import queries as server_data

    c = fresh_run
    store, run = _trained(c)
    c.run("for g in opt.param_groups: g['lr'] = 0.05", quiet=True)
    c.run(TRAIN, quiet=True)  # the same model, a lower learning rate: the same run goes on
    c.run("assert seen == list(range(20, 40)), seen", quiet=True)  # the step the loop yields goes on too
    assert c.session.run_id == run
    assert _steps(store, run) == list(range(40))  # one point per step, not two
    first, second = store.segments(run)
    assert (first["first_step"], first["changed"]) == (0, [])
    assert (second["first_step"], second["changed"]) == (20, ["lr"]), second
    assert second["cell_seq"] == store.cells(run)[-2]["seq"] and second["data"]["lr"] == [[0.05]]

    # the sidebar's route: the run's current step (its perf rows reach step 40) and its segments
    monkeypatch.setenv("DTWORK_STORE", str(store.path))
    route = server_data.get_run(str(tmp_path), run)["run"]
    assert route["last_step"] == 40 and [s["first_step"] for s in route["segments"]] == [0, 20]
    assert route["segments"][1]["changed"] == ["lr"]

    assert cli.main(["runs", "show", str(run), "--store", str(store.path)]) == 0
    shown = capsys.readouterr().out
    assert "steps 40" in shown and "segments  step 0 (cell" in shown and "lr changed" in shown, shown
    assert "loss" in shown and " 40 " in shown  # 40 points, one per step

    rep = export(run, tmp_path / "r.ipynb", store=store.path)
    nb = nbformat.read(rep.path, as_version=4)
    (what,) = [cell.source for cell in nb.cells if cell.source.startswith("## What ran")]
    assert "### Segments" in what and "step 20 (cell" in what and "lr changed" in what, what
    what = re.sub(r"\\+_", "_", what)  # the effective arguments each cell passed to the ctx helpers
    assert "ctx.steps(max_steps=20, accumulation=1, precision=none)" in what, what
    assert "ctx.loader(batch_size=8)" in what and "ctx.wrap(strategy=ddp); ctx.optimizer()" in what, what
    figure = next(
        o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []) if "data" in o
    )
    shapes = figure["data"]["application/vnd.plotly.v1+json"]["layout"]["shapes"]
    assert [(s["name"], s["x0"]) for s in shapes] == [("segment", 20)]  # the metrics figure, marked

    c.run(WRAP, quiet=True)  # a new model
    c.run(TRAIN, quiet=True)
    c.run("assert seen == list(range(20)), seen", quiet=True)
    new = c.session.run_id
    assert new != run and _steps(store, new) == list(range(20))
    assert f"a newly wrapped model: run {new} begins at step 0 (run {run} ended;" in capsys.readouterr().out
    assert [cell["source"] for cell in store.cells(new)][0] == TRAIN  # the cell that trained it
    assert store.get_run(run)["status"] == "completed" and _steps(store, run) == list(range(40))
    assert [s["first_step"] for s in store.segments(new)] == [0]
    # its report re-runs the cells before it too (the data, the wrap), then its own
    history = store.history(new)
    assert history[0]["source"] == DATA and history[-1]["source"] == WRAP and history[-1]["run_id"] == run
    nb = nbformat.read(export(new, tmp_path / "n.ipynb", store=store.path).path, as_version=4)
    rerun = [cell.source.split("\n", 1)[1] for cell in nb.cells if cell.source.startswith("%%dtrain")]
    assert rerun == [cell["source"] for cell in [*history, *store.cells(new)]]

    plot = tmp_path / "compare.html"
    args = ["runs", "compare", str(run), str(new), "--store", str(store.path), "--plot", str(plot), "--json"]
    assert cli.main(args) == 0
    compared = json.loads(capsys.readouterr().out)
    assert [s["first_step"] for s in compared["runs"][0]["segments"]] == [0, 20]
    assert plot.read_text().count('"name":"segment"') == 1  # run a's second segment, in its panel


HAND = """
for i, (x, y) in enumerate(ctx.loader(data)):
    if i == 10:
        break
    loss = F.mse_loss(net(x), y); loss.backward(); ctx.step(opt); ctx.log(loss=loss)
"""


def test_new_run_says_otherwise_either_way_and_a_hand_loop_goes_on_too(fresh_run) -> None:
    c = fresh_run
    store, run = _trained(c)
    c.run(WRAP, quiet=True)  # a new model that goes on with the run anyway
    c.run(TRAIN.replace("max_steps=20", "max_steps=20, new_run=False"), quiet=True)
    assert c.session.run_id == run and _steps(store, run) == list(range(40))
    c.run(TRAIN.replace("max_steps=20", "max_steps=20, new_run=True"), quiet=True)  # the same model, anew
    assert c.session.run_id != run and _steps(store, c.session.run_id) == list(range(20))
    c.run(HAND, quiet=True)  # a hand loop over the same model goes on with the run
    assert _steps(store, c.session.run_id) == list(range(30))
    assert [seg["first_step"] for seg in store.segments(c.session.run_id)] == [0, 20]


WRAP_B = """
net = ctx.wrap(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
opt = ctx.optimizer(net.parameters())
"""

LOOP = """
seen = []
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps={max_steps}, checkpoint_every=5{more}):
    if not seen:
        first_weights = [p.detach().clone() for p in net.parameters()]
    seen.append(step)
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
"""

ZERO = "with torch.no_grad():\n    [p.zero_() for p in net.parameters()]\n"


def _folder(path: Any) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name.startswith("step-")}


def _holds(path: Any, weights: dict[str, Any]) -> bool:
    """Whether a checkpoint holds a model with these weights (the ranks keep earlier tests' too)."""
    import torch

    models = torch.load(path, weights_only=True)["models"]
    return any(m.keys() == weights.keys() and all(torch.equal(m[k], weights[k]) for k in m) for m in models)


def _model_count(path: Any) -> int:
    import torch

    return len(torch.load(path, weights_only=True)["models"])


FINAL = "final = {k: v.detach().clone() for k, v in net.module.state_dict().items()}"


def test_a_run_begun_mid_cell_checkpoints_in_its_own_folder(fresh_run, tmp_path) -> None:
    """Re-running the cell that wraps a new model and trains it: the new run's checkpoints never
    land in the old run's folder, and end up in its own, where resume=True finds them."""
    c = fresh_run
    c.configure({"global_batch_size": 16, "checkpoint": {"directory": str(tmp_path), "keep": 2}})
    c.run(DATA, quiet=True)
    c.run(WRAP + LOOP.format(max_steps=20, more=""), quiet=True)  # cell A
    run_a = c.session.run_id
    c.run(FINAL, quiet=True)
    a_final = c.pull("final")[0]
    before = _folder(tmp_path / f"run-{run_a}")
    assert sorted(before) == ["step-00000015.pt", "step-00000020.pt"]

    # cell B: a new model, trained, then its own checkpoint resumed in the same cell
    resumed = LOOP.format(max_steps=30, more=", resume=True")
    c.run("net_a = net\n" + WRAP_B + LOOP.format(max_steps=20, more="") + ZERO + resumed, quiet=True)
    run_b = c.session.run_id
    assert run_b != run_a
    assert _folder(tmp_path / f"run-{run_a}") == before  # run A's files, untouched
    assert _holds(tmp_path / f"run-{run_a}" / "step-00000020.pt", a_final)  # model A's weights
    assert _model_count(tmp_path / f"run-{run_a}" / "step-00000020.pt") == 1  # not earlier runs' models
    segment = c.session.store.segments(run_b)[0]  # the loop that began it (the resume: a second)
    pending = segment["data"]["pending"]
    assert (tmp_path / pending).is_dir() and not (tmp_path / f"run-{run_b}").exists()

    c.run("assert seen == list(range(20, 30)), seen", quiet=True)  # resumed at its step 20...
    assert not (tmp_path / pending).exists()  # the next cell's start named the folder
    c.run("assert all(p.abs().sum() > 0 for p in first_weights)", quiet=True)  # ...with its weights
    c.run(FINAL + "\nc_weights = [p.detach().clone() for p in net.parameters()]\n" + ZERO, quiet=True)
    folder = tmp_path / f"run-{run_b}"
    assert sorted(_folder(folder)) == ["step-00000025.pt", "step-00000030.pt"]
    assert _holds(folder / "step-00000030.pt", c.pull("final")[0])  # model B's weights
    assert _model_count(folder / "step-00000030.pt") == 1  # model A (still named on the ranks) is not B's
    assert f'"run": "run-{run_b}"' in (folder / "run.json").read_text()

    c.run(LOOP.format(max_steps=35, more=", resume=True"), quiet=True)  # a later cell resumes run B
    c.run("assert seen == list(range(30, 35)), seen", quiet=True)
    c.run("assert all(torch.equal(a, b) for a, b in zip(first_weights, c_weights))", quiet=True)
    assert c.session.run_id == run_b
