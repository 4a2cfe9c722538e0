"""Whole-chain replay (and the tuning procedure) on a trace; the result as JSON under docs/results/.

    .venv/bin/python bench/sim_chains.py                                   # default: docs/results/sim-chains-ls6.json
    .venv/bin/python bench/sim_chains.py --tune-score-from 2023-02-01 --out docs/results/sim-tune-ls6.json
    .venv/bin/python bench/sim_chains.py --rolling --from-head                # docs/results/sim-rolling-ls6.json, and a table
    .venv/bin/python bench/sim_render.py                                   # the doc tables from those files

The file holds the commit it ran on (and whether the tree had local changes), the seed, the exact
command and the data `chainrun sim --chains --json` prints under "data". Runs `chainrun sim` in a
subprocess so that what is written is what the CLI prints. ``--from-head`` runs it from an export
of the HEAD commit (git archive), so the numbers belong to that commit even when the working tree
holds other, uncommitted edits (a shared tree).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _results import REPO, head_state, run_chainrun  # bench/ is on sys.path when a bench runs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="ls6-a100-dev")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tune-score-from", default=None)
    ap.add_argument("--rolling", action="store_true", help="the rolling-origin evaluation (sim --chains --rolling)")
    ap.add_argument("--from-head", action="store_true", help="run chainrun from an export of HEAD")
    ap.add_argument("extra", nargs="*", help="more `chainrun sim` options, after --")
    args = ap.parse_args()
    name = "sim-rolling-ls6" if args.rolling else "sim-tune-ls6" if args.tune_score_from else "sim-chains-ls6"
    out = Path(args.out or REPO / "docs" / "results" / f"{name}.json")
    cmd = ["chainrun", "sim", "--trace", args.trace, "--chains", *(["--rolling"] if args.rolling else []), "--json",
           *args.extra]
    if args.tune_score_from:
        cmd += ["--tune-score-from", args.tune_score_from]
    p, commit, wall_s = run_chainrun(cmd, args.from_head)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        return p.returncode
    env = json.loads(p.stdout)
    dirty = False if args.from_head else head_state()[1]
    doc = {"commit": commit, "dirty": dirty, "from_head": args.from_head,
           "seed": 0, "command": " ".join(cmd), "wall_s": wall_s,
           "chainrun": env["chainrun"], "data": env["data"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({doc['wall_s']} s)")
    if args.rolling:
        print(rolling_table(doc["data"]))
    return 0


def rolling_table(data: dict) -> str:
    """Mean completion overhead per policy and load level (90 % interval, n), and the weeks."""
    pols = data["chains"]["policies"]
    lines = [f"{'policy':<18} {'all':>22} " + " ".join(f"{lv:>26}" for lv in ("low", "medium", "heavy"))]
    for name, p in pols.items():
        cells = []
        for c in (p, *(p["by_load"][lv] for lv in ("low", "medium", "heavy"))):
            lo, hi = c.get("ci90_h") or (None, None)
            cells.append("-" if c.get("mean_overhead_h") is None else
                         f"{c['mean_overhead_h']:.2f} h ({lo or 0:.2f}-{hi or 0:.2f}) {c['n']}")
        lines.append(f"{name:<18} {cells[0]:>22} " + " ".join(f"{c:>26}" for c in cells[1:]))
    for w in data["chains"]["rolling"]["weeks"]:
        lines.append(f"{w['start'][:10]} n={w['n']:>2} choice/check {w.get('choice_chains', 0)}/"
                     f"{w.get('check_chains', 0)} chosen {w['chosen_name'] if 'chosen_name' in w else w['chosen']} "
                     f"adopted {w['adopted']} in force {w['in_force_name']} best fixed {w['best_fixed_lead_s'] / 3600:g} h")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
