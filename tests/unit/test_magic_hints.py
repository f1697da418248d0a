"""Mistyped %dtrain subcommands and options get a "did you mean", named as the user typed them."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from dtwork.errors import DtworkError


@pytest.fixture
def ip() -> InteractiveShell:
    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("dtwork")  # silent when already loaded
    return shell


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("strat", "unknown %dtrain subcommand 'strat' (did you mean start?)"),
        ("throughtput --data x m", "(did you mean throughput?)"),
        (
            "start --global-batchsize 64",
            "%dtrain start: unrecognized arguments: --global-batchsize 64 (did you mean --global-batch-size?)",
        ),
        ("start --backend=gloo --timeot=5", "(did you mean --timeout?)"),
        (
            "scaling --shap 3,32,32 Net()",
            "%dtrain scaling: unrecognized arguments: --shap (did you mean --shape?)",
        ),
        ("report --htm", "%dtrain report: unrecognized arguments: --htm (did you mean --html?)"),
        ("runs lst", "unknown %dtrain runs action 'lst' (did you mean list?)"),
        ("attach --now", "%dtrain attach: unrecognized arguments: --now (see"),
    ],
)
def test_line_magic_typos_suggest_the_closest_name(ip: InteractiveShell, line: str, message: str) -> None:
    with pytest.raises(DtworkError) as info:
        ip.run_line_magic("dtrain", line)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_word_close_to_nothing_gets_no_suggestion(ip: InteractiveShell) -> None:
    with pytest.raises(DtworkError) as info:
        ip.run_line_magic("dtrain", "start --zzzzzz 1")
    assert "did you mean" not in str(info.value)


def test_cell_magic_typo_is_reported_as_the_cell_magic(ip: InteractiveShell) -> None:
    with pytest.raises(DtworkError) as info:
        ip.run_cell_magic("dtrain", "--rnak0", "x = 1")
    text = str(info.value)
    assert text.startswith("%%dtrain: unrecognized arguments: --rnak0 (did you mean --rank0?)")
    assert "cell" not in text
    with pytest.raises(DtworkError, match=r"^%%dtrain: cannot parse"):
        ip.run_cell_magic("dtrain", "--ranks '0", "x = 1")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["runs", "lst"], "invalid choice: 'lst'"),
        (["runs", "lst"], "(did you mean list?)"),
        (["runs", "list", "--jsn"], "unrecognized arguments: --jsn (did you mean --json?)"),
        (["doctor", "--gpus"], "(did you mean --gpu?)"),
    ],
)
def test_the_cli_suggests_too(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    from dtwork.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err
