"""Trial groups of a search (issue 48, item 2): how the ranks split into groups of
``resources.slots_per_trial``, how many trials run at once, and the one-line errors."""

from __future__ import annotations

import pytest

from dtwork.commands.search_groups import concurrency, error_text, layout
from dtwork.config.search import load_search
from dtwork.errors import ConfigError, DtworkError

SEARCH = """
resources: {slots_per_trial: 2}
hyperparameters: {lr: {type: categorical, vals: [0.1, 0.2, 0.3]}}
searcher: {name: grid, metric: loss, max_concurrent_trials: 1}
"""


def test_groups_are_consecutive_ranks_slots_at_a_time() -> None:
    assert layout(4, 2) == [[0, 1], [2, 3]]
    assert layout(6, 3) == [[0, 1, 2], [3, 4, 5]]
    assert layout(4, 1) == [[0], [1], [2], [3]]


def test_a_trial_on_the_whole_cluster_keeps_the_sequential_path() -> None:
    assert layout(4, None) is None  # no slots_per_trial: every trial on every rank
    assert layout(4, 4) is None
    assert layout(2, 8) is None  # more than the cluster: one after another on all of it, as before


def test_slots_that_do_not_divide_the_ranks_say_what_would() -> None:
    with pytest.raises(DtworkError) as info:
        layout(6, 4)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "resources.slots_per_trial 4 does not divide the cluster's 6 ranks into trial groups: "
        "use 1 or 2 or 3, or start 8 ranks (%dtrain start -n N)"
    )


def test_at_most_max_concurrent_trials_run_at_once_and_never_more_than_groups() -> None:
    assert concurrency(2, None) == 2
    assert concurrency(4, 3) == 3
    assert concurrency(2, 5) == 2


def test_the_search_file_gives_slots_per_trial_and_max_concurrent_trials() -> None:
    plan = load_search(SEARCH)
    assert (plan.slots_per_trial, plan.max_concurrent_trials) == (2, 1)
    assert (
        load_search(
            SEARCH.replace("max_concurrent_trials: 1", "max_concurrent_trials: 0")
        ).max_concurrent_trials
        is None
    )
    assert load_search(SEARCH.replace("resources: {slots_per_trial: 2}\n", "")).slots_per_trial is None
    # the trials' own configs hold no max_concurrent_trials: a trial is one run
    assert "max_concurrent_trials" not in plan.configs[0].to_yaml()


@pytest.mark.parametrize("bad", ["-1", "two", "true", "1.5"])
def test_a_bad_max_concurrent_trials_is_one_line_naming_the_field(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_search(SEARCH.replace("max_concurrent_trials: 1", f"max_concurrent_trials: {bad}"))
    assert str(info.value).startswith("search: searcher.max_concurrent_trials must be a whole number >= 0")
    assert "\n" not in str(info.value)


def test_a_failed_trials_error_is_the_last_line_of_its_traceback() -> None:
    assert error_text(RuntimeError("Traceback\n  File x\nValueError: this trial fails\n")) == (
        "ValueError: this trial fails"
    )
    assert error_text(RuntimeError("")) == "RuntimeError"
