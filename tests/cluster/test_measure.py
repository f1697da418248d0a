"""Analysis commands on the real 2-rank gloo cluster: scaling, data loading, bucket tuning, GNS advice."""

from __future__ import annotations

import math

import pytest

from dtwork import commands as measure
from dtwork.errors import DtworkError

MODEL = """
import time
import torch, torch.nn as nn

class BenchNet(nn.Sequential):
    def __init__(self, d=16):
        super().__init__(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 4))

class SlowData(torch.utils.data.Dataset):
    def __len__(self):
        return 512
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(16), 0

slow_ds = SlowData()
"""


@pytest.fixture()
def bench(fresh_run):
    fresh_run.run(MODEL, quiet=True)
    yield fresh_run
    fresh_run.configure(None)


def test_weak_scaling_sweep_gives_efficiencies_and_figure(bench, capsys):
    from dtwork.plots import scaling_figure

    result = measure.scaling(bench, "BenchNet()", slots=[1, 2], steps=4, warmup=1, per_slot=8)
    assert [p.world_size for p in result.points] == [1, 2]
    assert [(p.per_slot_batch, p.global_batch) for p in result.points] == [(8, 8), (8, 16)]
    eff = result.efficiencies()
    assert eff[1] == pytest.approx(1.0)
    assert math.isfinite(eff[2]) and eff[2] > 0
    assert all(p.throughput > 0 and p.step_time > 0 for p in result.points)
    fig = scaling_figure(result)
    assert list(fig.data[0].y) == [p.throughput for p in result.points]
    assert "efficient" in capsys.readouterr().out
    stored = bench.session.store.results(bench.session.run_id, "scaling")
    assert stored and stored[-1]["data"]["mode"] == "weak"


def test_strong_scaling_keeps_the_global_batch(bench):
    result = measure.scaling(
        bench, "BenchNet(20)", mode="strong", global_batch=16, steps=3, warmup=1, shape=20
    )
    assert [(p.world_size, p.per_slot_batch, p.global_batch) for p in result.points] == [
        (1, 16, 16),
        (2, 8, 16),
    ]


def test_slow_loader_is_the_bottleneck_with_an_interval_and_measured_advice(bench, capsys):
    out = measure.throughput(bench, "BenchNet()", "ctx.loader(slow_ds, batch_size=8)", steps=3, warmup=1)
    assert out["verdict"] == "bottleneck" and out["bottleneck"] is True
    assert out["sentence"].startswith("Data loading is the bottleneck")
    assert out["rounds"] >= 3 and out["low"] <= out["ratio"] <= out["high"] < 0.9  # the whole interval
    advice = out["advice"]
    best = advice["setting"]  # __getitem__ sleeps: workers load in parallel, measurably faster
    assert best is not None and best["num_workers"] > 0 and advice["gain"]["low"] > 1, advice
    assert all(t["setting"].get("num_workers", 0) > 0 for t in advice["tried"])
    printed = capsys.readouterr().out
    assert "Data loading is the bottleneck" in printed and "95% interval" in printed
    assert f"advice: try DataLoader(..., num_workers={best['num_workers']}" in printed
    stored = bench.session.store.results(bench.session.run_id, "throughput")[-1]["data"]
    assert stored["verdict"] == "bottleneck" and stored["advice"]["setting"] == best


def test_in_memory_tensors_are_no_false_bottleneck(bench):
    """Batches from tensors in memory (~2 ms a batch here) against a model that computes (~50 ms a
    step): no bottleneck, or inconclusive on a busy machine, never a bottleneck."""
    bench.run(
        "mem = torch.utils.data.TensorDataset(torch.randn(512, 384), torch.zeros(512))\n"
        "class Wide(nn.Sequential):\n"
        "    def __init__(self):\n"
        "        super().__init__(*[nn.Sequential(nn.Linear(384, 384), nn.ReLU()) for _ in range(10)])\n",
        quiet=True,
    )
    out = measure.throughput(
        bench, "Wide()", "ctx.loader(mem, batch_size=32)", steps=6, warmup=1, rounds=(3, 6), quiet=True
    )
    assert out["verdict"] in ("no bottleneck", "inconclusive"), out["sentence"]
    assert out["advice"] is None and out["high"] > 0.9


