"""results.json (and live.json) -> the tables of docs/benchmarks.md: the prose is written by hand, and
only what lies between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->`` is replaced.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from benchmarks import adaptive as adaptive_mod
from benchmarks.util import PACKAGES

KINDS = ("mlp", "convnet")
NOISE = " (within noise: the 95% interval spans the target)"
LABELS = {
    "dtwork": "dtwork %%dtrain (same code: DDP + hand loop)",
    "dtwork_steps": "dtwork %%dtrain idiomatic (ctx.wrap + ctx.steps + ctx.log)",
    "raw_ipyparallel": "raw ipyparallel %px + hand-written DDP setup",
    "torchrun": "torchrun --nproc_per_node=2",
    "accelerate": "HuggingFace Accelerate notebook_launcher",
    "fabric": "Lightning Fabric (strategy ddp_notebook)",
}


def fmt(x: Any, nd: int = 3) -> str:
    number = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return f"{x:.{nd}f}" if number else "n/a"


def pct(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{nd}f}%"


def ci(x: list[float] | None, nd: int = 3) -> str:
    return f"{x[0]:.{nd}f}-{x[1]:.{nd}f}" if x else "n/a"


def verdict(ratio: float | None, ci95: list[float] | None, target: float) -> str:
    """Met or not by the reading (higher is better); "within noise" when the interval spans the target."""
    if ratio is None:
        return "n/a"
    noise = NOISE if ci95 and ci95[0] < target <= ci95[1] else ""
    return ("**met**" if ratio >= target else "**not met**") + noise


def table(head: str, rows: list[list[Any]]) -> str:
    """A markdown table; ``head`` names the columns, separated by " | "."""
    lines = [f"| {head} |", "|" + "---|" * (head.count(" | ") + 1)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


CYCLES = "on ÷ off (median of cycles) | 95% interval | ratio of the totals | cycle SD"


def _cycles(p: dict[str, Any]) -> list[str]:
    return [fmt(p["ratio"]), ci(p["ci95"]), fmt(p["ratio_of_totals"]), pct(p["pair_sd"])]


def _cpu(p: dict[str, Any]) -> str:
    return f"{fmt((p.get('cpu') or {}).get('ratio'))} ({ci((p.get('cpu') or {}).get('ci95'))})"


def run_table(r: dict[str, Any]) -> str:
    m, mach, v = r["meta"], r["meta"]["machine"], r["meta"]["versions"]
    commit = f", dtwork {m['dtwork_commit']}" if m.get("dtwork_commit") else ""
    cpu = f"{mach['cpu_model']}, {mach['logical_cpus']} logical / {mach['physical_cpus']} physical cores"
    rows = [["command", f"`{m['command']}`"], ["started", f"{m['started']}{commit}, {m['duration_s']:.0f} s"]]
    rows += [["CPU", cpu], ["memory", f"{mach['memory_gib']} GiB"]]
    rows += [["load average", f"at start {mach['load_average_at_start']}, at end {m['load_average_at_end']}"]]
    return table(" | ", rows + [[p, v.get(p) or "not installed"] for p in ("python", *PACKAGES)])


def targets_table(r: dict[str, Any]) -> str:
    rows = []
    for t in r["targets"]:
        met = "n/a" if t["met"] is None else ("**met**" if t["met"] else "**not met**")
        met += NOISE if t.get("conclusive") is False else ""
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
        speed = lat / dt_latency if lat and dt_latency else None
        cells += [fmt(row["cold_start_s"], 2), fmt(lat), fmt(speed, 1)]
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
        ["attach to a kept cluster from a fresh process (s)", med(cold.get("attach_s", {})), "", "", ""],
        ["round trip of a trivial cell (ms)", med(rt["dtwork_quiet_s"], 1e3, 1), med(rt["raw_px_s"], 1e3, 1),
         "", ""],
        ["the same, autoreload on / off, in turns (ms)",
         f"{med(rt.get('autoreload', {}).get('on', {}), 1e3, 1)} / {med(rt.get('autoreload', {}).get('off', {}), 1e3, 1)}",
         "", "", ""],
        ["autoreload's own check on a rank, per cell (ms)",
         med(rt.get("autoreload", {}).get("rank_check_s", {}), 1e3, 3), "", "", ""],
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
    head = "workload | blocks | cycles | window (steps) | dtwork steps/s | torchrun steps/s | dtwork ÷ "
    head += "torchrun (geometric mean of blocks) | 95% interval (over blocks) | block ratios | block SD"
    head += " | cycles pooled"
    return table(head + " | >= 0.98", rows)


def _windows(ps: dict[str, Any], goal: float, nd: int = 3, cpu: bool = False, head: str = "workload") -> str:
    """Windows alternating inside one loop: a row for each of ``ps``."""
    rows = [[k, p["cycles"], fmt(p["window_s"], nd), *_cycles(p), *([_cpu(p)] if cpu else []),
             verdict(p["ratio"], p["ci95"], goal)] for k, p in ps.items()]  # fmt: skip
    return table(f"{head} | cycles | window (s) | {CYCLES}{' | in CPU seconds' * cpu} | >= {goal}", rows)


def live_table(r: dict[str, Any]) -> str:
    return _windows({k: r["live_interleaved"][k] for k in KINDS}, 0.99, 2, cpu=True)


def live_long_table(long: dict[str, Any]) -> str:
    rows = []
    for k in KINDS:
        for mode, p in long["pooled"].get(k, {}).items():
            goal = verdict(p["ratio"], p["ci95"], 0.99) if mode == "ab" else "1.0 (control)"
            rows.append([k + " A/A" * (mode == "aa"), p["runs"], p["cycles"], *_cycles(p), _cpu(p), goal])
    sent, ranks = long["kernel"], f"{long['ranks']} rank" + ("s" if long["ranks"] > 1 else "")
    widget = sent["messages"].get("comm_msg", 0)
    text = f"\n\n`{long['command']}`, started {long['started']}, {long['duration_s'] / 60:.0f} min, "
    text += f"dtwork {long['dtwork_commit']}, {ranks}; the kernel sent {widget:,} widget messages "
    text += f"({widget / sent['seconds']:.1f} a second), read here at {pct(sent['client_cpu_share'], 2)}"
    text += " of a core."
    return table(f"workload | runs | cycles | {CYCLES} | in CPU seconds | >= 0.99", rows) + text


def gns_table(r: dict[str, Any]) -> str:
    return _windows({k: r["gns_interleaved"][k] for k in KINDS}, 0.97)


def handloop_table(r: dict[str, Any]) -> str:
    names = {"wrap": "hand loop + dtwork's live view (ctx.wrap)", "steps": "ctx.steps' bookkeeping"}
    return _windows({names[a]: p for a, p in r["handloop"].items()}, 0.98, head="MLP, ÷ plain DDP hand loop")


def script_rerun_table(r: dict[str, Any]) -> str:
    sr, s = r["script_rerun"], r["script_rerun"]["seconds"]
    rows = [[sr["script"], sr["epochs"], len(s["dtwork"]["runs"]), fmt(s["dtwork"]["median"]),
             fmt(s["torchrun"]["median"], 2), fmt(sr["speedup"], 1), ci(sr["speedup_ci95"], 0),
             fmt(sr["first_warm_run_s"], 1), verdict(sr["speedup"], sr["speedup_ci95"], 10)]]  # fmt: skip
    head = "script | epochs | turns | warm re-run (s) | torchrun relaunch (s) | x faster | 95% interval"
    return table(head + " | first warm run (s) | >= 10", rows)


def kernel_scale_table(r: dict[str, Any]) -> str:
    rows = [[x["ranks"], pct(x["cpu_share"]), fmt(x["redraw_interval_s"], 2), fmt(x.get("figure_interval_s"), 1),
             fmt(x["store_mb_per_hour"], 3)] for x in r["kernel_scale"]]  # fmt: skip
    head = "ranks | kernel CPU (share of one core) | redraw interval (s) | long cell's figures drawn again every (s)"
    return table(head + " | store (MB per hour)", rows)


LONG_RUN_TARGETS = {"sidebar_list_s": 0.05, "run_card_s": 0.05, "reopened_figure_s": 0.5, "runs_show_s": 1.0,
                    "report_export_s": 15.0}  # fmt: skip


def long_run_table(r: dict[str, Any]) -> str:
    """Each reader's seconds after 10 minutes and at the end of each simulated run, and its target."""
    rows = []
    for x in r["long_run"]:
        a, b = x["after_10_min"], x["at_end"]
        run = f"{x['ranks']} ranks x {x['hours']:g} h"
        for k, goal in LONG_RUN_TARGETS.items():
            grew = b[k] / a[k] if a[k] else None
            ok = "yes" if b[k] <= goal and (grew is None or grew <= 2) else "no"
            rows.append(
                [
                    run,
                    k.removesuffix("_s").replace("_", " "),
                    fmt(a[k]),
                    fmt(b[k]),
                    fmt(grew, 2),
                    f"<= {goal:g}",
                    ok,
                ]
            )
        ok = "yes" if b["store_mib"] <= 100 else "no"
        rows.append([run, "store (MiB)", fmt(a["store_mib"], 1), fmt(b["store_mib"], 1), "", "<= 100", ok])
        grew = x.get("kernel_rss_growth_mib", x.get("writer_rss_growth_mib"))
        rows.append(
            [run, "kernel RSS growth (MiB)", "", fmt(grew, 1), "", "<= 200", "yes" if grew <= 200 else "no"]
        )
        if "kernel_cpu_share" in x:
            rows.append([run, "kernel CPU (share of a core)", "", fmt(x["kernel_cpu_share"], 3), "", "", ""])
        rows.append([run, "write (rows/s)", "", fmt(x["write_rows_per_s"], 0), "", "", ""])
    return table("run | reader | after 10 min (s) | at the end (s) | end / 10 min | target | met", rows)


