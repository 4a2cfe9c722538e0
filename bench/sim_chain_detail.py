"""Per-chain records of the whole-chain replay: every boundary of every chain of one load level,
under the shipped `predicted` (slack rule) and the quantile rule it replaced, beside reactive and
the oracle. The diagnosis behind docs/evaluation.md's paragraphs on the two rules.

    .venv/bin/python bench/sim_chain_detail.py --level heavy     # docs/results/sim-chain-detail-heavy.json
    .venv/bin/python bench/sim_chain_detail.py --level low --from 2023-02-01

Prints one line per chain (overheads in hours) and, per rule, its boundaries as (start - hand-over
point, cut) in hours; writes the same as JSON with the commit it ran on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    from dataclasses import replace

    from chainrun.sim.chain_replay import ChainsConfig, run_chains
    from chainrun.sim.chains import PolicySpec, default_specs
    from chainrun.traces import read_trace as load_trace

    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="ls6-a100-dev")
    ap.add_argument("--level", choices=("low", "medium", "heavy"), default="heavy")
    ap.add_argument("--from", dest="start", default=None, help="only chains injected from this date (UTC)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    specs = [s for s in default_specs() if s.name in ("reactive", "oracle")]
    specs += [PolicySpec("quantile", "predicted", adaptive=True, rule="quantile", lead_share=0.5),
              PolicySpec("slack", "predicted", adaptive=True, rule="slack", lead_share=0.6)]
    cfg = ChainsConfig(specs=specs)
    if args.start:
        cfg = replace(cfg, inject_from=dt.datetime.fromisoformat(args.start).replace(tzinfo=dt.timezone.utc).timestamp())
    t = time.monotonic()
    res = run_chains(load_trace(args.trace), cfg)
    by: dict = {}
    for r in res.runs:
        by.setdefault((r.t0, r.nodes), {})[r.policy] = r
    chains = []
    for key, d in sorted(by.items()):
        if res.loads[key] != args.level:
            continue
        row = {"injected": dt.datetime.fromtimestamp(key[0], dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
               "nodes": key[1], "overhead_h": {k: round(d[k].overhead_s / 3600, 2) for k in d}}
        for k in ("quantile", "slack"):
            row[k] = {"segments": d[k].segments, "first_wait_h": round(d[k].first_wait_s / 3600, 2),
                      "boundaries_h": [[round(g / 3600, 1), round(c / 3600, 1)] for g, c in d[k].boundaries]}
        chains.append(row)
        print(row["injected"], f"n{key[1]}", " ".join(f"{k} {v:.1f}" for k, v in row["overhead_h"].items()))
        for k in ("quantile", "slack"):
            print(f"    {k:8s} segments {row[k]['segments']}", " ".join(f"({g:+.1f},{c:.1f})" for g, c in row[k]["boundaries_h"]))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    out = Path(args.out or REPO / "docs" / "results" / f"sim-chain-detail-{args.level}.json")
    out.write_text(json.dumps({"commit": commit, "command": " ".join(["bench/sim_chain_detail.py", *sys.argv[1:]]),
                               "seconds": round(time.monotonic() - t, 1), "level": args.level, "chains": chains},
                              indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
