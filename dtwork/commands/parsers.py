"""The ``%dtrain`` magics' parsers and help text: one parser a subcommand, errors in one line.

``dtwork.magics`` dispatches to them; docs/reference.md is checked against ``PARSERS``.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from dtwork.errors import DtworkError, did_you_mean

if TYPE_CHECKING:
    from dtwork.cluster import Cluster

HELP = """Drive a data-parallel training cluster from the notebook.

Line magic ``%dtrain SUBCOMMAND [options]``:

  start [-n N] [--backend auto|nccl|gloo] [--timeout SECONDS] [--interface IFNAME]
        [--profile NAME] [--global-batch-size G] [--config EXP.yaml] [--store PATH]
      Start N engines (one per GPU with NCCL; without GPUs N CPU ranks with gloo, N=2)
      joined in a torch.distributed process group. The port is a free one per cluster;
      --timeout bounds every collective (default 300 s). --profile uses an ipyparallel
      profile whose launcher (SSH, MPI, Slurm) starts engines on other hosts.
        [--launcher local|slurm|mpi|ssh] [--partition P] [--time T] [--account A]
        [--gpus-per-node G] [--nodes K] [--hosts h1:4,h2:4] [--engine-timeout SECONDS]
      --launcher starts the engines as the tasks of one Slurm job (sbatch, or srun inside an
      allocation), with mpiexec, or over SSH; dtwork writes the launcher configuration.
      --engine-timeout bounds the wait for the engines, a batch queue included (default 60 s).
        [--keep DURATION] [--new]
      --keep 2h keeps the cluster 2 h after this kernel ends or restarts, for %dtrain attach;
      with a kept cluster waiting in this folder, start offers it instead (--new: start anyway).
  status          the ranks, hosts, devices, backend and state
  stop            stop every engine and the controller
  restart         same ranks and settings, fresh engines and process group
  config EXP.yaml load an experiment config on every rank as ``ctx.config`` (starts a new run)
  runs [list [--search ID]|searches|show ID|compare A B [C ...]|export [ID] --tensorboard DIR|--mlflow URI|--report PATH]
                  the runs in the run store, as ``dtwork runs`` in a shell
  run SCRIPT.py [ARGS...]
                  run a torchrun-style script unchanged on every rank (also %run in %%dtrain)
  autoreload [on|off]
                  reload the notebook folder's modules edited on disk before each cell (on)
  wait            bring a background (--bg) cell back: live view, wait for its end
  attach [ID]     drive a kept cluster (--keep) whose kernel ended: names, ctx and run go on
  detach          let go of this kernel's kept cluster, for another notebook's attach
  scaling [--slots 1,2] [--weak|--strong] [--steps K] [--shape C,H,W] [--batch B] MODEL_EXPR
                  throughput and scaling efficiency on synthetic data, by world size
  throughput --data LOADER_EXPR [--steps K] [--rounds N] MODEL_EXPR
                  real batches against synthetic ones: is data loading the bottleneck?
  tune [--sizes 1,4,16] [--shape ...] MODEL_EXPR
                  sweep DDP bucket sizes, write the best into the config
  gns [--dataset-size N]
                  the gradient noise scale and batch-size advice of the current run
  stacks [--ranks 0,1] [--all]   every rank's Python stack now (also while a cell hangs)
  collectives [on|off]   check each collective's op and shapes across the ranks first (off)
  debug [RANK]    pdb on a rank's last cell error (first failing rank): p, pp, up, down, l, q
  report [PATH.ipynb] [--run ID|--search ID] [--html] [--verify]
                  export a run (or a search: its trials) as a notebook that re-runs to the same numbers
  search --resume ID [EXP.yaml]
                  go on with a stopped search (its stored file and code), as the cell magic below

Cell magic ``%%dtrain [--rank0] [--ranks 0,1] [--bg] [--quiet] [--name NAME]``:
  Run the cell on every rank (or those named) in a persistent namespace where ``ctx``
  is defined. Output is grouped by rank (--rank0: rank 0's only). --bg returns at once
  and trains in the background. When some ranks raise, the first failing rank's
  traceback is shown once, with one status line per other rank. --quiet shows no live view
  and discards the cell's print output and results on every rank (records are still stored).
  --name names the run the cell trained in (dtwork runs list shows it).

Cell magic ``%%dtrain search EXP.yaml [--resume ID] [--quiet]``:
  A search in Determined's vocabulary (searcher.name grid|random|adaptive_asha, searched
  hyperparameters int, double, log, categorical): the cell runs once per trial on the whole
  cluster (adaptive_asha: once per rung reached, a promoted trial resuming from its checkpoint),
  each trial a run with its hyperparameters as ctx.hparams; the trials' searcher.metric and the
  best are printed. A failing trial costs that trial; Ctrl-C stops the search. --resume ID goes
  on with a stopped search where it stopped: its ended trials keep their runs, the interrupted
  and not-run ones run (the file and cell, when given, must be the ones it ran; an empty cell:
  its stored code).

The full reference (every option, every ctx helper): ``%dtrain help`` says where it is installed,
``%dtrain help TOPIC`` prints one section (``%dtrain help ctx.loader``).
"""


def _one_line(text: str) -> str:
    """Escape line breaks and other control characters (argparse echoes stray tokens verbatim)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text.strip())


