"""ASHA searches (issue 48, item 2: adaptive_asha) against Determined's own numbers: rung lengths and
brackets as ``adaptive_asha.go``/``asha_stopping.go`` make them, and promotions as the simulations of
its promotion-based searcher (``asha_test.go``, before 0.38) expect them; Determined's example search
files load as written."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dtwork.config import asha
from dtwork.config.search import load_search
from dtwork.config.searchers import AshaSearcher, Work, searcher_for
from dtwork.errors import ConfigError

EXAMPLES = Path(__file__).parent.parent / "fixtures" / "determined-asha"

# asha_test.go's bracket: 3 rungs to 9000 batches, 12 trials, divisor 3
HALVING = """
hyperparameters: {x: {type: int, minval: 1, maxval: 9}}
searcher: {name: async_halving, metric: m, smaller_is_better: true, num_rungs: 3,
           max_length: {batches: 9000}, max_trials: 12, divisor: 3}
"""


def simulate(text: str, metrics: list[float], failing: frozenset[int] = frozenset()) -> AshaSearcher:
    """Run a search to its end, one piece at a time, trial n reporting metrics[n-1] at every rung."""
    searcher = searcher_for(load_search(text))
    assert isinstance(searcher, AshaSearcher)
    searcher.pieces = {}  # type: ignore[attr-defined]
    while (work := searcher.next()) is not None:
        searcher.pieces.setdefault(work.trial, []).append(work)  # type: ignore[attr-defined]
        searcher.report(work, metrics[work.trial - 1], ok=work.trial not in failing)
    assert searcher.finished and searcher.next() is None
    return searcher


def lengths(searcher: AshaSearcher) -> list[list[int]]:
    pieces: dict[int, list[Work]] = searcher.pieces  # type: ignore[attr-defined]
    return [[w.length.value for w in pieces[t] if w.length is not None] for t in sorted(pieces)]


def test_rung_lengths_divide_max_length_by_powers_of_the_divisor() -> None:
    assert asha.rung_lengths(9000, 3, 3) == (1000, 3000, 9000)
    assert asha.rung_lengths(937, 3, 4) == (58, 234, 937)  # floor, as Go's uint64()
    assert asha.rung_lengths(10, 4, 4) == (1, 1, 2, 10)  # never below one unit
    assert asha.rung_lengths(100, 1, 4) == (100,)


def test_the_top_third_is_promoted_each_rung_and_only_the_best_reaches_max_length() -> None:
    searcher = simulate(HALVING, [0.01 * (i + 1) for i in range(12)])
    assert lengths(searcher) == [[1000, 3000, 9000]] + [[1000, 3000]] * 3 + [[1000]] * 8
    pieces = searcher.pieces  # type: ignore[attr-defined]
    assert [w.resume for w in pieces[1]] == [False, True, True]  # a promotion goes on from its rung
    assert [searcher.rung(t) for t in range(1, 13)] == [2, 1, 1, 1] + [0] * 8
    assert [searcher.stopped(t) for t in range(1, 13)] == [False] + [True] * 11


def test_larger_is_better_promotes_the_largest() -> None:
    text = HALVING.replace("smaller_is_better: true", "smaller_is_better: false")
    searcher = simulate(text, [0.12 - 0.01 * i for i in range(12)])
    assert lengths(searcher) == [[1000, 3000, 9000]] + [[1000, 3000]] * 3 + [[1000]] * 8


def test_promotions_are_asynchronous_and_a_failing_trial_is_never_promoted() -> None:
    # asha_test.go "async promotions": trial 1 is promoted while it is the best third of what
    # reported so far; trial 3 fails (an early exit) and counts as its rung's worst.
    metrics = [0.10, 0.11, 0.12, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09]
    searcher = simulate(HALVING, metrics, failing=frozenset({3}))
    assert (
        lengths(searcher)
        == [
            [1000, 3000],
            [1000],
            [1000],
            [1000, 3000, 9000],
            [1000, 3000],
            [1000, 3000],
            [1000, 3000],
        ]
        + [[1000]] * 5
    )
    assert not searcher.stopped(3)  # failed, not stopped


def test_a_failing_trial_is_the_worst_even_with_the_best_metric() -> None:
    metrics = [0.5, 0.4, 0.3, 0.001] + [0.2] * 8  # trial 4 logged the best value, then failed
    searcher = simulate(HALVING, metrics, failing=frozenset({4}))
    assert lengths(searcher)[3] == [1000]
    assert max(len(x) for x in lengths(searcher)) == 3  # someone else reached the top


def test_a_one_rung_bracket_trains_every_trial_to_max_length() -> None:
    text = HALVING.replace("num_rungs: 3", "num_rungs: 1").replace("max_trials: 12", "max_trials: 4")
    searcher = simulate(text, [0.05, 0.06, 0.07, 0.08])
    assert lengths(searcher) == [[9000]] * 4
    assert not any(searcher.stopped(t) for t in range(1, 5))


def test_the_search_ends_when_every_rung_settles() -> None:
    searcher = searcher_for(load_search(HALVING))
    handed: list[Work] = []
    while (work := searcher.next()) is not None:
        handed.append(work)  # all that may run at once (max_concurrent_trials 16 > 12 trials)
    assert [w.trial for w in handed] == list(range(1, 13)) and not searcher.finished
    for w in handed[:11]:
        searcher.report(w, float(w.trial), ok=True)  # smaller trial numbers are better
    # 11 results: the best 3 (trials 1-3) promoted as the rung grew; one trial still trains at rung 0
    waiting = [searcher.next() for _ in range(3)]
    assert [(w.trial, w.length, w.resume) for w in waiting if w is not None] == [
        (t, asha.Length("batches", 3000), True) for t in (1, 2, 3)
    ]
    assert searcher.next() is None and not searcher.finished
    searcher.report(handed[11], 0.0, ok=True)  # the best: promoted at once
    last = searcher.next()
    assert last is not None and last.trial == 12 and last.resume
    for w in [*waiting, last]:
        assert w is not None
        searcher.report(w, 0.5, ok=True)
    top = searcher.next()  # the first of four equal results at rung 1
    assert top is not None and (top.trial, top.length) == (1, asha.Length("batches", 9000))
    assert searcher.next() is None and not searcher.finished
    searcher.report(top, 0.5, ok=True)
    assert searcher.next() is None and searcher.finished


def test_max_concurrent_trials_limits_what_is_handed_out_at_once() -> None:
    searcher = searcher_for(
        load_search(HALVING.replace("divisor: 3}", "divisor: 3, max_concurrent_trials: 2}"))
    )
    first, second = searcher.next(), searcher.next()
    assert first is not None and second is not None and searcher.next() is None
    searcher.report(first, 1.0, ok=True)
    assert searcher.next() is not None and searcher.next() is None


@pytest.mark.parametrize(
    ("searcher", "brackets"),
    [
        # adaptive_asha_test.go TestMakeBrackets
        (
            "{name: adaptive_asha, mode: standard, time_metric: batches, max_time: 100, "
            "max_concurrent_trials: 2, max_trials: 10}",
            [(2, 7, 1), (1, 3, 1)],
        ),
        (
            "{name: adaptive_asha, mode: conservative, time_metric: batches, max_time: 1000, divisor: 3, "
            "max_concurrent_trials: 5, max_trials: 10}",
            [(3, 7, 2), (2, 2, 2), (1, 1, 1)],
        ),
        # TestBracketMaxTrials / TestBracketMaxConcurrentTrials through bracket_rungs
        (
            "{name: adaptive_asha, bracket_rungs: [1, 2, 3], max_length: {batches: 900}, max_trials: 20, divisor: 3, "
            "max_concurrent_trials: 11}",
            [(3, 12, 4), (2, 5, 4), (1, 3, 3)],
        ),
        (
            "{name: adaptive_asha, bracket_rungs: [2, 3, 4], max_length: {batches: 900}, max_trials: 100}",
            [(4, 70, 6), (3, 22, 5), (2, 8, 5)],
        ),
        (
            "{name: adaptive_asha, mode: aggressive, max_time: 64, time_metric: batches, max_trials: 64}",
            [(4, 64, 16)],
        ),
    ],
)
def test_brackets_follow_determineds_make_brackets(
    searcher: str, brackets: list[tuple[int, int, int]]
) -> None:
    plan = load_search(
        f"searcher: {searcher}\nhyperparameters: {{x: {{type: double, minval: 0, maxval: 1}}}}"
    )
    assert plan.asha is not None
    got = [(len(b.lengths), b.max_trials, b.max_concurrent_trials) for b in plan.asha.brackets]
    assert got == brackets
    assert len(plan.configs) == sum(t for _, t, _ in brackets)  # drawn as random draws them


def test_brackets_take_turns_and_promotions_go_first() -> None:
    text = (
        "hyperparameters: {x: {type: double, minval: 0, maxval: 1}}\n"
        "searcher: {name: adaptive_asha, metric: m, bracket_rungs: [2, 1], max_length: {batches: 16}, "
        "max_trials: 8, max_concurrent_trials: 2}"
    )
    searcher = searcher_for(load_search(text))
    a, b = searcher.next(), searcher.next()
    assert a is not None and b is not None and searcher.next() is None
    assert [a.length, b.length] == [asha.Length("batches", 4), asha.Length("batches", 16)]  # one of each


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_determineds_adaptive_asha_examples_load_as_written(name: str) -> None:
    plan = load_search(EXAMPLES / name)
    assert plan.searcher == "adaptive_asha" and plan.asha is not None
    assert plan.metric and len(plan.configs) == sum(b.max_trials for b in plan.asha.brackets)
    top = plan.asha.max_length
    assert all(c.searcher.max_length == top and c.checkpoint.every for c in plan.configs)


def test_determineds_mnist_examples_make_its_brackets() -> None:
    assert len(list(EXAMPLES.glob("*.yaml"))) == 6
    mnist = load_search(EXAMPLES / "mnist_pytorch.yaml")
    assert mnist.asha is not None and [b.lengths for b in mnist.asha.brackets] == [(58, 234, 937), (234, 937)]
    assert [b.max_trials for b in mnist.asha.brackets] == [12, 4]  # 16 trials, equal budget per bracket
    assert all(0.0001 <= h["learning_rate"] <= 1.0 for h in mnist.hparams)
    epochs = load_search(EXAMPLES / "core_api_pytorch_mnist.yaml")
    assert epochs.asha is not None and epochs.asha.unit == "epochs"
    assert epochs.configs[0].searcher.max_length == asha.Length("epochs", 20)
    assert epochs.configs[0].stop(64) == (18750, None)  # 20 epochs of 60000 records at 64


@pytest.mark.parametrize(
    ("searcher", "said"),
    [
        ("{name: adaptive_asha, metric: m, max_trials: 4}", "search: searcher.max_time: adaptive_asha needs"),
        (
            "{name: adaptive_asha, metric: m, max_trials: 4, time_metric: loss, max_time: 9}",
            "search: searcher.time_metric: dtwork measures a trial's length in batches",
        ),
        (
            "{name: adaptive_asha, metric: m, max_length: {batches: 9}}",
            "search: searcher.max_trials: adaptive_asha needs max_trials: N",
        ),
        (
            "{name: adaptive_asha, metric: m, max_trials: 4, max_length: {batches: 9}, divisor: 1}",
            "search: searcher.divisor must be a number > 1",
        ),
        (
            "{name: adaptive_asha, metric: m, max_trials: 4, max_length: {batches: 9}, mode: wild}",
            "search: searcher.mode must be one of aggressive, standard, conservative",
        ),
        (
            "{name: async_halving, metric: m, max_trials: 4, max_length: {batches: 9}}",
            "search: searcher.num_rungs: async_halving needs num_rungs: N",
        ),
        (
            "{name: adaptive_asha, metric: m, max_trials: 4, max_length: {batches: 9}}\nmax_steps: 5",
            "search: max_steps: an ASHA search sets each trial's length per rung",
        ),
    ],
    ids=["no-length", "time-metric", "max-trials", "divisor", "mode", "num-rungs", "max-steps"],
)
def test_an_asha_search_that_cannot_run_is_refused_in_one_line(searcher: str, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_search(f"searcher: {searcher}")
    assert str(err.value).startswith(said) and "\n" not in str(err.value)


def test_when_the_search_ends_trials_below_the_top_and_diverged_ones_read_stopped() -> None:
    from dtwork.commands.search import SearchResult, Trial, _settle

    plan = load_search(HALVING)
    metrics = [0.01 * (i + 1) for i in range(12)]
    metrics[1] = math.nan  # trial 2 diverged: ASHA counts it the worst of its rung
    searcher = simulate(HALVING, metrics)
    result = SearchResult(plan, [Trial(i + 1, hp) for i, hp in enumerate(plan.hparams)])
    for t in result.trials:
        t.status, t.rung, t.metric = "completed", searcher.rung(t.number), metrics[t.number - 1]
    _settle(result, searcher)
    assert [t.status for t in result.trials] == ["completed"] + ["stopped"] * 11
