"""results.json (and live.json) -> the tables of docs/benchmarks.md and the console summary.

The page's prose is written by hand; each table sits between ``<!-- generated: NAME -->`` and
``<!-- end: NAME -->``, and only what lies between them is replaced.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from benchmarks.util import PACKAGES

KINDS = ("mlp", "convnet")
LABELS = {
    "dtwork": "dtwork %%dtrain (same code: DDP + hand loop)",
    "dtwork_steps": "dtwork %%dtrain idiomatic (ctx.wrap + ctx.steps + ctx.log)",
    "raw_ipyparallel": "raw ipyparallel %px + hand-written DDP setup",
    "torchrun": "torchrun --nproc_per_node=2",
    "accelerate": "HuggingFace Accelerate notebook_launcher",
    "fabric": "Lightning Fabric (strategy ddp_notebook)",
}


def fmt(x: Any, nd: int = 3) -> str:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return f"{x:.{nd}f}"
    return "n/a"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def ci(x: list[float] | None, nd: int = 3) -> str:
    return f"{x[0]:.{nd}f}-{x[1]:.{nd}f}" if x else "n/a"


def verdict(ratio: float | None, ci95: list[float] | None, target: float) -> str:
    """Met or not by the reading (higher is better); "within noise" when the interval spans the target."""
    if ratio is None:
        return "n/a"
    text = "**met**" if ratio >= target else "**not met**"
    if ci95 and ci95[0] < target <= ci95[1]:
        text += " (within noise: the 95% interval spans the target)"
    return text


def table(head: str, rows: list[list[Any]]) -> str:
    """A markdown table; ``head`` names the columns, separated by " | "."""
    lines = [f"| {head} |", "|" + "---|" * (head.count(" | ") + 1)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


CYCLES = "on ÷ off (median of cycles) | 95% interval | ratio of the totals | cycle SD"


def _cycles(p: dict[str, Any]) -> list[str]:
    return [
        fmt(p["ratio"]),
        ci(p["ci95"]),
        fmt(p["ratio_of_totals"]),
        pct(p["pair_sd"]),
    ]


def _cpu(p: dict[str, Any]) -> str:
    cpu = p.get("cpu") or {}
    return f"{fmt(cpu.get('ratio'))} ({ci(cpu.get('ci95'))})"


def run_table(r: dict[str, Any]) -> str:
    m, mach, v = r["meta"], r["meta"]["machine"], r["meta"]["versions"]
    commit = f", dtwork {m['dtwork_commit']}" if m.get("dtwork_commit") else ""
    rows = [
        ["command", f"`{m['command']}`"],
        ["started", f"{m['started']}{commit}, {m['duration_s']:.0f} s"],
        [
            "CPU",
            f"{mach['cpu_model']}, {mach['logical_cpus']} logical / {mach['physical_cpus']} physical cores",
        ],
        ["memory", f"{mach['memory_gib']} GiB"],
        ["load average", f"at start {mach['load_average_at_start']}, at end {m['load_average_at_end']}"],
        *([p, v.get(p) or "not installed"] for p in ("python", *PACKAGES)),
    ]
    return table(" | ", rows)


def targets_table(r: dict[str, Any]) -> str:
    rows = []
    for t in r["targets"]:
        met = "n/a" if t["met"] is None else ("**met**" if t["met"] else "**not met**")
        met += " (within noise: the 95% interval spans the target)" if t.get("conclusive") is False else ""
        rows.append([t["issue"], t["what"], t["target"], fmt(t["measured"]), ci(t.get("ci95")), met])
    return table("issue | what | target | measured | 95% interval | met", rows)


def alternatives_table(r: dict[str, Any]) -> str:
    alts, dt_latency = r["alternatives"], r["alternatives"]["dtwork"]["iteration_latency_s"]
    rows = []
    for a, label in LABELS.items():
        row = alts[a]
        if row.get("skipped"):
            rows.append([label, row["skipped"], *[""] * 6])
            continue
        sps, rel, lat = row["steps_per_s"], row["ratio_vs_torchrun"], row["iteration_latency_s"]
        cells = [fmt(sps["mlp"], 1), fmt(rel["mlp"]), fmt(sps["convnet"], 1), fmt(rel["convnet"])]
        cells += [
            fmt(row["cold_start_s"], 2),
            fmt(lat),
            fmt(lat / dt_latency if lat and dt_latency else None, 1),
        ]
        rows.append([label, *cells])
    head = "launcher | MLP steps/s | ÷ torchrun | convnet steps/s | ÷ torchrun | cold start (s)"
    return table(head + " | iteration latency (s) | ÷ dtwork's", rows)


def core_table(r: dict[str, Any]) -> str:
    cold, rt, lat = r["cold_start"], r["round_trip"], r["iteration_latency"]

    def med(d: dict[str, Any], scale: float = 1.0, nd: int = 2) -> str:
        return fmt(None if d.get("median") is None else d["median"] * scale, nd)

    torchrun = f"{med(lat['torchrun']['wall_s'])} / {med(lat['torchrun']['first_step_s'])}"
    rows = [
        ["cold start to a ready process group (s)", med(cold["dtwork_s"]), med(cold["raw_ipyparallel_s"]),
         med(cold["raw_ipyparallel_ddp_s"]), ""],
        ["round trip of a trivial cell (ms)", med(rt["dtwork_quiet_s"], 1e3, 1), med(rt["raw_px_s"], 1e3, 1),
         "", ""],
        ["changed training cell (s; torchrun: relaunch / launch to first step)",
         med(lat["dtwork"]["wall_s"], nd=3), med(lat["raw_ipyparallel"]["wall_s"], nd=3), "", torchrun],
    ]  # fmt: skip
    return table("median of each | dtwork | raw ipyparallel | raw ipyparallel + DDP setup | torchrun", rows)


def turns_table(r: dict[str, Any]) -> str:
    rows = []
    for k in KINDS:
        if t := r["turns"].get(k):
            sps, blocks = t["steps_per_s"], ", ".join(fmt(x) for x in t["block_ratios"])
            rows.append([k, t["blocks"], t["cycles"], t["steps_per_window"], fmt(sps["dtwork"], 1),
                         fmt(sps["torchrun"], 1), fmt(t["ratio"]), ci(t["ci95"]), blocks,
                         pct(t["block_sd"]), fmt(t["within_block"]["ratio_of_totals"]),
                         verdict(t["ratio"], t["ci95"], 0.98)])  # fmt: skip
    head = (
        "workload | blocks | cycles | window (steps) | dtwork steps/s | torchrun steps/s | dtwork ÷ torchrun "
    )
    head += (
        "(geometric mean of blocks) | 95% interval (over blocks) | block ratios | block SD | cycles pooled"
    )
    return table(head + " | >= 0.98", rows)


def live_table(r: dict[str, Any]) -> str:
    rows = []
    for k in KINDS:
        p = r["live_interleaved"][k]
        rows.append(
            [
                k,
                p["cycles"],
                fmt(p["window_s"], 2),
                *_cycles(p),
                _cpu(p),
                verdict(p["ratio"], p["ci95"], 0.99),
            ]
        )
    return table(f"workload | cycles | window (s) | {CYCLES} | in CPU seconds | >= 0.99", rows)


def live_long_table(long: dict[str, Any]) -> str:
    rows = []
    for k in KINDS:
        for mode, p in long["pooled"].get(k, {}).items():
            goal = verdict(p["ratio"], p["ci95"], 0.99) if mode == "ab" else "1.0 (control)"
            rows.append(
                [k + (" A/A" if mode == "aa" else ""), p["runs"], p["cycles"], *_cycles(p), _cpu(p), goal]
            )
    sent, ranks = long["kernel"], f"{long['ranks']} rank" + ("s" if long["ranks"] > 1 else "")
    widget = sent["messages"].get("comm_msg", 0)
    return table(f"workload | runs | cycles | {CYCLES} | in CPU seconds | >= 0.99", rows) + (
        f"\n\n`{long['command']}`, started {long['started']}, {long['duration_s'] / 60:.0f} min, "
        f"dtwork {long['dtwork_commit']}, {ranks}; the kernel sent {widget:,} widget messages "
        f"({widget / sent['seconds']:.1f} a second), read here at {100 * sent['client_cpu_share']:.2f}% "
        "of a core."
    )


def gns_table(r: dict[str, Any]) -> str:
    rows = []
    for k in KINDS:
        p = r["gns_interleaved"][k]
        rows.append([k, p["cycles"], fmt(p["window_s"]), *_cycles(p), verdict(p["ratio"], p["ci95"], 0.97)])
    return table(f"workload | cycles | window (s) | {CYCLES} | >= 0.97", rows)


def fill(doc: str, generated: dict[str, str]) -> str:
    """Replace what lies between each block's markers; a block the page lacks is an error."""
    for name, text in generated.items():
        pattern = re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end: {name} -->)", re.S)
        if not pattern.search(doc):
            raise ValueError(f"the page has no '<!-- generated: {name} -->' ... '<!-- end: {name} -->' block")
        doc = pattern.sub(lambda m, text=text: m.group(1) + text + "\n" + m.group(2), doc)
    return doc


def write_doc(out: Path, doc: Path) -> None:
    """The tables of ``doc`` from ``out/results.json`` and, when there, ``out/live.json``."""
    r = json.loads((out / "results.json").read_text())
    makers = [run_table, targets_table, alternatives_table, core_table, turns_table, live_table, gns_table]
    generated = {make.__name__.removesuffix("_table"): make(r) for make in makers}
    if (out / "live.json").exists():
        generated["live-long"] = live_long_table(json.loads((out / "live.json").read_text()))
    doc.write_text(fill(doc.read_text(), generated))
