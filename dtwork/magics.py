"""``%dtrain`` and ``%%dtrain``: argument parsing only; everything else is the library's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from IPython.core.magic import Magics, line_cell_magic, magics_class

from dtwork.commands.parsers import HELP, PARSERS, _int_list, _split, cell_parser, plan_start, search_parser
from dtwork.errors import DtworkError, did_you_mean

if TYPE_CHECKING:
    from dtwork.cluster import Cluster


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
        from dtwork.commands import keep
        from dtwork.widgets.cluster_view import cluster_widget

        cluster = plan_start(argv)  # options are checked first, whatever runs
        running = _running()
        if running:
            raise DtworkError(
                f"a cluster is already running in this kernel ({running[-1].cluster_id}, "
                f"{running[-1].world_size} ranks): %dtrain stop (or restart) first"
            )
        if "--new" not in argv and keep.offer():  # warm ranks wait in this folder: start nothing
            return None
        cluster.start()
        self._display(cluster_widget(cluster))
        return None

    def _sub_status(self, argv: list[str]) -> None:
        PARSERS["status"]().parse_args(argv)
        from dtwork.kernel import kept
        from dtwork.launch import registry

        started = _clusters()
        waiting = registry.orphans()
        if not started and not waiting:
            raise DtworkError("no cluster was started in this kernel: %dtrain start")
        if started:
            started[-1].refresh()
            self._display(started[-1])
            keep = started[-1].engines.spec.keep_seconds
            if keep and started[-1].state == "running":
                print(
                    f"dtwork: kept {registry.duration(keep)} after this kernel ends (%dtrain attach takes it up)"
                )
        for entry in waiting:
            print(f"dtwork: kept {kept.describe(entry)}: %dtrain attach {entry['cluster_id']}")
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

    def _sub_detach(self, argv: list[str]) -> None:
        PARSERS["detach"]().parse_args(argv)
        cluster = current()
        cluster.detach()
        print(
            f"dtwork: let go of {cluster.cluster_id}: %dtrain attach {cluster.cluster_id} in another notebook"
        )
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
        ns = PARSERS["config"]().parse_args(argv)
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
        actions = ["list", "searches", "show", "compare", "export"]
        if argv and not argv[0].startswith("-") and argv[0] not in actions:
            raise DtworkError(
                f"unknown %dtrain runs action {argv[0]!r}{did_you_mean(argv[0], actions)}: "
                "use list, searches, show ID, compare A B [C ...] or export"
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
        ns = PARSERS["runs"]().parse_args(argv)
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

    def _sub_help(self, argv: list[str]) -> None:
        from dtwork.commands.reference import help_text

        print(help_text(PARSERS["help"]().parse_args(argv).topic))
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
        from dtwork.commands import keep
        from dtwork.widgets.cluster_view import cluster_widget

        ns = PARSERS["attach"]().parse_args(argv)
        running = _running()
        if ns.cluster_id is None and running:  # this kernel's own cluster: its background cell
            self._sub_wait([], "attach")
            return None
        if running:
            raise DtworkError(
                f"a cluster is already running in this kernel ({running[-1].cluster_id}): "
                "%dtrain stop it first, then %dtrain attach"
            )
        self._display(cluster_widget(keep.attach(ns.cluster_id)))
        return None

    def _sub_report(self, argv: list[str]) -> None:
        ns = PARSERS["report"]().parse_args(argv)
        if ns.run is not None:
            # ASCII digits only: str.isdigit() also accepts '²' and '١', and 19+ digits overflow SQLite.
            ns.run = ns.run.strip()
            if not (ns.run.isascii() and ns.run.isdigit() and len(ns.run) <= 18):
                raise DtworkError(
                    f"%dtrain report: --run takes a run id, a whole number such as 3 — got {ns.run!r}"
                )
        from dtwork.report import export, export_search, secret_environ

        live = _running() if ns.store is None else []
        store = ns.store or (live[-1].store_file if live else None)
        if ns.search is not None:  # a search's report: its trials, curves and hyperparameters
            print(
                export_search(
                    ns.search, ns.path, store=store, html=ns.html, environ=secret_environ()
                ).describe()
            )
            return None
        run = ns.run or (live[-1].session.run_id if live else None)  # the current run, else the latest
        env = secret_environ()  # the kernel's: its secrets are scrubbed wherever they appear
        report = export(run, ns.path, store=store, html=ns.html, verify=ns.verify, environ=env)
        print(report.describe())
        return None

    # -- analysis: scaling, data loading, bucket size, noise scale ------------------------

    def _sub_scaling(self, argv: list[str]) -> None:
        from dtwork import commands

        ns = PARSERS["scaling"]().parse_args(argv)
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

        ns = PARSERS["throughput"]().parse_args(argv)
        rounds = (min(3, ns.rounds), ns.rounds)
        commands.throughput(current(), " ".join(ns.model), ns.data, steps=ns.steps, rounds=rounds)
        return None

    def _sub_tune(self, argv: list[str]) -> None:
        from dtwork import commands

        ns = PARSERS["tune"]().parse_args(argv)
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

        ns = PARSERS["gns"]().parse_args(argv)
        commands.gns_advice(current(), dataset_size=ns.dataset_size)
        return None

    def _sub_collectives(self, argv: list[str]) -> None:
        from dtwork import commands

        commands.check_collectives(current(), PARSERS["collectives"]().parse_args(argv).state)

    def _sub_debug(self, argv: list[str]) -> None:
        current().debug(PARSERS["debug"]().parse_args(argv).rank)

    def _sub_stacks(self, argv: list[str]) -> None:
        from dtwork import commands

        ns = PARSERS["stacks"]().parse_args(argv)
        commands.show_stacks(current(), _int_list(ns.ranks) if ns.ranks else None, all_threads=ns.all_threads)

    def _sub_search(self, argv: list[str]) -> None:
        self._search(argv, None)

    def _search(self, argv: list[str], cell: str | None) -> None:
        """A search: a new one runs the cell; ``--resume ID`` goes on with a stopped one, with its stored
        file and code where none (or an empty cell) is given."""
        from dtwork.commands.search import search

        found = search_parser().parse_args(argv)
        if found.resume is None and (cell is None or found.path is None):
            raise DtworkError(
                "a search is a cell: %%dtrain search EXP.yaml over the trials' code "
                "(%dtrain search --resume ID goes on with a stopped one)"
            )
        code = cell if cell is not None and (cell.strip() or found.resume is None) else None
        result = search(found.path, code, quiet=found.quiet, resume=found.resume)
        if found.quiet:  # the cells were quiet; the trials' table is what the magic shows
            print(result.table())

    # -- the cell magic ----------------------------------------------------------------------

    def _cell(self, line: str, cell: str) -> None:
        words = _split(line, "%%dtrain")
        if words[:1] == ["search"]:
            return self._search(words[1:], cell)
        ns = cell_parser().parse_args(words)
        ranks = _int_list(ns.ranks) if ns.ranks else None
        cluster = current()
        if ns.name is not None and ns.bg:
            raise DtworkError("%%dtrain --name waits for the cell: drop --bg, or name the run after it")
        try:
            cluster.run(cell, ranks=ranks, rank0=ns.rank0, bg=ns.bg, quiet=ns.quiet)
        finally:  # a failed cell's run is named too: it is the one to find
            if ns.name is not None:
                cluster.name_run(ns.name)
        if ns.bg:
            print("dtwork: training in the background; %dtrain wait (or attach) brings it back")
        return None

    def _display(self, obj: object) -> None:  # anything IPython can display
        from IPython.display import display

        display(obj)


SUBCOMMANDS = sorted(n[len("_sub_") :] for n in dir(DtrainMagics) if n.startswith("_sub_"))
