"""``python -m benchmarks [--smoke] [--out DIR] [--doc PATH | --no-doc] [--report-only] [--live MINUTES]``.

Runs every measurement side by side, writes ``DIR/results.json`` (default ``benchmarks/results/``)
and the tables of ``docs/benchmarks.md`` (full runs), and prints the targets. ``--smoke`` runs a
few steps of everything; ``--report-only`` rewrites the tables from ``DIR/results.json`` and
``DIR/live.json``; ``--live MINUTES`` measures the live view's cost longer, from a real ipykernel.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks import live, suite, tables
from benchmarks.util import ROOT, exit_on_sigterm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="a few steps of everything; writes no page")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="where the JSON goes")
    ap.add_argument("--doc", type=Path, default=None, help="the page whose tables to write")
    ap.add_argument("--no-doc", action="store_true", help="write no page")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the tables from DIR")
    ap.add_argument("--live", type=float, metavar="MINUTES", help="the live view's on/off windows, longer")
    ap.add_argument(
        "--ranks", type=int, default=2, help="ranks of the --live cluster (1 leaves the kernel a core)"
    )
    args = ap.parse_args(argv)
    cmd = shlex.join(["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)])
    exit_on_sigterm()  # a killed run still stops the engines it started
    store = tempfile.mkdtemp(prefix="dtwork-bench-store-")  # the clusters' run store, not ./.dtwork
    os.environ.setdefault("DTWORK_STORE", os.path.join(store, "runs.sqlite"))
    try:
        if args.live is not None:
            if args.live < 0 or args.ranks < 1:
                ap.error("--live takes minutes >= 0 and --ranks at least 1")
            long = live.main(args.live, args.ranks, args.out, cmd)
            print(tables.live_long_table(long))
        elif not args.report_only:
            plan = suite.Plan.smoke_plan() if args.smoke else suite.Plan()
            results = suite.run(plan, cmd)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
            print(tables.targets_table(results) + "\n\n" + tables.alternatives_table(results))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    doc = args.doc or (None if args.smoke else ROOT / "docs" / "benchmarks.md")
    if doc is not None and not args.no_doc and (args.out / "results.json").exists():
        tables.write_doc(args.out, doc)
        print(f"wrote the tables of {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
