"""Elastic shapes in the whole-chain replay (issue #14): run, write the JSON, render docs/elastic.md.

    .venv/bin/python bench/sim_elastic.py             # run; docs/results/sim-chains-ls6-elastic.json + the doc
    .venv/bin/python bench/sim_elastic.py --from-head # the same, running an export of HEAD (committed code only)
    .venv/bin/python bench/sim_elastic.py --render    # only re-render docs/elastic.md from the JSON
    .venv/bin/python bench/sim_elastic.py --check     # exit 1 if the doc's block is not the JSON's rendering

The run is `chainrun sim --chains --shapes 4,2,1 --efficiency 1,0.8 --tune-score-from 2023-02-01 --json`
on the shipped LS6 slice (and, labelled in-sample, the same without the split on the whole slice,
because the scored window holds few heavy-load chains) (in a subprocess: what is written is what the CLI prints): chains of 4
nodes (12 A100s; 4 nodes is the trace's most common multi-node job size, 26 % of its node-hours),
the filler margin chosen on chains that end before February 2023, every policy scored on chains
injected from it. Only the block between ``<!-- elastic-replay:begin -->`` and
``<!-- elastic-replay:end -->`` of docs/elastic.md is written.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import REPO, git, head_state, sync_doc  # bench/ is on sys.path when a bench runs

OUT = REPO / "docs" / "results" / "sim-chains-ls6-elastic.json"
DOC = REPO / "docs" / "elastic.md"
BEGIN, END = "<!-- elastic-replay:begin -->", "<!-- elastic-replay:end -->"
ARGS = ["--chains", "--shapes", "4,2,1", "--efficiency", "1,0.8", "--tune-score-from", "2023-02-01",
        "--chains-every", "6h"]
DEV_ARGS = ["--chains", "--shapes", "4,2,1", "--efficiency", "1,0.8"]  # the whole slice, in-sample


def run(trace: str, extra: list[str], args: list[str] = ARGS, head: tuple[str, str] | None = None) -> dict:
    """``head``: (commit, folder holding an export of its ``chainrun``): run that code, not the tree's."""
    cmd = ["chainrun", "sim", "--trace", trace, *args, *extra, "--json"]
    if head:
        commit, dirty = head[0], False
        # `python -c` puts its working directory first on sys.path: run from the export itself
        exe = [sys.executable, "-c", "import sys; from chainrun.cli.main import run; sys.argv[0] = 'chainrun'; "
                                     "sys.exit(run())"]
        cwd, env = head[1], {**os.environ, "PYTHONPATH": head[1]}
    else:
        commit, dirty = head_state()  # what runs
        exe, cwd, env = [str(Path(sys.executable).with_name("chainrun"))], REPO, None
    t = time.monotonic()
    p = subprocess.run([*exe, *cmd[1:]], capture_output=True, text=True, cwd=cwd, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(p.returncode)
    env = json.loads(p.stdout)
    return {"commit": commit, "dirty": dirty, "from_head": bool(head),
            "seed": env["data"]["meta"]["seed"], "command": " ".join(cmd), "wall_s": round(time.monotonic() - t, 1),
            "chainrun": env["chainrun"], "data": env["data"]}


def trace_sizes(trace: str) -> dict:
    """Why the reference shape: jobs and share of node-hours per node count in the trace."""
    from chainrun.traces import read_trace as load_trace

    t = load_trace(trace)
    nh = t["nodes"] * (t["end"] - t["start"]).clip(lower=0) / 3600
    by = t.assign(nh=nh).groupby("nodes").agg(jobs=("nodes", "size"), node_h=("nh", "sum"))
    total = float(by["node_h"].sum())
    return {str(int(n)): {"jobs": int(r.jobs), "node_h_share": round(float(r.node_h) / total, 4)}
            for n, r in by.iterrows() if r.jobs >= 50}


# ---- rendering (tests/sim/test_elastic_doc.py checks the doc against it) -------------------------
def h(v) -> str:
    if v is None:
        return "-"
    return f"{v * 60:.0f} min" if abs(v) < 1 else f"{v:.2f} h"


def pct(v, d: int = 0) -> str:
    return "-" if v is None else f"{v * 100:.{d}f} %"


def ci(c) -> str:
    return "-" if not c or c[0] is None else f"{h(c[0])} .. {h(c[1])}"


def render(doc: dict) -> str:
    d = doc["data"]
    c, m, e = d["chains"], d["meta"], d["chains"]["elastic"]
    pols = c["policies"]
    lines = [f"`{doc['command']}` (commit {doc['commit'][:7]}{', local changes' if doc.get('dirty') else ''}, "
             f"seed {doc['seed']}, {doc['wall_s']:.0f} s wall on 2 cores; `docs/results/{OUT.name}`)", "",
             f"Chains of **{e['reference_nodes']} nodes** ({e['reference_nodes'] * e['gpus_per_node']} GPUs; work "
             f"counted at that shape), shapes {', '.join(map(str, e['shapes']))}; {c['work_h']:g} h of work in "
             f"{c['segment_h']:g} h segments, restart {c['restart_cost_min']:g} min, hand-off {c['handoff_min']:g} min; "
             f"{m['nodes']} nodes, priority {m['priority']}. A segment on n nodes does n/{e['reference_nodes']} x "
             "efficiency of the reference work per hour; the efficiency is both what the simulated segment does "
             "and what the rule is told (1.0 = linear)."]
    sizes = doc.get("trace_sizes")
    if sizes:
        lines += ["", f"Why {e['reference_nodes']} nodes: job sizes in the trace (node counts with 50 jobs or more): "
                  + ", ".join(f"{n} nodes {v['jobs']} jobs ({pct(v['node_h_share'])} of node-hours)"
                              for n, v in sizes.items())
                  + "; " + _why(sizes, e["reference_nodes"])]
    t = d.get("elastic_tune")
    if t:
        lines += ["", f"Filler margin chosen on {t['injections']} chains that end before the scored window: "
                      f"**{t['picked']}** (lowest mean overhead at efficiency {e['efficiencies'][0]:g}, to 0.01 h; "
                      "ties to the larger margin, no filler the largest; the shape rule's margin stays at "
                      f"{t['shape_margin_s'] / 60:g} min):", "",
                  "| candidate (choice window) | n | overhead | low | medium | heavy | chains that changed shape | "
                  "chains with a filler | vs predicted: low / medium / heavy |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        base = t["candidates"].get("predicted") or {}
        for name, r in t["candidates"].items():
            bl = r["by_load"]
            vs = " / ".join(_rel(bl[k]["mean_overhead_h"], (base.get("by_load") or {}).get(k, {}).get("mean_overhead_h"))
                            for k in ("low", "medium", "heavy")) if r.get("chains_elastic_share") is not None else "-"
            lines.append(f"| {name} | {r['n']} | {h(r['mean_overhead_h'])} | "
                         + " | ".join(f"{h(bl[k]['mean_overhead_h'])} ({bl[k]['n']})" for k in ("low", "medium", "heavy"))
                         + f" | {pct(r.get('chains_elastic_share'))} | {pct(r.get('chains_filler_share'))} | {vs} |")
        lines += ["", f"**Scored window** ({m['injections']} chains injected from the split on, one every "
                      f"{m['chains_every_h']:g} h of trace):"]
    lines += policy_tables(pols, e, "scored")
    dev = doc.get("development")
    if dev:
        dd = dev["data"]
        de = dd["chains"]["elastic"]
        fm = de.get("filler_margin")
        lines += ["", f"**Whole development slice, in-sample** (`{dev['command']}`, {dev['wall_s']:.0f} s wall; "
                      f"{dd['meta']['injections']} chains, one every {dd['meta']['chains_every_h']:g} h, the shipped "
                      f"margins: shape {de['margin_s'] / 60:g} min, filler "
                      f"{'off' if fm is None else f'{fm:g} boundaries'}; it contains the choice window, so it is "
                      "not a score; shown because the scored window has few or no heavy-load chains):"]
        lines += policy_tables(dd["chains"]["policies"], dd["chains"]["elastic"], "development")
    return "\n".join(lines)


def policy_tables(pols: dict, e: dict, scope: str) -> list[str]:
    lines = ["", "| policy | efficiency | n | overhead (90 % CI) | low (90 % CI) | medium (90 % CI) | heavy (90 % CI) | "
                  "slowdown | segments | segments by nodes | chains with a filler (low / medium / heavy) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, p in pols.items():
        bl = p["by_load"]
        eff = f"{p['efficiency']:g}" if "efficiency" in p else "-"
        by = ", ".join(f"{k}: {v}" for k, v in (p.get("segments_by_nodes") or {}).items()) or "-"
        lines.append(f"| {name} | {eff} | {p['n']} | {h(p['mean_overhead_h'])} ({ci(p.get('ci90_h'))}) | "
                     + " | ".join(f"{h(bl[k]['mean_overhead_h'])} ({bl[k]['n']}; {ci(bl[k]['ci90_h'])})"
                                  for k in ("low", "medium", "heavy"))
                     + f" | {h(p.get('mean_slowdown_h'))} | {(p.get('mean_segments') or 0):.2f} | {by} | {_fill(p)} |")
    lines += ["", "Issue #14's targets (vs fixed-shape `predicted` at the same reference shape; reduction = "
                  "(predicted - elastic) / predicted): heavy load >= 30 % less, no level more than 5 % above:", "",
              "| policy | low | medium | heavy | heavy >= 30 % less | never > 5 % above |", "|---|---:|---:|---:|---|---|"]
    for name, p in pols.items():
        vs = p.get("vs_predicted")
        if vs is None:
            continue
        cells = [f"{pct(vs[k]['reduction'])} ({vs[k]['n']})" if vs[k] else "- (0)" for k in ("low", "medium", "heavy")]
        heavy = vs["heavy"]
        met30 = "n/a (no heavy chain)" if not heavy else ("yes" if heavy["reduction_30pct"] else "**no**")
        within = all(v["within_5pct"] for v in vs.values() if v)
        lines.append(f"| {name} | {' | '.join(cells)} | {met30} | {'yes' if within else '**no**'} |")
    el = pols.get("predicted_elastic") or {}
    if el.get("n"):
        lines += ["", f"`predicted_elastic` ran a segment on another shape in {pct(el.get('chains_elastic_share'))} of "
                      f"the {scope} chains, a filler in {pct(el.get('chains_filler_share'))}."]
    return lines


def _fill(p: dict) -> str:
    """Share of chains with a filler, all and per load level ("-" for a policy without shapes)."""
    if p.get("chains_filler_share") is None:
        return "-"
    by = p.get("filler_share_by_load") or {}
    return f"{pct(p['chains_filler_share'])} ({' / '.join(pct(by.get(k)) for k in ('low', 'medium', 'heavy'))})"


def _rel(x, base) -> str:
    """x relative to base: +5 % = 5 % more overhead than base."""
    if x is None or not base:
        return "-"
    return f"{(x - base) / base * 100:+.0f} %"


def _why(sizes: dict, ref: int) -> str:
    wide = [n for n in sizes if int(n) > 1]
    most = max(wide, key=lambda n: sizes[n]["jobs"]) if wide else None
    if most is not None and int(most) == ref:
        return "the most common multi-node size, so a chain of it queues like the trace's own wide jobs."
    return f"the most common multi-node size is {most}."


def rendered_doc(text: str, doc: dict) -> str:
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:a] + "\n" + render(doc) + "\n" + text[b:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="ls6-a100-dev")
    ap.add_argument("--render", action="store_true", help="only re-render the doc from the JSON")
    ap.add_argument("--check", action="store_true", help="exit 1 if the doc is out of date")
    ap.add_argument("--from-head", action="store_true", help="run chainrun from an export of HEAD (committed code)")
    ap.add_argument("extra", nargs="*", help="more `chainrun sim` options, after --")
    args = ap.parse_args()
    if not (args.render or args.check):
        with tempfile.TemporaryDirectory() as tmp:
            head = None
            if args.from_head:  # the committed code only, not the shared tree's uncommitted edits
                commit = git("rev-parse", "HEAD")
                archive = subprocess.run(["git", "archive", commit, "chainrun"], cwd=REPO, capture_output=True,
                                         check=True)
                subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
                head = (commit, tmp)
            doc = run(args.trace, args.extra, head=head)
            doc["development"] = run(args.trace, args.extra, DEV_ARGS, head=head)
        doc["trace_sizes"] = trace_sizes(args.trace)
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUT} ({doc['wall_s']} s)")
    doc = json.loads(OUT.read_text())
    if not DOC.exists():  # the shipped side's page; until it exists, a title and the markers
        if args.check:
            return 1
        DOC.write_text(f"# Elastic segments\n\n{BEGIN}\n{END}\n")
    return sync_doc(DOC, lambda text: rendered_doc(text, doc), args.check)


if __name__ == "__main__":
    sys.exit(main())