def test_tune_writes_the_fastest_bucket_into_the_config(bench):
    results = measure.tune_buckets(bench, "BenchNet()", sizes=(1, 4), steps=3, warmup=1, per_slot=8)
    assert set(results) == {1.0, 4.0}
    best = min(results, key=lambda mb: (results[mb], mb))
    assert bench.config.optimizations.tensor_fusion_threshold == best
    thresholds = bench.run(
        lambda: (
            __import__("dtwork.runtime", fromlist=["current"])
            .current()
            .config.optimizations.tensor_fusion_threshold
        )
    )
    assert thresholds == [best, best]


def test_bad_model_expression_is_one_line(bench):
    with pytest.raises(DtworkError) as info:
        measure.scaling(bench, "Nett()", slots=[1, 2], steps=1, warmup=0)
    assert str(info.value) == (
        "model expression 'Nett()' failed on the engines: NameError: name 'Nett' is not defined "
        "(define it in a %%dtrain cell first)"
    )
    # the engines are still usable afterwards (no rank left waiting in a collective)
    assert measure.scaling(bench, "BenchNet()", slots=[2], steps=1, warmup=0, quiet=True).points


def test_slots_beyond_the_cluster(bench):
    with pytest.raises(DtworkError, match=r"^--slots 4 exceeds the 2 ranks of this cluster$"):
        measure.scaling(bench, "BenchNet()", slots=[1, 4])


def test_magic_parses_and_calls_the_library(bench, monkeypatch):
    from dtwork import magics

    calls = {}
    monkeypatch.setattr(measure, "scaling", lambda c, expr, **kw: calls.setdefault("scaling", (expr, kw)))
    monkeypatch.setattr(measure, "gns_advice", lambda c, **kw: calls.setdefault("gns", kw))
    m = magics.DtrainMagics(shell=None)
    m.dtrain("scaling --slots 1,2 --strong --steps 3 --shape 20 --batch 16 BenchNet(20, )")
    expr, kw = calls["scaling"]
    assert expr == "BenchNet(20, )"
    assert kw["mode"] == "strong" and kw["slots"] == [1, 2] and kw["global_batch"] == 16 and kw["steps"] == 3
    monkeypatch.setattr(
        measure, "throughput", lambda c, expr, data, **kw: calls.setdefault("tp", (expr, data, kw))
    )
    monkeypatch.setattr(measure, "tune_buckets", lambda c, expr, **kw: calls.setdefault("tune", (expr, kw)))
    m.dtrain("throughput --data 'ctx.loader(ds)' --steps 4 BenchNet()")
    assert calls["tp"] == ("BenchNet()", "ctx.loader(ds)", {"steps": 4, "rounds": (3, 8)})
    calls.pop("tp")
    m.dtrain("throughput --data 'ctx.loader(ds)' --rounds 2 BenchNet()")
    assert calls["tp"][2] == {"steps": 10, "rounds": (2, 2)}
    m.dtrain("tune --sizes 1,4 --shape 16 BenchNet()")
    assert calls["tune"][0] == "BenchNet()" and calls["tune"][1]["sizes"] == (1.0, 4.0)
    with pytest.raises(DtworkError, match="--sizes takes bucket sizes"):
        m.dtrain("tune --sizes a,b BenchNet()")
    m.dtrain("gns --dataset-size 1000")
    assert calls["gns"] == {"dataset_size": 1000}
    with pytest.raises(DtworkError, match="not allowed with argument --weak"):
        m.dtrain("scaling --weak --strong Net()")


def test_gns_advice_says_plainly_when_there_is_no_estimate(bench, capsys):
    bench.session.new_run()
    assert measure.gns_advice(bench) is None
    assert "no gradient noise scale estimate" in capsys.readouterr().out


def test_gns_advice_from_the_stored_estimate(bench, capsys):
    session = bench.session
    session.new_run()
    run_id = session.ensure_run()
    session.store.add_metrics(
        run_id, [{"step": 5, "name": "b_simple", "value": 48.0}, {"step": 5, "name": "b_big", "value": 16.0}]
    )
    advice = measure.gns_advice(bench, dataset_size=5000)
    assert advice is not None and advice.critical_batch == 48
    out = capsys.readouterr().out
    assert "B_simple ~ 48.0" in out and "Critical batch size ~ 48" in out