class _Parser(argparse.ArgumentParser):
    """argparse that raises a one-line DtworkError instead of exiting; prog is the magic as typed."""

    def error(self, message: str) -> NoReturn:
        raise DtworkError(f"{self.prog}: {_one_line(message)}{self._suggest(message)} (see %dtrain?)")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise DtworkError(_one_line(message or "") or f"{self.prog}: see %dtrain?")

    def _suggest(self, message: str) -> str:
        """The closest option to the first unknown one (``--global-batchsize`` -> ``--global-batch-size``)."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        options = [o for o in self._option_string_actions if o.startswith("--")]
        for token in message.split(":", 1)[1].split():
            if token.startswith("-"):
                return did_you_mean(token.split("=", 1)[0], options)
        return ""


def _parser(name: str) -> _Parser:
    """The parser of ``%dtrain NAME`` (``%%dtrain`` for the cell magic)."""
    return _Parser(
        prog=name if name.startswith("%") else f"%dtrain {name}", add_help=False, allow_abbrev=False
    )


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise DtworkError(f"expected comma-separated whole numbers such as 0,1 — got {text!r}") from None
    if not values:
        raise DtworkError("expected at least one number, such as 0,1")
    return values


def _start_parser() -> _Parser:
    from dtwork.kernel.spec import start_flags

    p = _parser("start")
    for flag, name, kind in start_flags():  # unset: the spec's default
        p.add_argument(flag, dest=name, type=kind, default=None)
    p.add_argument("--new", action="store_true")  # even with a kept cluster waiting in this folder
    return p


def cell_parser() -> _Parser:
    p = _parser("%%dtrain")
    p.add_argument("--rank0", action="store_true")
    p.add_argument("--ranks", type=str, default=None)
    p.add_argument("--bg", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--name", default=None)
    return p


def search_parser() -> _Parser:
    p = _parser("%%dtrain search")
    p.add_argument("path", nargs="?", default=None)
    p.add_argument("--resume", default=None, metavar="ID")
    p.add_argument("--quiet", action="store_true")
    return p


def _config_parser() -> _Parser:
    p = _parser("config")
    p.add_argument("path")
    return p


def _runs_parser() -> _Parser:
    p = _parser("runs")  # list, show, compare and export are the CLI's parser (dtwork runs ...)
    p.add_argument("--store", default=None)
    return p


def _one_arg(name: str, dest: str = "state", **options: object) -> _Parser:
    """The parser of a subcommand that takes one optional argument (on|off by default)."""
    p = _parser(name)
    p.add_argument(dest, nargs="?", **({"choices": ["on", "off"]} | options))  # type: ignore[arg-type]
    return p


def _report_parser() -> _Parser:
    p = _parser("report")
    p.add_argument("path", nargs="?", default=None)
    p.add_argument("--run", default=None)
    p.add_argument("--search", default=None)
    p.add_argument("--html", action="store_true")
    p.add_argument("--verify", action="store_true")
    p.add_argument("--store", default=None)
    return p


def _scaling_parser() -> _Parser:
    p = _parser("scaling")
    p.add_argument("--slots", default=None)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--weak", dest="mode", action="store_const", const="weak")
    mode.add_argument("--strong", dest="mode", action="store_const", const="strong")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--shape", default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("model", nargs="+")
    return p


def _throughput_parser() -> _Parser:
    p = _parser("throughput")
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("model", nargs="+")
    return p


def _tune_parser() -> _Parser:
    p = _parser("tune")
    p.add_argument("--sizes", default=None)
    p.add_argument("--shape", default=None)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("model", nargs="+")
    return p


def _gns_parser() -> _Parser:
    p = _parser("gns")
    p.add_argument("--dataset-size", type=int, default=None)
    return p


def _stacks_parser() -> _Parser:
    p = _parser("stacks")
    p.add_argument("--ranks", default=None)
    p.add_argument("--all", dest="all_threads", action="store_true")
    return p


def _bare(name: str) -> Callable[[], _Parser]:
    """The parser of a subcommand that takes no options."""
    return lambda: _parser(name)


# Every subcommand's parser but `run`'s (its arguments are the script's); docs/reference.md is checked against them.
PARSERS: dict[str, Callable[[], _Parser]] = {
    "start": _start_parser,
    "status": _bare("status"),
    "stop": _bare("stop"),
    "restart": _bare("restart"),
    "config": _config_parser,
    "runs": _runs_parser,
    "autoreload": lambda: _one_arg("autoreload"),
    "wait": _bare("wait"),
    "attach": lambda: _one_arg("attach", "cluster_id", choices=None),
    "detach": _bare("detach"),
    "report": _report_parser,
    "search": search_parser,
    "scaling": _scaling_parser,
    "throughput": _throughput_parser,
    "tune": _tune_parser,
    "gns": _gns_parser,
    "stacks": _stacks_parser,
    "collectives": lambda: _one_arg("collectives"),
    "debug": lambda: _one_arg("debug", "rank", type=int, choices=None),
    "help": lambda: _one_arg("help", "topic", choices=None),
}


def _split(line: str, magic: str = "%dtrain") -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise DtworkError(f"{magic}: cannot parse {line!r}: {exc}") from None


def plan_start(argv: list[str]) -> Cluster:
    """Parse ``%dtrain start`` options into a validated, not yet started, Cluster."""
    from dtwork.cluster import Cluster, ClusterSpec

    ns = vars(_start_parser().parse_args(argv))
    ns.pop("new")
    return Cluster(spec=ClusterSpec.of(**{k: v for k, v in ns.items() if v is not None}))
