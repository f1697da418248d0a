"""``python -m benchmarks [--smoke] [--out DIR] [--report-only] [--doc PATH | --no-doc]``.

Runs every measurement side by side in one run, writes ``DIR/results.json`` (default
``benchmarks/results/``), ``DIR/plots.html``, ``DIR/summary.md`` and (full runs) ``docs/benchmarks.md``,
and prints the ratios. ``--smoke`` runs a few steps of everything (for the test suite).
``--report-only`` regenerates the plots and documents from an existing ``DIR/results.json``.
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

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results"
DEFAULT_DOC = ROOT / "docs" / "benchmarks.md"


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--smoke", action="store_true", help="a few steps of everything (well under 2 minutes)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where results.json and the plots go")
    ap.add_argument(
        "--report-only", action="store_true", help="regenerate plots and docs from DIR/results.json"
    )
    ap.add_argument(
        "--doc",
        type=Path,
        default=None,
        help=f"the markdown summary to write (default {_relative(DEFAULT_DOC)} "
        "for full runs, none for --smoke)",
    )
    ap.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks.md")
    args = ap.parse_args(argv)

    from benchmarks import report

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        results = report.load(out)
    else:
        from benchmarks import suite
        from benchmarks.util import exit_on_sigterm

        exit_on_sigterm()  # so that a killed run still stops the engines it started
        # The run store of the benchmark's clusters goes to a temporary place, not ./.dtwork.
        store_dir = None
        if not os.environ.get("DTWORK_STORE"):
            store_dir = tempfile.mkdtemp(prefix="dtwork-bench-store-")
            os.environ["DTWORK_STORE"] = os.path.join(store_dir, "runs.sqlite")
        cmd = "python -m benchmarks" + "".join(
            f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)
        )
        plan = suite.Plan.smoke_plan() if args.smoke else suite.Plan()
        try:
            results = suite.run(plan, cmd)
        finally:
            if store_dir:
                shutil.rmtree(store_dir, ignore_errors=True)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        if not results["meta"].get("smoke"):
            results = report.with_long_live(results, out)
    doc = None
    if not args.no_doc:
        doc = args.doc if args.doc is not None else (None if results["meta"].get("smoke") else DEFAULT_DOC)
    written = report.write_all(results, out, doc, _relative(out / "results.json"))
    print("\n".join(report.summary_lines(results)))
    made = written if args.report_only else [out / "results.json", *written]
    print("\nwrote " + ", ".join(_relative(p) for p in made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
