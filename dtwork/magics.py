"""``%dtrain`` and ``%%dtrain``: argument parsing only; everything else is the library's."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from IPython.core.magic import Magics, line_cell_magic, magics_class

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
  status          the ranks, hosts, devices, backend and state
  stop            stop every engine and the controller
  restart         same ranks and settings, fresh engines and process group
  config EXP.yaml load an experiment config on every rank as ``ctx.config`` (starts a new run)
  runs [list|show ID|compare A B [C ...]|export [ID] --tensorboard DIR|--mlflow URI|--report PATH]
                  the runs in the run store, as ``dtwork runs`` in a shell
  run SCRIPT.py [ARGS...]
                  run a torchrun-style script unchanged on every rank (also %run in %%dtrain)
  autoreload [on|off]
                  reload the notebook folder's modules edited on disk before each cell (on)
  wait | attach   bring a background (--bg) cell back: live view, wait for its end
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
  report [PATH.ipynb] [--run ID] [--html] [--verify]
                  export a run as a notebook that re-runs to the same numbers

Cell magic ``%%dtrain [--rank0] [--ranks 0,1] [--bg] [--quiet]``:
  Run the cell on every rank (or those named) in a persistent namespace where ``ctx``
  is defined. Output is grouped by rank (--rank0: rank 0's only). --bg returns at once
  and trains in the background. When some ranks raise, the first failing rank's
  traceback is shown once, with one status line per other rank. --quiet shows no live view
  and discards the cell's print output and results on every rank (records are still stored).

The full reference (every option, every ctx helper): docs/reference.md.
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
    return p


def cell_parser() -> _Parser:
    p = _parser("%%dtrain")
    p.add_argument("--rank0", action="store_true")
    p.add_argument("--ranks", type=str, default=None)
    p.add_argument("--bg", action="store_true")
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
    "attach": _bare("attach"),
    "report": _report_parser,
    "scaling": _scaling_parser,
    "throughput": _throughput_parser,
    "tune": _tune_parser,
    "gns": _gns_parser,
    "stacks": _stacks_parser,
    "collectives": lambda: _one_arg("collectives"),
    "debug": lambda: _one_arg("debug", "rank", type=int, choices=None),
}


def _split(line: str, magic: str = "%dtrain") -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise DtworkError(f"{magic}: cannot parse {line!r}: {exc}") from None


def plan_start(argv: list[str]) -> Cluster:
    """Parse ``%dtrain start`` options into a validated, not yet started, Cluster."""
    from dtwork.cluster import Cluster, ClusterSpec

    ns = _start_parser().parse_args(argv)
    return Cluster(spec=ClusterSpec.of(**{k: v for k, v in vars(ns).items() if v is not None}))


def current() -> Cluster:
    """The newest running cluster of this kernel (``dtwork.start()`` ones too), or a one-line error."""
    from dtwork import cluster

    return cluster.current()


def _clusters() -> list[Cluster]:
    from dtwork import cluster

    return cluster.clusters()


def _running() -> list[Cluster]:
    return [c for c in _clusters() if c.refresh() == "running"]


@magics_class
class DtrainMagics(Magics):
    @line_cell_magic
    def dtrain(self, line: str, cell: str | None = None) -> None:
        if cell is not None:
            self._cell(line, cell)
            return
        args = _split(line)
        if not args:
            raise DtworkError("%dtrain needs a subcommand: start, status, stop, ... (see %dtrain?)")
        sub, rest = args[0], args[1:]
        handler = getattr(self, f"_sub_{sub.replace('-', '_')}", None)
        if handler is None:
            hint = did_you_mean(sub, SUBCOMMANDS)
            raise DtworkError(
                f"unknown %dtrain subcommand {sub!r}{hint}: use one of {', '.join(SUBCOMMANDS)}"
            )
        handler(rest)

    dtrain.__doc__ = HELP

    # -- subcommands -------------------------------------------------------------------------

    def _sub_start(self, argv: list[str]) -> None:
        from dtwork.widgets.cluster_view import cluster_widget

        cluster = plan_start(argv)  # options are checked first, whatever runs
        running = _running()
        if running:
            raise DtworkError(
                f"a cluster is already running in this kernel ({running[-1].cluster_id}, "
                f"{running[-1].world_size} ranks): %dtrain stop (or restart) first"
            )
        cluster.start()
        self._display(cluster_widget(cluster))
        return None

    def _sub_status(self, argv: list[str]) -> None:
        PARSERS["status"]().parse_args(argv)
        started = _clusters()
        if not started:
            raise DtworkError("no cluster was started in this kernel: %dtrain start")
        started[-1].refresh()
        self._display(started[-1])
        return None

    def _sub_stop(self, argv: list[str]) -> None:
        PARSERS["stop"]().parse_args(argv)
        live = _running()
        if not live:
            print("dtwork: no cluster is running")
            return None
        for c in live:
            c.stop()
        print(f"dtwork: stopped {', '.join(c.cluster_id for c in live)}")
        return None

    def _sub_restart(self, argv: list[str]) -> None:
        PARSERS["restart"]().parse_args(argv)
        started = _clusters()
        if not started:
            raise DtworkError("no cluster to restart: %dtrain start")
        cluster = started[-1]
        cluster.restart()
        print(f"dtwork: restarted: {cluster.world_size} rank(s), fresh engines and process group")
        return None

    def _sub_config(self, argv: list[str]) -> None:
        ns = _config_parser().parse_args(argv)
        cluster = current()
        cluster.configure(ns.path)
        batch = (
            f"global batch {cluster.global_batch_size}" if cluster.global_batch_size else "no global batch"
        )
        print(
            f"dtwork: {ns.path} loaded on every rank as ctx.config ({batch}); the next cell starts a new run"
        )
        return None

    def _sub_runs(self, argv: list[str]) -> None:
        for c in _running():  # a store deleted since the last write is made again before it is read
            c.session.check_store()
        actions = ["list", "show", "compare", "export"]
        if argv and not argv[0].startswith("-") and argv[0] not in actions:
            raise DtworkError(
                f"unknown %dtrain runs action {argv[0]!r}{did_you_mean(argv[0], actions)}: "
                "use list, show ID, compare A B [C ...] or export"
            )
        if argv and argv[0] in actions:  # the shell's `dtwork runs ...`
            from dtwork.cli import main as cli_main

            live = _running()
            store = live[-1].store_file if live else None
            try:
                cli_main(["runs", *(["--store", str(store)] if store else []), *argv])
            except SystemExit as exc:  # argparse refused the arguments (it said why above) or showed help
                if exc.code:
                    raise DtworkError(f"%dtrain runs {argv[0]}: see the usage above (%dtrain?)") from None
            return None
        ns = _runs_parser().parse_args(argv)
        from dtwork.cli import runs_table
        from dtwork.store.runs import store_path

        live = _running()

        named = ns.store or (live[-1].store_file if live else None)
        try:
            print(runs_table(store_path(named)))
        except OSError as exc:  # e.g. a file name too long: is_file() raises instead of answering False
            raise DtworkError(
                f"%dtrain runs: cannot use {str(named)[:80]!r} as the run store: {exc.strerror}"
            ) from None
        return None

    def _sub_run(self, argv: list[str]) -> None:
        if not argv or argv[0].startswith("-"):
            raise DtworkError("%dtrain run needs a script: %dtrain run SCRIPT.py [ARGS...]")
        current().run_script(argv[0], argv[1:])
        return None

    def _sub_autoreload(self, argv: list[str]) -> None:
        ns = PARSERS["autoreload"]().parse_args(argv)
        session = current().session
        if ns.state is not None:
            session.autoreload = ns.state == "on"
        what = "reload" if session.autoreload else "do not reload"
        print(
            f"dtwork: cells {what} the notebook folder's modules edited on disk (%dtrain autoreload on|off)"
        )
        return None

    def _sub_wait(self, argv: list[str], name: str = "wait") -> None:
        PARSERS[name]().parse_args(argv)  # an error names the subcommand as typed
        result = current().session.wait_background()
        if result is None:
            print("dtwork: no background cell")
        return None

    def _sub_attach(self, argv: list[str]) -> None:
        self._sub_wait(argv, "attach")

    def _sub_report(self, argv: list[str]) -> None:
        ns = _report_parser().parse_args(argv)
        if ns.run is not None:
            # ASCII digits only: str.isdigit() also accepts '²' and '١', and 19+ digits overflow SQLite.
            ns.run = ns.run.strip()
            if not (ns.run.isascii() and ns.run.isdigit() and len(ns.run) <= 18):
                raise DtworkError(
                    f"%dtrain report: --run takes a run id, a whole number such as 3 — got {ns.run!r}"
                )
        from dtwork.report import export, secret_environ

        live = _running() if ns.store is None else []
        store = ns.store or (live[-1].store_file if live else None)
        run = ns.run or (live[-1].session.run_id if live else None)  # the current run, else the latest
        env = secret_environ()  # the kernel's: its secrets are scrubbed wherever they appear
        report = export(run, ns.path, store=store, html=ns.html, verify=ns.verify, environ=env)
        print(report.describe())
        return None

    # -- analysis: scaling, data loading, bucket size, noise scale ------------------------

    def _sub_scaling(self, argv: list[str]) -> None:
        from dtwork import commands

        ns = _scaling_parser().parse_args(argv)
        mode_name = ns.mode or "weak"
        commands.scaling(
            current(),
            " ".join(ns.model),
            slots=_int_list(ns.slots) if ns.slots else None,
            mode=mode_name,
            steps=ns.steps,
            per_slot=ns.batch if mode_name == "weak" else None,
            global_batch=ns.batch if mode_name == "strong" else None,
            shape=ns.shape,
        )
        return None

    def _sub_throughput(self, argv: list[str]) -> None:
        from dtwork import commands

        ns = _throughput_parser().parse_args(argv)
        rounds = (min(3, ns.rounds), ns.rounds)
        commands.throughput(current(), " ".join(ns.model), ns.data, steps=ns.steps, rounds=rounds)
        return None

    def _sub_tune(self, argv: list[str]) -> None:
        from dtwork import commands

        ns = _tune_parser().parse_args(argv)
        sizes = commands.DEFAULT_SIZES
        if ns.sizes:
            try:
                sizes = tuple(float(v) for v in ns.sizes.split(",") if v.strip())
            except ValueError:
                raise DtworkError(
                    f"--sizes takes bucket sizes in MB such as 1,4,16 — got {ns.sizes!r}"
                ) from None
        commands.tune_buckets(current(), " ".join(ns.model), sizes=sizes, steps=ns.steps, shape=ns.shape)
        return None

    def _sub_gns(self, argv: list[str]) -> None:
        from dtwork import commands

        ns = _gns_parser().parse_args(argv)
        commands.gns_advice(current(), dataset_size=ns.dataset_size)
        return None

    def _sub_collectives(self, argv: list[str]) -> None:
        from dtwork import commands

        commands.check_collectives(current(), PARSERS["collectives"]().parse_args(argv).state)

    def _sub_debug(self, argv: list[str]) -> None:
        current().debug(PARSERS["debug"]().parse_args(argv).rank)

    def _sub_stacks(self, argv: list[str]) -> None:
        from dtwork import commands

        ns = _stacks_parser().parse_args(argv)
        commands.show_stacks(current(), _int_list(ns.ranks) if ns.ranks else None, all_threads=ns.all_threads)

    # -- the cell magic ----------------------------------------------------------------------

    def _cell(self, line: str, cell: str) -> None:
        ns = cell_parser().parse_args(_split(line, "%%dtrain"))
        ranks = _int_list(ns.ranks) if ns.ranks else None
        cluster = current()
        cluster.run(cell, ranks=ranks, rank0=ns.rank0, bg=ns.bg, quiet=ns.quiet)
        if ns.bg:
            print("dtwork: training in the background; %dtrain wait (or attach) brings it back")
        return None

    def _display(self, obj: object) -> None:  # anything IPython can display
        from IPython.display import display

        display(obj)


SUBCOMMANDS = sorted(n[len("_sub_") :] for n in dir(DtrainMagics) if n.startswith("_sub_"))
