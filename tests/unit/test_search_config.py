"""Search files in Determined's vocabulary (issue 48, item 2): the trials a grid or random search makes,
each an experiment config with constant hyperparameters; errors in one line naming the field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dtwork.config.search import load_search
from dtwork.errors import ConfigError

# As Determined's docs write a grid search (mnist_pytorch's shape), with a nested hyperparameter.
GRID = """
name: mnist_pytorch_grid
hyperparameters:
  global_batch_size: 64
  learning_rate:
    type: log
    base: 10
    minval: -4
    maxval: -1
    count: 4
  n_filters1: {type: int, minval: 1, maxval: 4, count: 3}
  dropout1: {type: double, minval: 0.0, maxval: 0.5, count: 2}
  model:
    activation: {type: categorical, vals: [relu, gelu]}
    width: {type: const, val: 128}
searcher:
  name: grid
  metric: validation_loss
  smaller_is_better: true
  max_length:
    batches: 1000
  max_concurrent_trials: 2
"""


def test_a_grid_makes_determineds_points_in_its_order(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    s = load_search(path)
    assert (s.label, s.searcher, s.metric, s.smaller_is_better) == (
        "grid.yaml",
        "grid",
        "validation_loss",
        True,
    )
    assert len(s.hparams) == 4 * 3 * 2 * 2 == len(s.configs)
    # names sorted, the first varying slowest: dropout1, global_batch_size, learning_rate, model, n_filters1
    first, second, last = s.hparams[0], s.hparams[1], s.hparams[-1]
    assert first == {
        "global_batch_size": 64,
        "learning_rate": pytest.approx(1e-4),
        "n_filters1": 1,
        "dropout1": 0.0,
        "model": {"activation": "relu", "width": 128},
    }
    assert list(first) == [
        "global_batch_size",
        "learning_rate",
        "n_filters1",
        "dropout1",
        "model",
    ]  # the file's
    assert second["n_filters1"] == 3  # 1 + 1 * 3 / 2 = 2.5 rounds half away from zero, as Determined's grid
    assert sorted({h["n_filters1"] for h in s.hparams}) == [1, 3, 4]
    assert sorted({h["learning_rate"] for h in s.hparams}) == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1])
    assert last == {**first, "learning_rate": pytest.approx(0.1), "n_filters1": 4, "dropout1": 0.5} | {
        "model": {"activation": "gelu", "width": 128}
    }
    cfg = s.configs[5]
    assert cfg.hyperparameters == s.hparams[5] and cfg.global_batch_size == 64
    assert cfg.searcher.name == "single" and cfg.searcher.metric == "validation_loss"
    assert s.better(0.1, 0.2) and not s.better(0.3, 0.2)


def test_a_random_search_draws_max_trials_in_range_the_same_each_time() -> None:
    text = """
hyperparameters:
  lr: {type: log, minval: -3, maxval: -1}
  layers: {type: int, minval: 2, maxval: 3}
  opt: {type: categorical, vals: [sgd, adam]}
  drop: {type: double, minval: 0.1, maxval: 0.2}
searcher: {name: random, metric: acc, smaller_is_better: false, max_trials: 40}
reproducibility: {experiment_seed: 7}
"""
    a, b = load_search(text), load_search(text)
    assert a.hparams == b.hparams and len(a.hparams) == 40
    assert all(1e-3 <= h["lr"] <= 1e-1 and 0.1 <= h["drop"] <= 0.2 for h in a.hparams)
    assert {h["layers"] for h in a.hparams} == {2, 3}  # both ends drawn
    assert {h["opt"] for h in a.hparams} == {"sgd", "adam"}
    assert not a.smaller_is_better and a.better(0.9, 0.8)
    other = load_search(text.replace("experiment_seed: 7", "experiment_seed: 8"))
    assert other.hparams != a.hparams
    assert all(math.isfinite(h["lr"]) for h in other.hparams)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "hyperparameters: {lr: {type: double, minval: 0.1, maxval: 1.0}}\nsearcher: {name: grid, metric: l}",
            "search: hyperparameters.lr: a grid needs count: N for type double",
        ),
        (
            "hyperparameters: {lr: {type: double, minval: 0.1, maxval: 1.0}}\nsearcher: {name: random, metric: l}",
            "search: searcher.max_trials: a random search needs max_trials: N (a whole number >= 1)",
        ),
        (
            "searcher: {name: pbt, metric: l}",
            "search: searcher.name 'pbt' is not supported yet: use grid, random or adaptive_asha",
        ),
        (
            "hyperparameters: {n: {type: int, minval: 5, maxval: 1, count: 2}}\nsearcher: {name: grid, metric: l}",
            "search: hyperparameters.n: type int needs minval <= maxval (integers)",
        ),
        (
            "hyperparameters: {lr: {type: log, minval: -3, maxval: -1, count: 2}}\nsearcher: {name: single}",
            "search: hyperparameters.lr is searched (type log) but the searcher is single",
        ),
        (
            "hyperparameters: {global_batch_size: {type: categorical, vals: [0, 8]}}\n"
            "searcher: {name: grid, metric: l}",
            "search: trial 1 (global_batch_size=0): ",
        ),
    ],
    ids=["grid-count", "random-max-trials", "pbt", "range", "single", "bad-trial"],
)
def test_a_search_that_cannot_run_is_refused_in_one_line(text: str, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_search(text)
    assert str(err.value).startswith(said) and "\n" not in str(err.value)
