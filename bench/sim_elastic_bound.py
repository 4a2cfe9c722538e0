"""The most any elastic rule could save fixed-shape `predicted` chains (issue #14), from the replay.

    .venv/bin/python bench/sim_elastic_bound.py           # run (~2 min); docs/results/sim-elastic-bound.json + doc
    .venv/bin/python bench/sim_elastic_bound.py --render  # only re-render docs/elastic.md's block from the JSON
    .venv/bin/python bench/sim_elastic_bound.py --check   # exit 1 if the doc's block is not the JSON's rendering

The same chains as bench/sim_elastic.py (4 nodes, shapes 4, 2, 1; the scored window from
February 2023, one chain every 6 h, and the whole slice in-sample, one every 12 h) under reactive
(it defines the load levels) and fixed-shape `predicted`. For each level: where the overhead
went (first wait, gaps after a hand-over point, restarts, hand-offs) and the upper bound of
chainrun.sim.elastic_bound: the reduction a filler could reach with hindsight, starting at once,
at efficiency 1 and 0.8. Only the block between ``<!-- elastic-bound:begin -->`` and
``<!-- elastic-bound:end -->`` of docs/elastic.md is written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from _results import REPO, head_state, sync_doc  # bench/ is on sys.path when a bench runs

sys.path.insert(0, str(REPO))
OUT = REPO / "docs" / "results" / "sim-elastic-bound.json"
DOC = REPO / "docs" / "elastic.md"
BEGIN, END = "<!-- elastic-bound:begin -->", "<!-- elastic-bound:end -->"
SHAPES = (4, 2, 1)
EFFICIENCIES = (1.0, 0.8)
SCORE_FROM = "2023-02-01"


def measure(trace_name: str, score_from: str = SCORE_FROM) -> dict:
    from chainrun.predict.service import parse_date
    from chainrun.sim.chain_replay import ChainsConfig, run_chains
    from chainrun.sim.elastic import elastic_config
    from chainrun.sim.elastic_bound import bound_by_level
    from chainrun.traces import read_trace as load_trace

    trace = load_trace(trace_name)
    windows = {
        "scored": ChainsConfig(inject_from=parse_date(score_from, "--score-from"), chains_every_s=6 * 3600.0),
        "development": ChainsConfig(),
    }
    out = {}
    for name, cfg in windows.items():
        t = time.monotonic()
        ecfg = elastic_config(cfg, SHAPES, EFFICIENCIES, filler_margin=None)
        ecfg = replace(ecfg, specs=[s for s in ecfg.specs if s.name in ("reactive", "predicted")])
        res = run_chains(trace, ecfg)
        out[name] = {"chains_every_h": cfg.chains_every_s / 3600.0, "inject_from": cfg.inject_from,
                     "levels": bound_by_level(res.runs, res.loads, ecfg.work, SHAPES, EFFICIENCIES),
                     "wall_s": round(time.monotonic() - t, 1)}
    return out


def render(doc: dict) -> str:
    lines = [f"`.venv/bin/python bench/sim_elastic_bound.py` (commit {doc['commit'][:7]}"
             f"{', uncommitted changes' if doc['dirty'] else ''}; `docs/results/sim-elastic-bound.json`): "
             f"fixed-shape `predicted`, chains of {SHAPES[0]} nodes, shapes {', '.join(map(str, SHAPES))}; "
             "the bound assumes the best smaller shape starts the moment the chain has nothing training and "
             "stops when the reference starts, known in hindsight, at no cost to the reference's priority.", ""]
    effs = [f"{e:g}" for e in EFFICIENCIES]
    head = ["window", "level", "n", "overhead", "first wait", "gaps", "restarts", "hand-offs",
            *[f"largest reduction (eff. {e})" for e in effs]]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    labels = {"scored": f"scored (from {doc.get('score_from', SCORE_FROM)})", "development": "whole slice, in-sample"}
    for window, label in labels.items():
        for level, row in doc["windows"][window]["levels"].items():
            p = row["parts_h"]
            cells = [label, level, str(row["n"]), f"{row['overhead_h']:.2f} h",
                     *(f"{p[k]:.2f} h" for k in ("first_wait", "gaps", "restarts", "handoffs")),
                     *(f"{100 * row['bound'][e]['max_reduction']:.0f} %" for e in effs)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rendered_doc(text: str, doc: dict) -> str:
    if BEGIN not in text:
        return text
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{render(doc)}\n{END}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="ls6-a100-dev")
    ap.add_argument("--score-from", default=SCORE_FROM, help="first day of the scored window")
    ap.add_argument("--render", action="store_true", help="only re-render the doc from the JSON")
    ap.add_argument("--check", action="store_true", help="exit 1 if the doc is out of date")
    args = ap.parse_args()
    if not (args.render or args.check):
        t = time.monotonic()
        commit, dirty = head_state()
        doc = {"commit": commit, "dirty": dirty,
               "command": "bench/sim_elastic_bound.py", "trace": args.trace, "shapes": list(SHAPES),
               "efficiencies": list(EFFICIENCIES), "score_from": args.score_from,
               "windows": measure(args.trace, args.score_from)}
        doc["wall_s"] = round(time.monotonic() - t, 1)
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUT} ({doc['wall_s']} s)")
    doc = json.loads(OUT.read_text())
    if args.check:
        return sync_doc(DOC, lambda text: rendered_doc(text, doc), check=True)
    sync_doc(DOC, lambda text: rendered_doc(text, doc), check=False)
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
