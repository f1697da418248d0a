"""``python -m dtwork run NOTEBOOK``: execute a notebook headlessly, write the executed copy under reports/.

``python -m dtwork script NOTEBOOK -o train.py``: write its ``%%dtrain`` cells as a torchrun script.

``python -m dtwork doctor [--gpu]``: check this installation end to end and print a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def run_notebook(path: Path, out_dir: Path, timeout: int = 900) -> Path:
    """Execute ``path`` with nbclient (cwd: the notebook's folder); write ``out_dir/<name>``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / path.name
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(Path.cwd())}}
    )
    t0 = time.monotonic()
    print(f"dtwork: executing {path} ({len(nb.cells)} cells) ...", flush=True)
    try:
        client.execute()
    except CellExecutionError as exc:
        nbformat.write(nb, out)
        print(f"dtwork: {path} failed; the partial run is in {out}\n{exc}", file=sys.stderr)
        raise SystemExit(1) from None
    nbformat.write(nb, out)
    print(f"dtwork: executed {path} in {time.monotonic() - t0:.0f} s -> {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtwork", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute a notebook headlessly")
    run.add_argument("notebook", type=Path)
    run.add_argument("--out", type=Path, default=Path("reports"))
    run.add_argument("--timeout", type=int, default=900)
    script = sub.add_parser("script", help="write a notebook's %%%%dtrain cells as a torchrun script")
    script.add_argument("notebook", type=Path)
    script.add_argument("-o", "--output", type=Path, default=None, help="default: NOTEBOOK.py beside it")
    doctor = sub.add_parser("doctor", help="check this installation end to end (--gpu: the GPU path too)")
    doctor.add_argument("--gpu", action="store_true", help="also check NCCL, AMP and throughput on the GPUs")
    doctor.add_argument("-n", type=int, default=2, help="CPU ranks for the CPU checks (default 2)")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from dtwork.doctor import main as run_doctor

        return run_doctor(gpu=args.gpu, n=args.n)
    if not args.notebook.exists():
        parser.error(f"no notebook at {args.notebook}")
    if args.command == "script":
        from dtwork.errors import DtworkError
        from dtwork.script_export import write_script

        try:
            out = write_script(args.notebook, args.output or args.notebook.with_suffix(".py"))
        except DtworkError as exc:
            parser.exit(2, f"dtwork: {exc}\n")
        print(f"dtwork: wrote {out}; run it with torchrun --nproc_per_node=N {out}")
        return 0
    run_notebook(args.notebook, args.out, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
