"""``python -m dtwork script NOTEBOOK -o train.py``: a notebook's ``%%dtrain`` cells as a torchrun script.

The script builds ``ctx`` from torchrun's environment (``context_from_env``) with the options the
notebook's ``%dtrain start`` gave, then runs the ``%%dtrain`` cells in order at module level, so a
notebook experiment runs as a batch job unchanged. Kernel-side cells and the other ``%dtrain``
commands (report, runs, stop ...) stay in the notebook; the script says which it left out.
"""

from __future__ import annotations

import argparse
import io
import re
import shlex
import tokenize
from pathlib import Path
from typing import Any

from dtwork.errors import DtworkError

_RUN = re.compile(r"^(\s*)%run\s+(.*)$")


def _options(prog: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, add_help=False, exit_on_error=False)


def _start_options(argv: list[str]) -> dict[str, Any]:
    """What ``%dtrain start`` decides that the ranks see: global batch, config, backend."""
    p = _options("start")
    p.add_argument("--global-batch-size", type=int, default=None)
    p.add_argument("--config", default=None)
    p.add_argument("--backend", default="auto")
    ns, _ = p.parse_known_args(argv)
    backend = None if ns.backend == "auto" else ns.backend
    return {"global_batch_size": ns.global_batch_size, "config": ns.config, "backend": backend}


def _cell_options(line: str, where: str) -> argparse.Namespace:
    p = _options("%%dtrain")
    p.add_argument("--rank0", action="store_true")
    p.add_argument("--ranks", default=None)
    p.add_argument("--bg", action="store_true")
    p.add_argument("--quiet", action="store_true")
    try:
        return p.parse_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError, SystemExit) as exc:
        raise DtworkError(f"{where}: cannot read the %%dtrain options {line!r}: {exc}") from None


def _indent(code: str, prefix: str = "    ") -> str:
    """Indent code one level, leaving the inside of multi-line strings as it is."""
    keep: set[int] = set()  # 1-based lines that continue a multi-line string
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                keep.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        pass  # the compile check below reports the cell
    lines = code.splitlines()
    return "\n".join(ln if i in keep or not ln.strip() else prefix + ln for i, ln in enumerate(lines, 1))


def _python(code: str, where: str) -> str:
    """The cell as plain Python: ``%run`` becomes ``run_script``; other IPython syntax is refused."""
    from IPython.core.inputtransformer2 import TransformerManager

    lines = []
    for line in code.splitlines():
        m = _RUN.match(line)
        if m:
            argv = shlex.split(m.group(2))
            line = f"{m.group(1)}run_script({argv[0]!r}, {argv[1:]!r}, namespace=globals())"
        lines.append(line)
    code = "\n".join(lines)
    if "get_ipython()" in TransformerManager().transform_cell(code) and "get_ipython()" not in code:
        raise DtworkError(
            f"{where} uses IPython syntax (%magic or !command) that a script cannot run: "
            "rewrite it in Python (only %run is translated)"
        )
    try:
        compile(code, where, "exec")
    except SyntaxError as exc:
        raise DtworkError(f"{where} is not valid Python: {exc.msg} (line {exc.lineno})") from None
    return code


def _cell(code: str, line: str, where: str) -> str:
    opts = _cell_options(line, where)
    body = _python(code, where)
    flags = f" {line.strip()}" if line.strip() else ""
    out = [f"# -- {where} (%%dtrain{flags}) " + "-" * max(0, 60 - len(where) - len(flags))]
    if opts.ranks:
        ranks = [int(r) for r in opts.ranks.split(",") if r.strip()]
        body = f"if ctx.rank in {tuple(ranks)!r}:\n{_indent(body) or '    pass'}"
    if opts.rank0:
        out += ["_output = rank0_output(ctx)", body, "_output.restore()"]
    else:
        out.append(body)
    return "\n".join(out)


def notebook_to_script(path: Path) -> str:
    """The torchrun script of the notebook at ``path`` (its ``%%dtrain`` cells, in order)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    start: dict[str, Any] = {"global_batch_size": None, "config": None, "backend": None}
    body: list[str] = []
    left: list[str] = []
    for i, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        where = f"cell {i}"
        first, _, rest = cell.source.lstrip().partition("\n")
        if first.startswith("%%dtrain"):
            body.append(_cell(rest, first[len("%%dtrain") :], where))
            continue
        other = []
        for line in cell.source.splitlines():
            argv = shlex.split(line[len("%dtrain") :]) if line.startswith("%dtrain ") else []
            if argv[:1] == ["start"]:
                start = _start_options(argv[1:])
            elif argv[:1] == ["config"] and len(argv) > 1:
                body.append(f"# -- {where}: %dtrain config\nctx.configure({argv[1]!r})")
            elif line.strip():
                other.append(line.strip())
        if other:
            left.append(f"#   {where}: {other[0][:80]}" + (" ..." if len(other) > 1 else ""))
    head = [
        f'"""{path.name} as a torchrun script, written by `python -m dtwork script`.',
        "",
        "Run it with: torchrun --nproc_per_node=N THIS_FILE.py",
        '"""',
        "",
        "from dtwork.runtime.scripts.torchrun_script import context_from_env, rank0_output, run_script  # noqa: F401",
        "",
        f"ctx = context_from_env({', '.join(f'{k}={v!r}' for k, v in start.items())})",
    ]
    tail = ["", "# Left in the notebook (they run in the kernel, not on the ranks):", *left] if left else []
    return "\n".join(head + ["", *("\n" + b + "\n" for b in body)] + tail).rstrip() + "\n"


def write_script(notebook: Path, out: Path) -> Path:
    """Write the torchrun script of ``notebook`` to ``out``."""
    if not notebook.is_file():
        raise DtworkError(f"no notebook at {notebook}")
    if "%%dtrain" not in notebook.read_text(encoding="utf-8"):
        raise DtworkError(f"{notebook} has no %%dtrain cell: nothing runs on the ranks")
    text = notebook_to_script(notebook)
    out.write_text(text, encoding="utf-8")
    return out
