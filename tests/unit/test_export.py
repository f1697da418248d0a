"""TensorBoard and MLflow exports of a real SQLite run store, read back with each tool's own reader."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dtwork.config import load_config
from dtwork.store.runs import RunStore

CONFIG = load_config(
    {
        "name": "mnist",
        "hyperparameters": {"global_batch_size": 64, "learning_rate": 0.5, "model": {"depth": 3}},
        "searcher": {"metric": "validation_loss", "max_length": {"batches": 10}},
    }
)


def fill_store(path: Path) -> tuple[int, dict[str, list[tuple[int, float]]]]:
    """A finished run with training logs, throughput, GNS and a scaling sweep; returns what was logged."""
    logged: dict[str, list[tuple[int, float]]] = {}
    with RunStore(path) as store:
        run = store.create_run(
            name="mnist",
            world_size=2,
            backend="gloo",
            config_yaml=CONFIG.to_yaml(),
            global_batch_size=64,
            per_slot_batch_size=32,
        )
        cell = store.add_cell(run, "for step, batch in ctx.steps(loader):\n    ctx.log(loss=loss_of(batch))")
        store.finish_cell(run, cell, "completed")
        records = []
        for step in range(10):
            for name, value in (
                ("loss", 2.0 / (step + 1)),
                ("samples_per_s", 1000.0 + 7 * step),
                ("b_simple", 50.0 + step / 3),
            ):
                records.append({"step": step, "name": name, "value": value, "time": 1_700_000_000.0 + step})
                logged.setdefault(name, []).append((step, value))
            if step % 5 == 4:
                records.append({"step": step, "name": "validation_loss", "value": 1.0 / step, "time": 1.7e9})
                logged.setdefault("validation_loss", []).append((step, 1.0 / step))
        records.append(
            {"step": 3, "rank": 1, "name": "loss", "value": 99.0}
        )  # a rank's own value: not exported
        store.add_metrics(run, records)
        points = [
            {"world_size": n, "throughput": 900.0 * n, "step_time": 0.1, "comm_time": 0.01 * n,
             "per_slot_batch": 32, "global_batch": 32 * n}
            for n in (1, 2)
        ]  # fmt: skip
        store.add_result(run, "scaling", {"mode": "weak", "points": points})
        store.set_run_status(run, "completed", ended=True)
    return run, logged


def test_tensorboard_event_files_hold_every_value_at_its_step(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dtwork.export.tensorboard import export_tensorboard

    run, logged = fill_store(tmp_path / "runs.sqlite")
    folders = export_tensorboard(tmp_path / "runs.sqlite", tmp_path / "tb")
    assert folders == [tmp_path / "tb" / f"run-{run}-mnist"]
    acc = EventAccumulator(str(folders[0]), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert set(logged) <= tags
    for name, values in logged.items():
        read = [(e.step, e.value) for e in acc.Scalars(name)]
        assert len(read) == len(values), name
        for (step, value), (rstep, rvalue) in zip(values, read, strict=True):
            assert rstep == step and math.isclose(rvalue, value, rel_tol=1e-6), (name, step)
    assert [(e.step, e.value) for e in acc.Scalars("scaling/weak/throughput")] == [(1, 900.0), (2, 1800.0)]
    assert "_hparams_/session_start_info" in acc.summary_metadata


@pytest.mark.parametrize("backend", ["file", "sqlite"])
def test_mlflow_run_reads_back_through_the_client(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from dtwork.export.mlflow import export_mlflow

    run, logged = fill_store(tmp_path / "runs.sqlite")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    if backend == "file":  # MLflow 3 keeps its file store behind this switch
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = (tmp_path / "mlruns").as_uri()
    else:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (mlflow_id,) = export_mlflow(tmp_path / "runs.sqlite", uri)
    client = MlflowClient(tracking_uri=uri)
    got = client.get_run(mlflow_id)
    assert got.info.run_name == "mnist" and got.info.status == "FINISHED"
    assert got.data.tags["dtwork.run_id"] == str(run)
    assert got.data.params["hparams.learning_rate"] == "0.5"
    assert got.data.params["hparams.model.depth"] == "3"
    assert got.data.params["config.searcher.metric"] == "validation_loss"
    assert got.data.params["world_size"] == "2"
    for name, values in logged.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(mlflow_id, name))
        assert [h[0] for h in history] == [v[0] for v in values], name
        assert [h[1] for h in history] == pytest.approx([v[1] for v in values]), name
    artifacts = {a.path for a in client.list_artifacts(mlflow_id)}
    assert {"config.yaml", f"run-{run}.ipynb"} <= artifacts
    assert not any(Path.cwd().iterdir())  # nothing written where the export was run from


def test_mlflow_file_store_refusal_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from dtwork.errors import DtworkError
    from dtwork.export.mlflow import export_mlflow

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    fill_store(tmp_path / "runs.sqlite")
    with pytest.raises(DtworkError) as info:
        export_mlflow(tmp_path / "runs.sqlite", tmp_path / "mlruns", report=False)
    text = str(info.value)
    assert len(text.splitlines()) == 1 and "MLFLOW_ALLOW_FILE_STORE=true" in text and "sqlite:///" in text


def test_report_shows_the_searcher_metric_as_the_result(tmp_path: Path) -> None:
    import nbformat

    from dtwork.report import export

    run, logged = fill_store(tmp_path / "runs.sqlite")
    export(run, tmp_path / "r.ipynb", store=tmp_path / "runs.sqlite")
    text = "\n".join(c.source for c in nbformat.read(tmp_path / "r.ipynb", as_version=4).cells)
    best_value, best_step = min((v, s) for s, v in logged["validation_loss"])
    assert (
        f"| result: lowest validation\\_loss | {best_value:.6g} at step {best_step} |" in text
    )  # markdown-escaped
