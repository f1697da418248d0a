"""``python -m benchmarks``: every phase side by side; writes ``DIR/results.json`` (default
``benchmarks/results/``) and the tables of ``docs/benchmarks.md``, and prints the targets. ``--smoke``: a
few steps of everything; ``--only A,B``: those phases, replacing just theirs in ``DIR/results.json``;
``--report-only``: the tables from ``DIR``; ``--live MINUTES``: the live view's cost, longer.
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

from benchmarks import suite, tables, windows
from benchmarks.util import ROOT, exit_on_sigterm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="a few steps of everything; writes no page")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="where the JSON goes")
    ap.add_argument("--doc", type=Path, default=None, help="the page whose tables to write")
    ap.add_argument("--only", help=f"comma-separated phases of: {suite.PHASES}")
    ap.add_argument("--no-doc", action="store_true", help="write no page")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the tables from DIR")
    ap.add_argument("--live", type=float, metavar="MINUTES", help="the live view's on/off windows, longer")
    ap.add_argument("--ranks", type=int, default=2, help="ranks of the --live cluster")
    args = ap.parse_args(argv)
    only = args.only.split(",") if args.only else None
    if only and not set(only) <= set(suite.PHASES.split()):
        ap.error(f"--only takes phases of: {suite.PHASES}")
    cmd = shlex.join(["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)])
    exit_on_sigterm()  # a killed run still stops the engines it started
    store = tempfile.mkdtemp(prefix="dtwork-bench-store-")  # the clusters' run store, not ./.dtwork
    os.environ.setdefault("DTWORK_STORE", os.path.join(store, "runs.sqlite"))
    failed: dict[str, str] = {}
    try:
        if args.live is not None:
            if args.live < 0 or args.ranks < 1:
                ap.error("--live takes minutes >= 0 and --ranks at least 1")
            long = windows.live_long(args.live, args.ranks, args.out, cmd)
            print(tables.live_long_table(long))
        elif not args.report_only:
            plan = suite.Plan.smoke_plan() if args.smoke else suite.Plan()
            results = suite.run(plan, cmd, only)
            failed = results["meta"].get("failed", {})  # phases left out: their earlier numbers stay
            path = args.out / "results.json"
            if only and path.exists():  # the phases run replace theirs; the rest stays as measured
                new, results = results, json.loads(path.read_text())
                ran = [k for k in only if k in new]
                results.update({k: new[k] for k in ran})
                results["meta"].setdefault("phases", {}).update(dict.fromkeys(ran, new["meta"]))
            results["targets"] = suite.targets(results)
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=1, default=str) + "\n")
            print(tables.targets_table(results) + "".join(f"\n{k} FAILED: {v}" for k, v in failed.items()))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    doc = args.doc or (None if args.smoke else ROOT / "docs" / "benchmarks.md")
    if doc is not None and not args.no_doc and (args.out / "results.json").exists():
        tables.write_doc(args.out, doc)
        print(f"wrote the tables of {doc}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
