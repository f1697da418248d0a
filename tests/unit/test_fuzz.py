"""Property-based input fuzzing: every input to %dtrain gives success or a one-line DtworkError.

Nothing here starts a cluster: the start request goes through the parser and the ``Cluster``
constructor only (which validates without starting), the line magic runs only subcommands
that start nothing, cell headers are parsed but never executed, and ``report`` gets junk run
ids that must be refused before anything is written.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shlex
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import dtwork.cluster as clusters
from dtwork.errors import DtworkError
from dtwork.magics import _int_list, _split, cell_parser, plan_start

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

START_OPTIONS = [
    "-n",
    "--backend",
    "--timeout",
    "--interface",
    "--profile",
    "--global-batch-size",
    "--config",
    "--store",
]
SPECIAL_VALUES = [
    "",
    " ",
    "auto",
    "gloo",
    "nccl",
    "mpi",
    "0",
    "-0",
    "-1",
    "1.5",
    "1e3",
    "0x10",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "9" * 40,
    "²",
    "١",
    "/nonexistent/dir/exp.yaml",
    "missing.yml",
    "does/not/exist",
    "..",
    "-",
    "--",
    "=",
    "lo",
    "ib0",
    "ünïcødé",
    "名前",
    "\x00",
    "a\nb",
    "{a: 1",
    "[1, 2",
    "!!python/object:os.system",
    "resources: {slots_per_trial: 0}",
    "resources: {slots_per_trial: 3}",
    "global_batch_size: 1",
    "global_batch_size: -4",
    "lr: fast",
    "a" * 300 + ".yaml",
]
VALUES = st.one_of(
    st.sampled_from(SPECIAL_VALUES),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=16),
)


def _flatten(groups: list[list[str]]) -> list[str]:
    return [token for group in groups for token in group]


START_ARGV = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(START_OPTIONS), VALUES).map(list),  # option + value
        st.tuples(st.sampled_from(START_OPTIONS[1:]), VALUES).map(lambda t: [f"{t[0]}={t[1]}"]),
        st.sampled_from(START_OPTIONS).map(lambda o: [o]),  # option without its value
        VALUES.map(lambda v: [v]),  # stray token
    ),
    max_size=5,
).map(_flatten)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _check_message(exc: DtworkError) -> None:
    text = str(exc)
    assert text.strip(), f"{type(exc).__name__} without a message"
    assert "\n" not in text and "\r" not in text, f"message is not one line: {text!r}"


@contextlib.contextmanager
def _no_new_children() -> Iterator[None]:
    before = _children()
    yield
    assert not (_children() - before), "a request that must start nothing started processes"


# -- %dtrain start: parser + Cluster constructor (never .start()) ----------------------------


@FUZZ
@given(argv=START_ARGV)
def test_start_request_constructs_or_refuses(argv: list[str]) -> None:
    with _no_new_children():
        try:
            cluster = plan_start(argv)
        except DtworkError as exc:  # ConfigError is one
            _check_message(exc)
            return
    assert cluster.state == "new" and cluster.client is None
    assert cluster.n >= 1 and math.isfinite(cluster.timeout) and cluster.timeout > 0
    timedelta(seconds=cluster.timeout)  # what every rank makes of it: must not overflow after the start


# -- %dtrain line magic, subcommands that start nothing, no cluster running ------------------

SAFE_SUBCOMMANDS = [
    "status",
    "stop",
    "config",
    "runs",
    "wait",
    "attach",
    "scaling",
    "throughput",
    "tune",
    "gns",
]
STARTING = {"start", "restart", "report"}  # start processes or write files: not fuzzed here
LINE_OPTIONS = [
    "--store",
    "--slots",
    "--weak",
    "--strong",
    "--steps",
    "--shape",
    "--batch",
    "--data",
    "--sizes",
    "--dataset-size",
    "--help",
    "-h",
    "--run",
    "--",
]
LINE_TOKEN = st.one_of(
    st.sampled_from(LINE_OPTIONS), VALUES, st.sampled_from(["'", '"', "\\", "'unbalanced", 'a"b'])
)
LINES = st.one_of(
    st.tuples(st.sampled_from(SAFE_SUBCOMMANDS), st.lists(LINE_TOKEN, max_size=5)).map(
        lambda t: " ".join([t[0], *t[1]])
    ),
    st.tuples(st.sampled_from(SAFE_SUBCOMMANDS), st.lists(VALUES, max_size=4)).map(
        lambda t: shlex.join([t[0], *t[1]])
    ),
    st.sampled_from(
        ["", "  ", "'", '"status', "status '", "frobnicate", "launch -n 2", "STATUS", "st-op", "_"]
    ),
    st.text(max_size=30),
)


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real IPython shell with dtwork loaded, a private (missing) run store, no clusters."""
    from IPython.core.interactiveshell import InteractiveShell

    store = tmp_path_factory.mktemp("fuzz-store") / "runs.sqlite"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DTWORK_STORE", str(store))
        # a registry of its own: another worker's kept clusters are not this shell's to attach to
        mp.setenv("DTWORK_HOME", str(tmp_path_factory.mktemp("fuzz-home")))
        clusters.stop_all()  # the shared cluster too: it restarts for the next test that uses it
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "dtwork")
        yield ip
    assert not store.exists(), "a read-only subcommand created the run store"


