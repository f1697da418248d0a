"""dtwork.report: export a run as a notebook that re-runs to the same numbers, with no secrets.

Its tests that need engines (a cluster, a kernel, a process group across processes); the others are
in tests/unit/test_report.py.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from dtwork.errors import RankFailure
from dtwork.report import export
from dtwork.store.runs import RunStore

GH_TOKEN = "ghp_" + "A1b2C3d4E5" * 4


HF_TOKEN = "hf_" + "Zz9Yy8Xx7W" * 3


ENV_SECRET = "Qv7-correct-horse-battery"  # matches no token shape: only the env-value rule finds it


XSS = "<img src=x onerror=alert(1)>"  # a metric name that must stay text in the HTML


class Tags(HTMLParser):
    """The elements of an HTML page, with their attributes."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


CELL = f"""
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(ctx.config.seed)
hub = "{GH_TOKEN}"
# contact: {ENV_SECRET}
model = ctx.wrap(nn.Linear(4, 1)); opt = ctx.optimizer(model.parameters())
data = ctx.synthetic((4,), (1,), size=256)
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=20):
    loss = F.mse_loss(model(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss, **{{{XSS!r}: 1.0}})
"""


@pytest.fixture(scope="module")
def trained(cluster: object) -> tuple[int, Path]:
    """One 2-rank CPU run of 20 steps, with secrets in its config and its cell."""
    cfg = {"seed": 7, "global_batch_size": 16, "max_steps": 20, "hyperparameters": {"hub_token": HF_TOKEN}}
    cluster.configure(cfg)  # type: ignore[attr-defined]
    cluster.run(CELL, quiet=True)  # type: ignore[attr-defined]
    session = cluster.session  # type: ignore[attr-defined]
    run_id, store = session.run_id, session.store.path
    cluster.configure(None)  # type: ignore[attr-defined]  # ends the run
    return run_id, store


def _losses(store: Path, run_id: int | None = None) -> dict[int, float]:
    with RunStore(store, readonly=True) as s:
        rid = s.latest_run_id() if run_id is None else run_id
        return {r["step"]: r["value"] for r in s.metrics(rid, "loss")}


def test_exported_notebook_reruns_to_the_recorded_losses(trained: tuple[int, Path], tmp_path: Path) -> None:
    run_id, store = trained
    rep = export(run_id, tmp_path / "run.ipynb", store=store, verify=True)
    assert rep.verified is True, rep.verification
    original, rerun = _losses(store, run_id), _losses(tmp_path / "run.rerun.sqlite")
    assert sorted(original) == list(range(20)) and rerun.keys() == original.keys()
    assert max(abs(original[s] - rerun[s]) for s in original) <= 1e-6
    assert rep.max_abs_diff["loss"] <= 1e-6
    nb = nbformat.read(rep.path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "RECORDED = json.loads(" in code[0]
    assert code[-4].startswith("%%writefile run.yaml\n")
    assert (
        code[-3]
        == "%load_ext dtwork\n%dtrain start -n 2 --backend gloo --config run.yaml --store run.rerun.sqlite"
    )
    assert code[-2].startswith("%%dtrain\n") and code[-1] == "%dtrain stop"
    assert "reproduced the recorded metrics" in nb.cells[-1].source


def test_secrets_are_scrubbed_from_notebook_and_html(
    trained: tuple[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, store = trained
    monkeypatch.setenv("MY_API_TOKEN", ENV_SECRET)
    rep = export(run_id, tmp_path / "r.ipynb", store=store, html=True)
    assert rep.html_path == tmp_path / "r.html"
    for path in (rep.path, rep.html_path):
        text = path.read_text()
        for secret in (GH_TOKEN, HF_TOKEN, ENV_SECRET):
            assert secret not in text
    found = "\n".join(rep.scrubbed)
    assert "$MY_API_TOKEN" in found and "config.hyperparameters.hub_token" in found and "cell 1" in found
    assert ENV_SECRET not in found
    nb = nbformat.read(rep.path, as_version=4)
    train = next(c.source for c in nb.cells if c.source.startswith("%%dtrain"))
    compile(train.split("\n", 1)[1], "cell", "exec")  # still runnable Python
    assert "MY_API_TOKEN" in nb.cells[-1].source  # the report says what was scrubbed
    html = rep.html_path.read_text()  # type: ignore[union-attr]
    assert not re.findall(r'<script[^>]*\ssrc="https?:', html)  # plotly.js inlined, no CDN
    assert "Plotly.newPlot" in html and "window.Plotly" in html  # the bundle itself is inline
    header = nbformat.read(rep.path, as_version=4).cells[0].source
    assert "final &lt;img src=x onerror=alert(1)&gt; | 1 |" in header  # logged by the ranks, escaped
    live = [(t, a) for t, a in Tags(html).tags if "onerror" in a or a.get("src") == "x"]
    assert not live, live


SETUP = """
import torch, torch.nn as nn, torch.nn.functional as F
def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
train_ds = ctx.synthetic((4,), (1,), size=128)
"""

TRAIN = """
model = ctx.wrap(make_model()); opt = torch.optim.SGD(model.parameters(), lr=LR)
for step, (x, y) in ctx.steps(ctx.loader(train_ds), max_steps=6):
    loss = F.mse_loss(model(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
"""


def test_a_notebook_of_many_runs_and_setup_cells_exports_a_report_per_run_that_re_runs(
    tmp_path: Path,
) -> None:
    """Runs begun by a config change, by a new model mid-cell, after setup cells of their own and
    of runs before them: each run's report carries the setup it used and re-runs to its numbers."""
    import dtwork

    c = dtwork.start(n=2, backend="gloo", timeout=60, store=tmp_path / "runs.sqlite")
    try:
        c.session.live = False
        c.configure({"seed": 1, "global_batch_size": 16})
        c.run(SETUP, quiet=True)
        with pytest.raises(RankFailure):  # a failed cell is no setup: the re-run leaves it out
            c.run("def broken(): raise ValueError('not set up')\nbroken()", quiet=True)
        c.run(TRAIN.replace("LR", "0.1"), quiet=True)
        first = c.session.run_id
        c.configure({"seed": 2, "global_batch_size": 16, "name": "second"})  # a run the kernel begins
        c.run("scale = 2.0", quiet=True)
        c.run(TRAIN.replace("LR", "0.02 * scale"), quiet=True)
        second = c.session.run_id
        c.run(TRAIN.replace("LR", "0.05"), quiet=True)  # a new model: a run begun mid-cell
        third = c.session.run_id
        store = c.session.store.path
    finally:
        c.stop()
    assert len({first, second, third}) == 3
    for run in (first, second, third):
        rep = export(run, tmp_path / f"run{run}.ipynb", store=store, verify=True)
        assert rep.verified is True, (run, rep.verification)