def _s(x: Any, nd: int = 2) -> str:
    return "not reached" if x == math.inf else fmt(x, nd)


def _taken(changes: list[list[float]]) -> str:
    """The global batches a run took, in order (a change of the LR alone is not a new batch)."""
    batches = [int(c[1]) for c in changes]
    return " → ".join(str(b) for i, b in enumerate(batches) if i == 0 or b != batches[i - 1])


def adaptive_table(r: dict[str, Any]) -> str:
    """Issue 36: B_simple's growth, the grid of fixed batches, the adaptive arm, and the gates."""
    a, meta = r["adaptive"], r["meta"].get("phases", {}).get("adaptive", r["meta"])
    p = a["plan"]
    g = a["b_simple"] or dict(start=None, end=None, end_samples=None, growth=None, ok=False)
    grows = "**yes**" if g["ok"] else "**no**: the workload does not show what the phase tests"
    text = f"`{meta['command']}`, started {meta['started']}, dtwork {meta.get('dtwork_commit')}, "
    text += f"{a['duration_s']:.0f} s. Floor: entropy rate {a['floor']['entropy_rate']:.4f} nats (the "
    text += f"validation set's own chain loss {fmt(a['floor'].get('val_chain_loss'), 4)}); target "
    text += f"{a['target']:.4f} (+{p['margin']}). B_simple along a fixed run (batch {p['probe_batch']}, "
    text += f"lr {p['probe_lr']}): {fmt(g['start'], 1)} at the start, {_s(g['end'], 1)} at "
    text += f"{g['end_samples']} samples (median of the last three evaluations), x{_s(g['growth'], 1)}; "
    text += f"grows at least {adaptive_mod.MIN_GROWTH:.0f}x: {grows}.\n\n"
    best = a.get("best") or {}
    rows = []
    for row in a["grid"]:
        mark = "**" if (row["batch"], row["lr"]) == (best.get("batch"), best.get("lr")) else ""
        cells = [_s(row["seconds"]), _s(row["steps"], 0), _s(row["samples"], 0), fmt(row["compute_s"], 1)]
        rows.append([f"{mark}{row['batch']}{mark}", row["lr"], f"{row['reached']}/{row['runs']}", *cells])
    ad = a["adaptive_summary"]
    start = f"adaptive from {p['start_batch']} (max {p['max_global_batch']})"
    cells = [_s(ad.get("seconds")), _s(ad.get("steps"), 0), _s(ad.get("samples"), 0), fmt(ad["compute_s"], 1)]
    rows.append([start, p["start_lr"], f"{ad['reached']}/{ad['runs']}", *cells])
    head = "global batch | lr | reached | median wall s to target | steps | samples | compute (s, all seeds)"
    text += table(head, rows)
    if a["adaptive"]:
        per = [
            [x["seed"], _s(x["seconds"]), _s(x["samples"], 0), _taken(x["batches"])] for x in a["adaptive"]
        ]
        text += "\n\n" + table("adaptive seed | wall s | samples | global batches taken", per)
    gates = a["gates"]
    rows = []
    if gates:
        w = gates["wall"]
        per = ", ".join(_s(v) for v in w["per_seed"])
        rows.append(
            [
                "wall time ÷ the best fixed batch's median <= 0.8, in >= 4 of 5 seeds",
                f"{w['seeds_met']} seeds ({per})",
                "**met**" if w["met"] else "**not met**",
            ]
        )
        for key, what in (
            ("samples", "samples to target ÷ the best's <= 1.1"),
            ("compute", "compute ÷ the whole grid's <= 1/3"),
        ):
            rows.append([what, fmt(gates[key]["ratio"]), "**met**" if gates[key]["met"] else "**not met**"])
    else:
        why = "; ".join(a["errors"])[:600] or "no run reached the target"
        rows.append(["all gates", "not measured", f"**not run**: {why}"])
    rows.append([f"B_simple grows >= {adaptive_mod.MIN_GROWTH:.0f}x", f"x{_s(g['growth'], 1)}",
                 "**met**" if g["ok"] else "**not met**"])  # fmt: skip
    return text + "\n\n" + table("gate | measured | met", rows)


