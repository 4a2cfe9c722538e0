"""Fidelity of the trace-alone replay per node count and priority model, as JSON under docs/results/.

    .venv/bin/python bench/sim_fidelity.py      # docs/results/sim-fidelity-ls6.json
    .venv/bin/python bench/sim_render.py        # the table in docs/evaluation.md

Spearman of simulated vs recorded waits over every job after the warm-up, and without the jobs
replayed as dependency holds (their starts are rebuilt from recorded starts, so they agree by
construction). Runs the same code the chain replay runs (chain_replay.chains_fidelity).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _results import REPO, head_state  # bench/ is on sys.path when a bench runs

sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="ls6-a100-dev")
    ap.add_argument("--nodes", default="80,78,76,74")
    ap.add_argument("--priorities", default="age,multifactor,fairshare")
    ap.add_argument("--out", default=str(REPO / "docs" / "results" / "sim-fidelity-ls6.json"))
    args = ap.parse_args()
    from chainrun.sim.chain_replay import ChainsConfig, chains_fidelity
    from chainrun.traces import read_trace as load_trace

    t0 = time.monotonic()
    trace = load_trace(args.trace)
    rows = []
    for n in map(int, args.nodes.split(",")):
        for pr in args.priorities.split(","):
            f = chains_fidelity(trace, ChainsConfig(nodes=n, priority=pr))
            rows.append({"priority": pr, **f})
            print(n, pr, round(f["spearman"], 3), round(f["spearman_without_holds"], 3), flush=True)
    commit, dirty = head_state("chainrun/sim")
    doc = {"commit": commit, "dirty": dirty,
           "seed": 0, "command": " ".join([".venv/bin/python bench/sim_fidelity.py", *sys.argv[1:]]),
           "wall_s": round(time.monotonic() - t0, 1), "data": {"trace": args.trace, "rows": rows}}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
