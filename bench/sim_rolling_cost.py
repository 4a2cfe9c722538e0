"""What a rolling-evaluation row costs: every spec of ``sim --chains --rolling`` (the grid, the fixed
leads, reactive and the oracle) at a few injection points, with the policies sharing the replayed
partition (chainrun/sim/trunk.py) and without, in one process; CPU seconds of each and whether
every chain came out the same. ``--reference`` also replays the shared run with the model answering
from the DataFrames the watcher would read (``SimWatcher.fast = False``, the pandas path) instead
of the trace's arrays (chainrun/predict/columnar.py), and says whether its chains are the same.

    .venv/bin/python bench/sim_rolling_cost.py --from 2023-01-20 --points 2 --reference
    .venv/bin/python bench/sim_rolling_cost.py --spread 8 --no-alone    # the full run, projected

``--spread N`` takes N points evenly over the whole run instead (quiet and busy weeks alike) and
projects the full run's CPU: its rows times the CPU per row net of model fits, plus one fit per
week and worker (the workers split the points; each refits weekly on what it replays).

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
    ap.add_argument("--spread", type=int, default=0, help="N points evenly over the whole run (ignores --from)")
    ap.add_argument("--workers", type=int, default=2, help="workers of the projected full run")
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
    if args.spread:
        pts = [every[round(i * (len(every) - 1) / max(args.spread - 1, 1))] for i in range(args.spread)]
    fit_cpu = []

    def timed_fit(history, until):  # the replay's factory, its CPU counted apart
        c0 = time.process_time()
        try:
            return chain_replay.chainrun_predictor(history, until)
        finally:
            fit_cpu.append(time.process_time() - c0)

    cfg = replace(cfg, predictor=timed_fit)
    full = R.grid(cfg.work.segment_s) + R.fixed_specs() + [PolicySpec("reactive", "reactive"),
                                                           PolicySpec("oracle", "oracle")]
    out, rows = {}, {}
    plan = [("shared", True, True)] + ([] if args.no_alone else [("alone", False, True)]) + \
        ([("reference", True, False)] if args.reference else [])
    for name, share, fast in plan:
        chain_replay._SHARED["cfg"] = replace(cfg, share=share)
        SimWatcher.fast = fast
        fit_cpu.clear()
        c = time.process_time()
        runs, cost = run_points([(t, k, full) for t, k in pts], 1)
        cpu = time.process_time() - c
        net = (cpu - sum(fit_cpu)) / max(len(runs), 1)
        out[name] = {"cpu_s": round(cpu, 1), "cpu_s_per_row": round(cpu / max(len(runs), 1), 4),
                     "fit_cpu_s": round(sum(fit_cpu), 1), "cpu_s_per_row_net_of_fits": round(net, 4), "cost": cost}
        if args.spread:
            weeks = math.ceil((every[-1][0] - every[0][0]) / cfg.retrain_every_s) + 1
            per_fit = sum(fit_cpu) / max(len(fit_cpu), 1)
            out[name]["projected_full_run"] = {
                "rows": len(every) * len(full), "fits": weeks * args.workers,
                "cpu_s": round(net * len(every) * len(full) + per_fit * weeks * args.workers)}
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
