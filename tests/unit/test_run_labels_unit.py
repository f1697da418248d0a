"""What tells runs apart in ``dtwork runs list``: the settings that differ, the optimizers' own lr."""

from __future__ import annotations

from pathlib import Path

from dtwork.commands.run_labels import changed, hparams_text
from dtwork.config import load_config
from dtwork.store.runs import RunStore


def test_changed_names_only_what_differs_and_the_lr_the_optimizers_had(tmp_path: Path) -> None:
    config = load_config({"name": "mnist", "lr": 0.5, "global_batch_size": 64})
    with RunStore(tmp_path / "runs.sqlite") as store:
        for lr, hidden in ((0.1, 64), (0.4, 64), (0.4, 128)):
            run = store.create_run(
                world_size=2,
                backend="gloo",
                config_yaml=config.replace(hyperparameters={"hidden": hidden}).to_yaml(),
            )
            store.add_segment(run, cell_seq=1, first_step=0, data={"lr": [[lr], [lr]]})  # two optimizers
        store.create_run(world_size=2, backend="gloo", config_yaml=config.to_yaml())  # trained no loop
        runs = store.list_runs()
        assert changed(store, runs) == {
            4: "lr=- hidden=-",
            3: "lr=0.4 hidden=128",
            2: "lr=0.4 hidden=64",
            1: "lr=0.1 hidden=64",  # the config's lr 0.5 gives way to the optimizers' own
        }
        assert changed(store, runs[1:3]) == {3: "hidden=128", 2: "hidden=64"}
        assert changed(store, runs[:1]) == {4: "-"}
        assert hparams_text(store, runs[0]) == "optimizer=sgd"
        assert hparams_text(store, runs[1]) == "lr=0.4 optimizer=sgd hidden=128"
