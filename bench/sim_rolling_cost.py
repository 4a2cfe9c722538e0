"""What a rolling-evaluation row costs: every spec of ``sim --chains --rolling`` (the grid, the fixed
leads, reactive and the oracle) at a few injection points, with the policies sharing the replayed
partition (chainrun/sim/trunk.py) and without, in one process; CPU seconds of each and whether
every chain came out the same. ``--reference`` also replays the shared run with the model answering
from the DataFrames the watcher would read (``SimWatcher.fast = False``, the pandas path) instead
of the trace's arrays (chainrun/predict/columnar.py), and says whether its chains are the same.

    .venv/bin/python bench/sim_rolling_cost.py --from 2023-01-20 --points 2 --reference

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
    ap.add_argument("--reference", action="store_true", help="also the pandas prediction path, compared")
    ap.add_argument("--no-alone", action="store_true", help="skip the run without shared trunks")
    args = ap.parse_args()
    import pandas as pd

    from chainrun.sim import chain_replay
    from chainrun.sim import rolling as R
    from chainrun.sim.chain_replay import ChainsConfig, chain_points, run_points, setup
    from chainrun.sim.adapter import SimWatcher
    from chainrun.sim.chains import PolicySpec
    from chainrun.traces import read_trace

    cfg = ChainsConfig(workers=1)
    w, nodes, sizes = setup(read_trace(args.trace), replace(cfg, specs=[PolicySpec("reactive", "reactive")]))
    every = chain_points(w.jobs[-1][0], chain_replay._SHARED["first"], cfg, sizes)
    pts = [p for p in every if p[0] >= pd.Timestamp(args.start).timestamp()][: args.points]
    full = R.grid(cfg.work.segment_s) + R.fixed_specs() + [PolicySpec("reactive", "reactive"),
                                                           PolicySpec("oracle", "oracle")]
    out, rows = {}, {}
    plan = [("shared", True, True)] + ([] if args.no_alone else [("alone", False, True)]) + \
        ([("reference", True, False)] if args.reference else [])
    for name, share, fast in plan:
        chain_replay._SHARED["cfg"] = replace(cfg, share=share)
        SimWatcher.fast = fast
        c = time.process_time()
        runs, cost = run_points([(t, k, full) for t, k in pts], 1)
        cpu = time.process_time() - c
        out[name] = {"cpu_s": round(cpu, 1), "cpu_s_per_row": round(cpu / max(len(runs), 1), 4), "cost": cost}
        rows[name] = [tuple(None if isinstance(v, float) and math.isnan(v) else v for v in astuple(r)) for r in runs]
    SimWatcher.fast = True
    doc = {"trace": args.trace, "points": [[pd.Timestamp(t, unit="s").isoformat(), k] for t, k in pts],
           "specs": len(full), "chains": len(rows["shared"])}
    if "alone" in rows:
        doc["same_chains"] = rows["shared"] == rows["alone"]
    if "reference" in rows:
        doc["same_as_reference"] = rows["shared"] == rows["reference"]
    doc.update(out)
    print(json.dumps(doc, indent=1))
    return 0 if doc.get("same_chains", True) and doc.get("same_as_reference", True) else 1


if __name__ == "__main__":
    sys.exit(main())
