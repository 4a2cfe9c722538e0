"""What a rolling-evaluation row costs: every spec of ``sim --chains --rolling`` (the grid, the fixed
leads, reactive and the oracle) at a few injection points, with the policies sharing the replayed
partition (chainrun/sim/trunk.py) and without, in one process; CPU seconds of each and whether
every chain came out the same.

    .venv/bin/python bench/sim_rolling_cost.py --from 2023-01-20 --points 2

CPU seconds, not wall: the box is shared. The full run's cost is about its 20,000 rows times the
per-row cost printed here (points of heavy load cost more than quiet ones).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import astuple, replace


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="ls6-a100-dev")
    ap.add_argument("--from", dest="start", default="2023-01-20")
    ap.add_argument("--points", type=int, default=2)
    args = ap.parse_args()
    import pandas as pd

    from chainrun.sim import chain_replay
    from chainrun.sim import rolling as R
    from chainrun.sim.chain_replay import ChainsConfig, chain_points, run_points, setup
    from chainrun.sim.chains import PolicySpec
    from chainrun.traces import read_trace

    cfg = ChainsConfig(workers=1)
    w, nodes, sizes = setup(read_trace(args.trace), replace(cfg, specs=[PolicySpec("reactive", "reactive")]))
    every = chain_points(w.jobs[-1][0], chain_replay._SHARED["first"], cfg, sizes)
    pts = [p for p in every if p[0] >= pd.Timestamp(args.start).timestamp()][: args.points]
    full = R.grid(cfg.work.segment_s) + R.fixed_specs() + [PolicySpec("reactive", "reactive"),
                                                           PolicySpec("oracle", "oracle")]
    out, rows = {}, {}
    for share in (True, False):
        chain_replay._SHARED["cfg"] = replace(cfg, share=share)
        c = time.process_time()
        runs, cost = run_points([(t, k, full) for t, k in pts], 1)
        out["shared" if share else "alone"] = {"cpu_s": round(time.process_time() - c, 1), "cost": cost}
        rows[share] = [tuple(None if isinstance(v, float) and math.isnan(v) else v for v in astuple(r)) for r in runs]
    doc = {"trace": args.trace, "points": [[pd.Timestamp(t, unit="s").isoformat(), k] for t, k in pts],
           "specs": len(full), "chains": len(rows[True]), "same_chains": rows[True] == rows[False], **out}
    print(json.dumps(doc, indent=1))
    return 0 if doc["same_chains"] else 1


if __name__ == "__main__":
    sys.exit(main())