def _first_word(line: str) -> str | None:
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    return words[0].replace("-", "_") if words else None


@FUZZ
@given(line=LINES)
def test_line_magic_succeeds_or_refuses(shell: Any, line: str) -> None:
    assume(_first_word(line) not in STARTING)
    with _no_new_children(), contextlib.redirect_stdout(io.StringIO()):
        try:
            shell.run_line_magic("dtrain", line)
        except DtworkError as exc:
            _check_message(exc)


# -- %%dtrain header lines: parsed, never executed -------------------------------------------

CELL_TOKEN = st.one_of(
    st.sampled_from(["--rank0", "--ranks", "--bg", "--quiet", "--rank", "--ranks=", "-r", "--frob", "--"]),
    st.sampled_from(["0,1", "1", ",", ",,", "0,,1", "-1", "1,a", "²", "١", "1 2", "9" * 30, "", "0x1"]),
    st.lists(st.integers(min_value=-(10**20), max_value=10**20), max_size=4).map(
        lambda v: ",".join(map(str, v))
    ),
    VALUES,
)
CELL_LINES = st.one_of(
    st.lists(CELL_TOKEN, max_size=5).map(shlex.join),
    st.lists(CELL_TOKEN, max_size=5).map(" ".join),  # unquoted: unbalanced quotes reach the splitter
    st.text(max_size=30),
)


@FUZZ
@given(line=CELL_LINES)
def test_cell_header_parses_or_refuses(line: str) -> None:
    try:
        ns = cell_parser().parse_args(_split(line))
        ranks = _int_list(ns.ranks) if ns.ranks else None
    except DtworkError as exc:
        _check_message(exc)
        return
    assert isinstance(ns.rank0, bool) and isinstance(ns.bg, bool) and isinstance(ns.quiet, bool)
    assert ranks is None or (ranks and all(isinstance(r, int) for r in ranks))


# -- %dtrain report with junk run ids: refused, nothing written ------------------------------

JUNK_RUN_IDS = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "abc",
            "-1",
            "1.0",
            "1e3",
            "0x1",
            "1;DROP",
            "1; DROP TABLE runs",
            "../../etc/passwd",
            "²",
            "١",
            "１",
            "9" * 19,
            "9" * 40,
            "0",
            "000",
            "999999999999999999",
            "nan",
            "None",
            "latest",
        ]
    ),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.text(max_size=20),
)
REPORT_EXTRAS = st.lists(
    st.one_of(
        st.sampled_from(["--html", "out.ipynb", "reports/x.ipynb", "x.txt", "/nonexistent/x.ipynb", "."]),
        VALUES,
    ),
    max_size=3,
)


@pytest.fixture(scope="module")
def report_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, int]]:
    """A store holding one exportable run (outside the cwd) and an empty cwd to watch."""
    from IPython.core.interactiveshell import InteractiveShell

    from dtwork.store.runs import RunStore

    store = tmp_path_factory.mktemp("fuzz-report-store") / "runs.sqlite"
    with RunStore(store) as s:
        rid = s.create_run(name="fuzz", world_size=2, backend="gloo")
        s.add_cell(rid, "print(ctx.rank)")
    cwd = tmp_path_factory.mktemp("fuzz-report-cwd")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DTWORK_STORE", str(store))
        # a registry of its own: another worker's kept clusters are not this shell's to attach to
        mp.setenv("DTWORK_HOME", str(tmp_path_factory.mktemp("fuzz-home")))
        clusters.stop_all()
        mp.chdir(cwd)
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "dtwork")
        yield ip, cwd, rid


def _names_run(text: str, rid: int) -> bool:
    text = text.strip()
    return text.isascii() and text.isdigit() and int(text) == rid


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(run_id=JUNK_RUN_IDS, extras=REPORT_EXTRAS)
def test_report_with_junk_run_id_writes_nothing(
    report_env: tuple[Any, Path, int], run_id: str, extras: list[str]
) -> None:
    ip, cwd, rid = report_env
    assume(not _names_run(run_id, rid))
    argv = ["report", *extras, "--run", run_id]
    with pytest.raises(DtworkError) as info, contextlib.redirect_stdout(io.StringIO()):
        ip.run_line_magic("dtrain", shlex.join(argv))
    _check_message(info.value)
    assert os.getcwd() == str(cwd)
    assert not list(cwd.iterdir()), f"{argv} wrote {sorted(p.name for p in cwd.iterdir())}"