def fsdp_table(r: dict[str, Any]) -> str:
    f = r["fsdp"]

    def mib(x: float) -> str:
        return fmt(x / 2**20, 2)

    rows = [
        [s, fmt(f[s]["steps_per_s"]["median"], 1), mib(f[s]["memory"]["param_bytes"]),
         mib(f[s]["memory"]["grad_bytes"]), mib(f[s]["memory"]["optimizer_bytes"])]
        for s in ("ddp", "fsdp")
    ]  # fmt: skip
    rows.append(["fsdp ÷ ddp", f"{fmt(f['fsdp_vs_ddp_steps'], 2)} ({ci(f['fsdp_vs_ddp_steps_ci95'], 2)})", "", "",
                 f"parameters + optimizer state: {fmt(f['fsdp_vs_ddp_param_optimizer_memory'], 2)}"])  # fmt: skip
    head = "strategy (2 ranks) | steps/s (rank 0, median) | parameters (MiB a rank) | gradients | optimizer state"
    return table(head, rows)


def fill(doc: str, generated: dict[str, str]) -> str:
    """Replace what lies between each block's markers; a block the page lacks is an error."""
    for name, text in generated.items():
        pattern = re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end: {name} -->)", re.S)
        if not pattern.search(doc):
            raise ValueError(f"the page has no '<!-- generated: {name} -->' ... '<!-- end: {name} -->' block")
        doc = pattern.sub(lambda m, text=text: m.group(1) + text + "\n" + m.group(2), doc)
    return doc


