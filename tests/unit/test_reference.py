"""docs/reference.md names every %dtrain subcommand and option and every public ctx name and argument."""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dtwork import cli, magics
from dtwork.runtime.context import Context
from dtwork.runtime.loop import data, evaluate, optim, options

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"

# Where a ctx helper passes its **kwargs on, the receiver's named arguments are the helper's too.
FORWARDS: dict[str, tuple[Callable[..., Any], ...]] = {
    "steps": (options.LoopOptions.__init__, options.AdaptiveOptions.__init__),
    "evaluate": (evaluate.evaluate,),
    "loader": (data.make_loader,),
    "synthetic": (data.SyntheticDataset.__init__,),
    "clip_grad_norm": (optim.clip_grad_norm,),
}
INTERNAL = {"self", "cls", "state"}  # the RankState the runtime helpers take, never the user's argument


def sections() -> dict[str, str]:
    """The text under each ``### `name` `` heading, by name."""
    parts = re.split(r"^### `([^`]+)`\s*$", REFERENCE.read_text(), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def options(parser: argparse.ArgumentParser) -> list[str]:
    """A parser's own options, those it hides (``help=SUPPRESS``) and ``--help`` left out."""
    return [
        o
        for action in parser._actions
        if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
        for o in action.option_strings
    ]


def parsers(name: str, parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """``parser`` as ``name`` and every parser nested under it, by the words that reach it
    (``dtwork runs export``)."""
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                found += parsers(f"{name} {word}", sub)
    return found


# every parser of the %dtrain subcommands and of the shell's `dtwork` command, nested ones included
EVERY = [
    *(found for sub, make in magics.PARSERS.items() for found in parsers(f"%dtrain {sub}", make())),
    *parsers("dtwork", cli.cli_parser())[1:],  # its subcommands (the command itself has none of its own)
]


def arguments(name: str) -> list[str]:
    found: list[str] = []
    static = vars(Context).get(name)  # getattr would run the attribute descriptors
    if isinstance(static, classmethod):
        static = static.__func__
    for fn in (static, *FORWARDS.get(name, ())):
        if not inspect.isfunction(fn):
            continue
        for p in inspect.signature(fn).parameters.values():
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in INTERNAL:
                found.append(p.name)
    return found


def public_ctx() -> list[str]:
    return ["state", *(n for n in vars(Context) if not n.startswith("_"))]


@pytest.mark.parametrize("sub", magics.SUBCOMMANDS)
def test_every_subcommand_is_documented(sub: str) -> None:
    assert f"%dtrain {sub}" in sections(), f"docs/reference.md has no '### `%dtrain {sub}`' section"


@pytest.mark.parametrize(("name", "parser"), EVERY, ids=[name for name, _ in EVERY])
def test_every_parsers_options_are_documented(name: str, parser: argparse.ArgumentParser) -> None:
    text = sections().get(name)
    assert text is not None, f"docs/reference.md has no '### `{name}`' section"
    for option in options(parser):
        assert re.search(rf"`{re.escape(option)}(?![\w-])", text), f"{name} {option} is not documented"


def test_nested_parsers_are_read() -> None:
    names = [name for name, _ in EVERY]
    assert "dtwork runs export" in names and "%dtrain start" in names
    export = dict(EVERY)["dtwork runs export"]
    assert {"--report", "--tensorboard", "--mlflow"} <= set(options(export))


def test_every_subcommand_has_a_parser_but_run() -> None:
    assert set(magics.SUBCOMMANDS) - set(magics.PARSERS) == {"run"}


def test_every_cell_magic_option_is_documented() -> None:
    text = REFERENCE.read_text().split("## `%%dtrain`", 1)[1].split("\n## ", 1)[0]
    for option in options(magics.cell_parser()):
        assert f"`{option}" in text, f"%%dtrain {option} is not documented"


@pytest.mark.parametrize("name", public_ctx())
def test_every_ctx_name_and_argument_is_documented(name: str) -> None:
    text = sections().get(f"ctx.{name}")
    assert text is not None, f"docs/reference.md has no '### `ctx.{name}`' section"
    # Sections may share one description (ctx.models, ctx.optimizers): read on to the next prose.
    following = REFERENCE.read_text().split(f"### `ctx.{name}`", 1)[1]
    described = text.strip() or following
    for arg in arguments(name):
        assert re.search(rf"\b{arg}\b", described), f"ctx.{name}'s argument {arg} is not documented"


def test_the_readme_asks_for_the_torch_that_pyproject_requires() -> None:
    root = REFERENCE.parents[1]
    required = re.findall(r'"torch(>=[\d.]+)"', (root / "pyproject.toml").read_text())
    stated = set(re.findall(r"`torch(>=[\d.]+)`", (root / "README.md").read_text()))
    assert len(required) == 1 and stated == set(required)