def search_table(r: dict[str, Any]) -> str:
    """Issue 48: ASHA on rank groups against the same trials one after another, per arm."""
    x, rows = r["search"], []
    for arm, name in (("asha", "adaptive_asha on groups"), ("sequential", "one after another")):
        for i, run in enumerate(x["arms"][arm]):
            best = run["best"] or {}
            hp = ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in best.get("hparams", {}).items()
            )
            stopped = sum(s == "stopped" for s in run["statuses"])
            rows.append([name, i + 1, fmt(run["wall_s"], 1), run["batches"], stopped, fmt(run["to_best_s"], 1),
                         fmt(best.get("metric"), 4), hp])  # fmt: skip
    text = table("arm | repetition | wall s | batches trained | stopped | to its best s | best val_loss | best "
                 "trial's hyperparameters", rows)  # fmt: skip
    same = "the same" if x.get("same_trials") else "**not** the same"
    text += f"\n\nBoth arms drew {same} trials. Median wall time ASHA / one after another: "
    text += f"{fmt(x.get('wall_ratio'), 3)}; time to its best: {fmt(x.get('to_best_ratio'), 3)}."
    if x.get("errors"):
        text += " Errors: " + "; ".join(x["errors"])
    return text


def write_doc(out: Path, doc: Path) -> None:
    """The tables of ``doc`` from ``out/results.json`` and, when there, ``out/live.json``."""
    r = json.loads((out / "results.json").read_text())
    makers = {"meta": run_table, "targets": targets_table, "alternatives": alternatives_table,
              "iteration_latency": core_table, "turns": turns_table, "live_interleaved": live_table,
              "gns_interleaved": gns_table, "handloop": handloop_table, "script_rerun": script_rerun_table,
              "kernel_scale": kernel_scale_table, "adaptive": adaptive_table, "fsdp": fsdp_table,
              "long_run": long_run_table, "search": search_table}  # fmt: skip
    names = {k: make.__name__.removesuffix("_table").replace("_", "-") for k, make in makers.items()}
    generated = {names[k]: make(r) for k, make in makers.items() if k in r}
    if (out / "live.json").exists():
        generated["live-long"] = live_long_table(json.loads((out / "live.json").read_text()))
    doc.write_text(fill(doc.read_text(), generated))
